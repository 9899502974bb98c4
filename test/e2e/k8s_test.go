package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/profi-dev/profi/internal/discover"
	"github.com/profi-dev/profi/internal/k8s"
	"github.com/profi-dev/profi/internal/testutil"
	"github.com/profi-dev/profi/internal/testutil/kubetest"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

const testNode = "gpu-node-1"

// startInPod starts a workload inside the cgroup rel (a kubelet-style
// path), as a container runtime starts a container's process: a shell
// moves itself into the cgroup and execs the workload, so the agent never
// sees the process outside its pod (the event-driven discovery attaches
// within milliseconds of the libraries being mapped).
func startInPod(t *testing.T, bin string, args []string, rel string) *testutil.Workload {
	t.Helper()
	root, dir := podCgroup(t, rel)
	w := startWorkload(t, bin, args, testutil.WithWrapper("sh", "-c", `echo $$ > "$0/cgroup.procs" && exec "$@"`, dir))
	t.Cleanup(func() {
		// Runs before the directories' removal (cleanups run in reverse
		// order); the workload has been stopped, this is for a straggler.
		_ = os.WriteFile(filepath.Join(root, "cgroup.procs"), []byte(strconv.Itoa(w.PID)), 0o644)
	})
	return w
}

// podCgroup creates the cgroup rel in the first real cgroup hierarchy
// (cgroup v2 where mounted) and removes it at the end of the test.
func podCgroup(t *testing.T, rel string) (root, dir string) {
	t.Helper()
	var errs []error
	for _, root := range []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup", "/sys/fs/cgroup/pids"} {
		if _, err := os.Stat(filepath.Join(root, "cgroup.procs")); err != nil {
			errs = append(errs, err) // not a cgroup hierarchy (e.g. the tmpfs above v1 ones)
			continue
		}
		dir := filepath.Join(root, rel)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			errs = append(errs, err)
			continue
		}
		t.Cleanup(func() {
			// Deepest first; a cgroup is removable once its processes left.
			for d := dir; d != root; d = filepath.Dir(d) {
				for i := 0; i < 50; i++ {
					if err := os.Remove(d); err == nil || errors.Is(err, os.ErrNotExist) {
						break
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
		})
		return root, dir
	}
	t.Fatalf("no cgroup hierarchy accepted %s: %v", rel, errs)
	return "", ""
}

func randomContainerID(t *testing.T) string {
	t.Helper()
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// podWatchServer starts an API server with the namespace "ml", grants the
// service account default/profi the chart's ClusterRole (pods list and
// watch, nothing else) and points KUBECONFIG at that account: the agent
// started after it watches the pods of testNode as deployed.
func podWatchServer(t *testing.T) *kubetest.APIServer {
	t.Helper()
	s := kubetest.StartAPIServer(t)
	ctx := context.Background()
	admin := s.Client()
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ml"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "profi"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "profi"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "profi"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: "default", Name: "profi"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBECONFIG", kubetest.WriteKubeconfig(t, s.ServiceAccountConfig(t, "default", "profi")))
	return s
}

// createPod creates a pod on testNode whose container name has id in its
// status, as a kubelet would report it.
func createPod(t *testing.T, c kubernetes.Interface, ns, name, container, id string) *corev1.Pod {
	t.Helper()
	return createPodOn(t, c, testNode, ns, name, container, id)
}

// createPodOn is createPod on the given node.
func createPodOn(t *testing.T, c kubernetes.Interface, node, ns, name, container, id string) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	p, err := c.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: container, Image: "infer:1"}},
			AutomountServiceAccountToken: new(bool)},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: container, ContainerID: "containerd://" + id, Image: "infer:1", ImageID: "infer@sha256:0"}}
	if p, err = c.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	return p
}

// podLabels returns the (namespace, pod, container) label values of every
// per-process series of pid, and the number of series.
func podLabels(t *testing.T, a *testutil.Agent, pid int) (map[[3]string]int, error) {
	t.Helper()
	mfs, err := a.Metrics()
	if err != nil {
		return nil, err
	}
	return podLabelsIn(mfs, pid)
}

