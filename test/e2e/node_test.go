package e2e

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/profi-dev/profi/internal/testutil"
	"github.com/profi-dev/profi/internal/testutil/kubetest"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// The chart's values this test overrides, and why: only the image (a local
// one, imported into containerd, never pulled) and what a node without a
// GPU cannot have (the NVIDIA runtime class). Everything else is the
// chart's default.
var nodeChartOverrides = []string{
	"image.repository=" + profiImage,
	"image.tag=" + profiTag,
	"image.pullPolicy=Never",
	"nvidia.enabled=false", // runtimeClassName nvidia: no NVIDIA container runtime here
}

// The label GPU feature discovery sets on a GPU node: the chart's
// nodeSelector needs it (deploy/README.md).
var gpuNodeLabels = map[string]string{"nvidia.com/gpu.present": "true"}

const agentNamespace = "profi"

// TestNode installs the chart as a user does, `helm install --wait` with
// its defaults, on a real single-node Kubernetes (kubelet, containerd,
// runc, CNI bridge, controller-manager, scheduler, kube-proxy:
// kubetest.StartNode) without the Prometheus Operator, among workload pods
// that run, crash, restart and go away, and compares what the DaemonSet's
// agent counts for each pod's processes with the ground truth the pods log
// (read through the API server), exactly, with their namespace, pod and
// container labels.
func TestNode(t *testing.T) {
	testutil.RequireBPF(t)
	kubetest.RequireNode(t)
	if _, err := kubetest.HelmBinary(); err != nil {
		t.Fatal(err)
	}
	images := nodeImages(t, t.TempDir())
	start := time.Now()
	n := kubetest.StartNode(t, kubetest.NodeOptions{Labels: gpuNodeLabels, Images: images})
	c := n.Client()
	for _, ns := range []string{"serve", "batch"} {
		createNamespace(t, c, ns)
	}

	// Started before the agent: found by the agent's /proc scan.
	createWorkloadPod(t, c, "serve", &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "early"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{workloadContainer("server", 0)}},
	})
	early := runningContainer(t, c, "serve", "early", "server", 0)

	installStart := time.Now()
	out := helmInstall(t, n)
	if !strings.Contains(out, "ServiceMonitor NOT created") || !strings.Contains(out, "PrometheusRule NOT created") {
		t.Errorf("helm install on a cluster without the Prometheus Operator: its notes do not say the ServiceMonitor and PrometheusRule were left out:\n%s", out)
	}
	agent, a := agentPod(t, c, agentNamespace)
	t.Logf("node up in %v; helm install --wait took %v", installStart.Sub(start).Round(time.Millisecond), time.Since(installStart).Round(time.Millisecond))
	requireNoErrorLog(t, c, agent)

	// Started after the agent: attached on their libraries' mapping.
	replicas := int32(2)
	labels := map[string]string{"app": "llm"}
	_, err := c.AppsV1().Deployments("serve").Create(context.Background(), &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "llm"},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{workloadContainer("server", 0)}},
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	createWorkloadPod(t, c, "batch", &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "two"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{workloadContainer("prefill", 0), workloadContainer("decode", 0)}},
	})
	uid := int64(65534)
	restricted := workloadContainer("worker", 0)
	restricted.SecurityContext = &corev1.SecurityContext{
		RunAsUser: &uid, RunAsNonRoot: new(bool), AllowPrivilegeEscalation: new(bool),
		Capabilities:   &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
	*restricted.SecurityContext.RunAsNonRoot = true
	createWorkloadPod(t, c, "batch", &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "restricted"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{restricted}},
	})

	cts := []container{early}
	for _, p := range deploymentPods(t, c, "serve", "app=llm", int(replicas)) {
		cts = append(cts, runningContainer(t, c, "serve", p, "server", 0))
	}
	cts = append(cts,
		runningContainer(t, c, "batch", "two", "prefill", 0),
		runningContainer(t, c, "batch", "two", "decode", 0),
		runningContainer(t, c, "batch", "restricted", "worker", 0))
	var gts []*testutil.GroundTruth
	for _, ct := range cts {
		waitAttached(t, a, ct.pid)
		gts = append(gts, phase(t, c, ct))
	}
	requireCounted(t, a, cts, gts)
	for i, ct := range cts {
		t.Logf("%s (pid %d): %d calls, %d launches, counted exactly with its labels", ct, ct.pid, gts[i].TotalCalls(), gts[i].Launches)
	}
}

// helmInstall installs the chart as release "profi" in agentNamespace
// with its defaults and nodeChartOverrides (plus set), waiting for the
// DaemonSet, and returns helm's output.
func helmInstall(t *testing.T, n *kubetest.Node, set ...string) string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"install", "profi", filepath.Join(root, "deploy/profi"), "--namespace", agentNamespace,
		"--create-namespace", "--wait", "--timeout", "3m"}
	for _, o := range append(slices.Clone(nodeChartOverrides), set...) {
		args = append(args, "--set", o)
	}
	return helm(t, n, args...)
}

func createNamespace(t *testing.T, c kubernetes.Interface, name string) {
	t.Helper()
	_, err := c.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

func createWorkloadPod(t *testing.T, c kubernetes.Interface, ns string, p *corev1.Pod) {
	t.Helper()
	if _, err := c.CoreV1().Pods(ns).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// deploymentPods waits for n pods matching selector in ns and returns
// their names.
func deploymentPods(t *testing.T, c kubernetes.Interface, ns, selector string, n int) []string {
	t.Helper()
	var names []string
	err := testenv.Eventually(2*time.Minute, func() error {
		pods, err := c.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return err
		}
		names = names[:0]
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil {
				names = append(names, p.Name)
			}
		}
		if len(names) != n {
			return fmt.Errorf("%d pods %s in %s, want %d", len(names), selector, ns, n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// requireNoErrorLog fails the test when the agent pod's containers logged
// an ERROR line.
func requireNoErrorLog(t *testing.T, c kubernetes.Interface, pod *corev1.Pod) {
	t.Helper()
	for _, name := range []string{"check", "profi"} {
		log := podLog(t, c, container{ns: pod.Namespace, pod: pod.Name, name: name}, false)
		if log == "" {
			t.Errorf("agent pod %s: container %s logged nothing", pod.Name, name)
		}
		for _, line := range strings.Split(log, "\n") {
			if strings.Contains(line, "level=ERROR") {
				t.Errorf("agent pod %s, container %s: %s", pod.Name, name, line)
			}
		}
	}
}

// TestNodeForAPerson is `make node`: the node of TestNode with the chart
// installed (its defaults and nodeChartOverrides) and one workload pod,
// left running until interrupted, with how to reach it. It runs only when
// PROFI_NODE_KEEP=1 (the Makefile sets it).
func TestNodeForAPerson(t *testing.T) {
	if os.Getenv("PROFI_NODE_KEEP") != "1" {
		t.Skip("make node runs this (PROFI_NODE_KEEP=1)")
	}
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
