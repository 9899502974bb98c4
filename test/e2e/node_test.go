package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/profi-dev/profi/internal/kmsg"
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
	if cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", early.pid)); err == nil {
		t.Logf("the cgroups kubelet gave %s (pid %d):\n%s", early, early.pid, cg)
	}

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
	// Deployed as the chart deploys it, the agent finds the pods' cgroups:
	// batch/two's two containers are one tenant.
	requirePodTenants(t, a, cts)
	requireLinkCaps(t, a)
	requireKernelLog(t, a, kmsg.SyslogPath, "")

	t.Run("crash loop", func(t *testing.T) {
		// Its own NULL store 6 s after its last CUDA call: an ordinary
		// crash no probe explains, which must not take the probes off
		// (test/e2e/breaker_test.go has the crashes the probes explain).
		crash := workloadContainer("worker", 6*time.Second)
		createWorkloadPod(t, c, "batch", &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "crashy"},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{crash}},
		})
		seen := map[string]bool{}
		var launches float64
		for restarts := int32(0); restarts < 3; restarts++ {
			ct := runningContainer(t, c, "batch", "crashy", "worker", restarts)
			if seen[ct.id] {
				t.Fatalf("%s: restart %d reuses container %s", ct, restarts, ct.id)
			}
			seen[ct.id] = true
			waitAttached(t, a, ct.pid)
			gt := phase(t, c, ct)
			requireCounted(t, a, []container{ct}, []*testutil.GroundTruth{gt})
			for k, v := range expected([]*testutil.GroundTruth{gt}) {
				if strings.HasPrefix(k, "profi_cuda_kernel_launches_total{") {
					launches += v
				}
			}
			t.Logf("%s, restart %d (container %.12s, pid %d): counted exactly, labelled", ct, restarts, ct.id, ct.pid)
		}
		// The pod's launches over its restarts: the exited instances'
		// series outlive them (--gc-interval, then folded), so the sum by
		// pod is every instance's, exactly.
		if got := podSum(t, a, "batch", "crashy", "profi_cuda_kernel_launches_total"); got != launches {
			t.Errorf("batch/crashy: %v launches summed by pod, want %v (its three instances)", got, launches)
		}
		if !strings.Contains(podLog(t, c, container{ns: "batch", pod: "crashy", name: "worker"}, true), "died segmentation fault") {
			t.Errorf("the previous instance of batch/crashy did not die of SIGSEGV:\n%s", podLog(t, c, container{ns: "batch", pod: "crashy", name: "worker"}, true))
		}
		// The other pods are counted on, exactly.
		gts[0] = phase(t, c, cts[0])
		requireCounted(t, a, cts, gts)
		requireNoQuarantine(t, a)
	})

	t.Run("pod deleted and recreated", func(t *testing.T) {
		old := cts[len(cts)-1] // batch/restricted
		oldPod, err := c.CoreV1().Pods(old.ns).Get(context.Background(), old.pod, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		deletePod(t, c, old.ns, old.pod)
		// Its counts outlive it (for the chart's --gc-interval, then
		// folded into pid=""), with its labels.
		final := expected([]*testutil.GroundTruth{gts[len(gts)-1]})
		perProcess(final)
		dropGauges(final)
		requireExactOf(t, a, final, []int{old.pid}, func(v values) { perProcess(v); dropGauges(v) })
		createWorkloadPod(t, c, old.ns, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: old.pod}, Spec: oldPod.Spec})
		ct := runningContainer(t, c, old.ns, old.pod, old.name, 0)
		waitAttached(t, a, ct.pid)
		cts[len(cts)-1], gts[len(gts)-1] = ct, phase(t, c, ct)
		requireCounted(t, a, cts, gts)
	})

	t.Run("helm upgrade with auth, TLS and the Prometheus Operator", func(t *testing.T) {
		n.InstallCRDs(t, crdFiles(t)...)
		before := gts
		upgrade := time.Now()
		a = upgradeWithAuth(t, n, a)
		for _, ct := range cts {
			waitAttached(t, a, ct.pid)
		}
		logRolloutGap(t, a, upgrade)
		for _, kind := range []string{"servicemonitors", "prometheusrules"} {
			requireObject(t, n, "monitoring.coreos.com", kind, agentNamespace, "profi")
		}
		after := make([]*testutil.GroundTruth, len(cts))
		for i, ct := range cts {
			after[i] = phase(t, c, ct)
		}
		// The new agent counts what the workloads did since it attached,
		// nothing before: exactly the difference of their cumulative
		// ground truths.
		want := since(expected(after), expected(before))
		perProcess(want)
		pids := make([]int, len(cts))
		for i, ct := range cts {
			pids[i] = ct.pid
		}
		mfs := requireExactOf(t, a, want, pids, func(v values) { perProcess(v); dropGauges(v) })
		requirePrometheusSD(t, n, mfs, cts)
	})

	t.Run("kernel log", func(t *testing.T) {
		// Off: /status says so, and no ERROR line (helmUpgradeAgent); the
		// capability it drops: deploy/chartcheck TestDaemonSetPrivileges.
		a = helmUpgradeAgent(t, n, a, "profi.kernelLog=off")
		requireKernelLog(t, a, "", "off: --kernel-log off")
		// On, trusting lines written from userspace (the test writes the
		// kernel's warning; docs/TESTING.md): a kernel warning in the
		// uprobe code, read through syslog(2) in the pod, stops every
		// probe on the node.
		a = helmUpgradeAgent(t, n, a, "profi.kernelLog=auto", "profi.extraArgs={--kmsg-trust-user}")
		requireKernelLog(t, a, kmsg.SyslogPath, "")
		waitAttached(t, a, cts[0].pid)
		writeUprobeWarning(t, cts[0].pid)
		st := waitQuarantined(t, a, 1, "node")
		if q := st.Quarantined[0]; q.Library != "all" || q.Reason != "kernel_warning" {
			t.Errorf("after a kernel warning: %+v, want every probe off (library all, kernel_warning)", q)
		}
	})
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