// podLabelsIn is podLabels on a scrape.
func podLabelsIn(mfs map[string]*dto.MetricFamily, pid int) (map[[3]string]int, error) {
	out := map[[3]string]int{}
	for name, mf := range mfs {
		if !strings.HasPrefix(name, "profi_cuda_") {
			continue
		}
		for _, s := range testutil.Samples(mf) {
			if s.Labels["pid"] == strconv.Itoa(pid) {
				out[[3]string{s.Labels["namespace"], s.Labels["pod"], s.Labels["container"]}]++
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no profi_cuda_ series of pid %d", pid)
	}
	return out, nil
}

// Both callers follow an API server outage. client-go's reflector retries
// with backoff doubling from 0.8 s to a 30 s cap and a jitter of up to 2x
// (not configurable through the shared informer factory in v0.37), so the
// watch may come back up to a minute after the server does: the wait covers
// that, not a slow agent.
func requirePodLabels(t *testing.T, a *testutil.Agent, pid int, want [3]string) {
	t.Helper()
	err := testenv.Eventually(90*time.Second, func() error {
		got, err := podLabels(t, a, pid)
		if err != nil {
			return err
		}
		if len(got) != 1 || got[want] == 0 {
			return fmt.Errorf("pid %d series by (namespace, pod, container): %v; want all %v", pid, got, want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func ready(a *testutil.Agent) bool {
	code, _, err := a.Get("/ready")
	return err == nil && code == 200
}

// Pod labels from a real kube-apiserver, with only the RBAC the chart
// grants (pods list/watch): a process in a pod's container cgroup gets
// that pod's namespace, pod and container on every per-process series,
// exactly, with the counts unchanged. An API server that is down when the
// agent starts keeps it unready and the labels empty, never blocks the
// counting, and the labels arrive once it is back; after a restart of the
// API server the watch recovers and labels a new pod.
func TestPodLabelsFromAPIServer(t *testing.T) {
	testutil.RequireBPF(t)
	s := podWatchServer(t)
	ctx := context.Background()
	admin := s.Client()
	// Pod 1, whose process runs in a systemd-driver cgroup (containerd).
	id1 := randomContainerID(t)
	pod1 := createPod(t, admin, "ml", "infer-0", "server", id1)
	w1 := startInPod(t, fixtures.Workload, defaultArgs, "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"+
		strings.ReplaceAll(string(pod1.UID), "-", "_")+".slice/cri-containerd-"+id1+".scope")

	// The API server is down when the agent starts.
	s.Down(t)
	a := startAgentWith(t, testutil.StartAgentServing, "--node-name", testNode)
	waitAttached(t, a, w1.PID)
	gt1 := runPhase(t, w1)
	if err := testenv.Eventually(10*time.Second, func() error {
		got, err := podLabels(t, a, w1.PID)
		if err == nil && (len(got) != 1 || got[[3]string{}] == 0) {
			err = fmt.Errorf("labels while the API server is down: %v; want counted with empty labels", got)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if ready(a) {
		t.Error("/ready is 200 before the pod watch's first list")
	}
	s.Up(t)
	requirePodLabels(t, a, w1.PID, [3]string{"ml", "infer-0", "server"})
	if !ready(a) {
		t.Error("/ready is not 200 after the pod watch synced")
	}
	// Same counts under the new labels.
	mfs, err := a.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	calls := series(mfs, "profi_cuda_calls_total", "pid", "namespace", "pod", "container")
	want := 0.0
	for k, v := range expected([]*testutil.GroundTruth{gt1}) {
		if strings.HasPrefix(k, "profi_cuda_calls_total{") {
			want += v
		}
	}
	if got := calls[strconv.Itoa(w1.PID)+"|ml|infer-0|server"]; got != want {
		t.Errorf("calls under pod labels = %v, want %v", got, want)
	}

	// Delete pod 1 and restart the API server: a new pod is labelled.
	if err := admin.CoreV1().Pods("ml").Delete(ctx, "infer-0", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	s.Restart(t)
	id2 := randomContainerID(t)
	pod2 := createPod(t, admin, "ml", "infer-1", "worker", id2)
	w2 := startInPod(t, fixtures.Workload, defaultArgs, "kubepods/besteffort/pod"+string(pod2.UID)+"/"+id2)
	waitAttached(t, a, w2.PID)
	runPhase(t, w2)
	requirePodLabels(t, a, w2.PID, [3]string{"ml", "infer-1", "worker"})

	var st struct {
		Kubernetes struct {
			NodeName string `json:"node_name"`
			Synced   bool   `json:"synced"`
		} `json:"kubernetes"`
	}
	if err := a.Status(&st); err != nil {
		t.Fatal(err)
	}
	// Whether the outage shows as watch errors depends on how the API server
	// went away (a refused connection is an error; a request held by a server
	// shutting down just waits), so only the state is checked.
	if st.Kubernetes.NodeName != testNode || !st.Kubernetes.Synced {
		t.Errorf("/status kubernetes = %+v; want synced, node %s", st.Kubernetes, testNode)
	}
}

// The profi/mode: full annotation upgrades its pod's processes to full
// kernel mode under a global anonymous mode: the annotated pod's launches
// are counted per kernel name, exactly, and carry launch latency; the
// process of a pod without the annotation keeps anonymous launches only.
func TestFullModeAnnotation(t *testing.T) {
	testutil.RequireBPF(t)
	s := kubetest.StartAPIServer(t)
	ctx := context.Background()
	admin := s.Client()
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ml"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBECONFIG", kubetest.WriteKubeconfig(t, s.RESTConfig()))

	idFull, idPlain := randomContainerID(t), randomContainerID(t)
	podFull := createPod(t, admin, "ml", "debug-0", "server", idFull)
	podFull.Annotations = map[string]string{k8s.ModeAnnotation: "full"}
	if _, err := admin.CoreV1().Pods("ml").Update(ctx, podFull, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	podPlain := createPod(t, admin, "ml", "infer-0", "server", idPlain)
	wFull := startInPod(t, fixtures.Workload, defaultArgs, "kubepods/burstable/pod"+string(podFull.UID)+"/"+idFull)
	wPlain := startInPod(t, fixtures.Workload, defaultArgs, "kubepods/burstable/pod"+string(podPlain.UID)+"/"+idPlain)

	a := startAgentWith(t, testutil.StartAgentServing, "--kernel-mode", "anonymous", "--node-name", testNode)
	waitAttached(t, a, wFull.PID)
	waitAttached(t, a, wPlain.PID)
	// The upgrade happens at the discovery pass after the pod watch knows
	// the pod: wait for it before the measured phase.
	if err := testenv.Eventually(30*time.Second, func() error {
		var st struct {
			AttachedLibraries []struct {
				Library  string `json:"library"`
				FullMode []int  `json:"full_mode_pids"`
			} `json:"attached_libraries"`
		}
		if err := a.Status(&st); err != nil {
			return err
		}
		for _, l := range st.AttachedLibraries {
			if l.Library == string(discover.LibCudart) {
				if slices.Equal(l.FullMode, []int{wFull.PID}) {
					return nil
				}
				return fmt.Errorf("libcudart full_mode_pids = %v, want [%d]", l.FullMode, wFull.PID)
			}
		}
		return fmt.Errorf("libcudart not attached: %+v", st)
	}); err != nil {
		t.Fatal(err)
	}
	gtFull, gtPlain := runPhase(t, wFull), runPhase(t, wPlain)

	err := testenv.Eventually(15*time.Second, func() error {
		mfs, err := a.Metrics()
		if err != nil {
			return err
		}
		got := map[string]map[string]float64{} // pid -> kernel -> launches
		for _, smp := range testutil.Samples(mfs["profi_cuda_kernel_launches_total"]) {
			pid := smp.Labels["pid"]
			if got[pid] == nil {
				got[pid] = map[string]float64{}
			}
			got[pid][smp.Labels["kernel"]] += smp.Value
		}
		wantFull := map[string]float64{}
		for raw, n := range gtFull.LaunchesByKernel {
			wantFull[kernelLabel(raw)] += float64(n)
		}
		var plainTotal float64
		for _, n := range gtPlain.LaunchesByKernel {
			plainTotal += float64(n)
		}
		wantPlain := map[string]float64{"anonymous": plainTotal}
		if g := got[strconv.Itoa(wFull.PID)]; !maps.Equal(g, wantFull) {
			return fmt.Errorf("annotated pod: launches by kernel %v, want %v", g, wantFull)
		}
		if g := got[strconv.Itoa(wPlain.PID)]; !maps.Equal(g, wantPlain) {
			return fmt.Errorf("plain pod: launches by kernel %v, want %v", g, wantPlain)
		}
		// Launch latency exists for the upgraded process only: the kernel
		// histograms carry no pid, so their total is the annotated pod's.
		var timed float64
		for _, smp := range testutil.Samples(mfs["profi_cuda_kernel_duration_count_total"]) {
			if smp.Labels["pod"] != "debug-0" {
				return fmt.Errorf("kernel latency for pod %q: only the annotated pod is timed", smp.Labels["pod"])
			}
			timed += smp.Value
		}
		var full float64
		for _, n := range wantFull {
			full += n
		}
		if timed != full {
			return fmt.Errorf("kernel latency count %v, want %v (every launch of the annotated pod)", timed, full)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
