//go:build profi_node

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/profi-dev/profi/internal/testutil"
	"github.com/profi-dev/profi/internal/testutil/kubetest"
)

// TestNodeForAPerson is `make node`: the node of TestNode with the chart
// installed (its defaults and nodeChartOverrides) and one workload pod,
// left running until interrupted, with how to reach it. Built only with
// the profi_node tag (the Makefile's), so `make test` neither runs nor
// skips it.
func TestNodeForAPerson(t *testing.T) {
	testutil.RequireBPF(t)
	kubetest.RequireNode(t)
	n := kubetest.StartNode(t, kubetest.NodeOptions{Labels: gpuNodeLabels, Images: nodeImages(t, t.TempDir())})
	c := n.Client()
	helmInstall(t, n)
	pod, _ := agentPod(t, c, agentNamespace)
	createNamespace(t, c, "serve")
	createWorkloadPod(t, c, "serve", &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "llm"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{workloadContainer("server", 0)}},
	})
	ct := runningContainer(t, c, "serve", "llm", "server", 0)
	fmt.Fprintf(os.Stderr, `
The node is up (Ctrl-C stops it and removes everything).
  export KUBECONFIG=%s
  kubectl get pods -A -o wide
  kubectl -n %s logs %s            # the agent
  curl -s http://%s:9401/metrics | grep 'pod="llm"'
  kill -USR1 %d                    # the workload pod runs one phase; its ground truth:
  kubectl -n serve logs llm
Component logs: %s/*.log
`, n.Kubeconfig, agentNamespace, pod.Name, pod.Status.PodIP, ct.podrun, n.Dir)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
}
