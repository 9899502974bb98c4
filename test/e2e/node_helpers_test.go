package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/profi-dev/profi/internal/testutil"
	"github.com/profi-dev/profi/internal/testutil/kubetest"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// The test node's images (kubetest.StartNode imports them; pods name them
// with imagePullPolicy Never).
const (
	workloadImage = "localhost/profi-workload:test"
	profiImage    = "localhost/profi"
	profiTag      = "node"
	// Where the workload image holds the stub CUDA libraries, the workload
	// and podrun (test/podrun).
	podDir = "/opt/profi"
)

// nodeImages writes the node's images into dir and returns their archives,
// the pause image first: the pause and workload images are written here
// (kubetest.WriteImageArchive: podrun, the linked workload, the stub
// libcudart and libcuda, the glibc they link), profi's is `make image`'s
// (scripts/build-image.sh with buildah, the agent the other tests run),
// exported as a docker-archive.
func nodeImages(t *testing.T, dir string) []string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	podrun := filepath.Join(dir, "podrun")
	build := exec.Command("go", "build", "-trimpath", "-o", podrun, "./test/podrun")
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build podrun: %v\n%s", err, out)
	}

	pause := filepath.Join(dir, "pause.tar")
	if err := kubetest.WriteImageArchive(pause, kubetest.Image{
		Name:       kubetest.PauseImage,
		Files:      []kubetest.ImageFile{{From: podrun, To: "/podrun"}},
		Entrypoint: []string{"/podrun", "pause"},
	}); err != nil {
		t.Fatal(err)
	}

	img := kubetest.Image{
		Name: workloadImage,
		Files: []kubetest.ImageFile{
			{From: podrun, To: podDir + "/podrun"},
			{From: fixtures.Workload, To: podDir + "/workload"},
			{From: fixtures.Cudart, To: podDir + "/libcudart.so.12"},
			{From: fixtures.Cuda, To: podDir + "/libcuda.so.1"},
		},
		// The stubs' RUNPATH names the fixture directory of this machine.
		Env: []string{"LD_LIBRARY_PATH=" + podDir},
	}
	if err := img.WithLibraries(fixtures.Dir); err != nil {
		t.Fatal(err)
	}
	workload := filepath.Join(dir, "workload.tar")
	if err := kubetest.WriteImageArchive(workload, img); err != nil {
		t.Fatal(err)
	}

	p := requirePodman(t)
	image := profiImage + ":" + profiTag
	p.buildImage(t, agentBin, image)
	agent := filepath.Join(dir, "profi.tar")
	p.must(t, "buildah", "push", "--quiet", image, "docker-archive:"+agent+":"+image)
	return []string{pause, workload, agent}
}

// helm runs helm against the node and returns its output.
func helm(t *testing.T, n *kubetest.Node, args ...string) string {
	t.Helper()
	bin, err := kubetest.HelmBinary()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append(args, "--kubeconfig", n.Kubeconfig)...)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+filepath.Join(n.Dir, "helm-cache"),
		"HELM_CONFIG_HOME="+filepath.Join(n.Dir, "helm-config"), "HELM_DATA_HOME="+filepath.Join(n.Dir, "helm-data"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// podSpec is a workload pod's spec: each container runs podrun over the
// workload with args (crash: podrun's --crash-after).
func workloadContainer(name string, crashAfter time.Duration, args ...string) corev1.Container {
	cmd := []string{podDir + "/podrun", "run"}
	if crashAfter > 0 {
		cmd = append(cmd, "--crash-after", crashAfter.String())
	}
	cmd = append(append(append(cmd, "--", podDir+"/workload"), defaultArgs...), args...)
	return corev1.Container{
		Name: name, Image: workloadImage, ImagePullPolicy: corev1.PullNever, Command: cmd,
	}
}

// container is one running workload container: its pod, name, the host
// pids of its podrun and workload, and its restart count when found.
type container struct {
	ns, pod, name string
	id            string // containerd's
	restarts      int32
	podrun, pid   int // host pids
}

func (c container) String() string { return c.ns + "/" + c.pod + "/" + c.name }

// runningContainer waits until the named container of pod ns/pod runs with
// more than minRestarts restarts... exactly restarts, and its workload has
// printed "ready", then finds its processes on this host by the
// container's cgroup.
func runningContainer(t *testing.T, c kubernetes.Interface, ns, pod, name string, restarts int32) container {
	t.Helper()
	var ct container
	err := testenv.Eventually(3*time.Minute, func() error {
		p, err := c.CoreV1().Pods(ns).Get(context.Background(), pod, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, s := range p.Status.ContainerStatuses {
			if s.Name != name {
				continue
			}
			if s.State.Running == nil || s.RestartCount != restarts {
				return fmt.Errorf("%s/%s/%s: restarts %d, state %+v; want running after %d restarts", ns, pod, name, s.RestartCount, s.State, restarts)
			}
			ct = container{ns: ns, pod: pod, name: name, id: strings.TrimPrefix(s.ContainerID, "containerd://"), restarts: s.RestartCount}
			if !strings.Contains(podLog(t, c, ct, false), "ready ") {
				return fmt.Errorf("%s: no ready line yet", ct)
			}
			ct.podrun, ct.pid, err = containerPIDs(ct.id)
			return err
		}
		return fmt.Errorf("%s/%s: no container %s in %+v", ns, pod, name, p.Status.ContainerStatuses)
	})
	if err != nil {
		t.Fatal(err)
	}
	return ct
}

// containerPIDs finds the host pids of podrun and the workload in the
// container id's cgroup (every process's /proc/PID/cgroup names it).
func containerPIDs(id string) (podrun, workload int, err error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, 0, err
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if err != nil || !bytes.Contains(cg, []byte("/"+id+"\n")) {
			continue
		}
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		switch strings.TrimSpace(string(comm)) {
		case "podrun":
			podrun = pid
		case "workload":
			workload = pid
		}
	}
	if podrun == 0 || workload == 0 {
		return 0, 0, fmt.Errorf("container %s: podrun pid %d, workload pid %d", id, podrun, workload)
	}
	return podrun, workload, nil
}

// podLog returns the container's log (previous: its last instance's).
func podLog(t *testing.T, c kubernetes.Interface, ct container, previous bool) string {
	t.Helper()
	b, err := c.CoreV1().Pods(ct.ns).GetLogs(ct.pod, &corev1.PodLogOptions{Container: ct.name, Previous: previous}).
		DoRaw(context.Background())
	if err != nil {
		return ""
	}
	return string(b)
}

// truths returns the ground-truth lines podrun printed in a log.
func truths(log string) []*testutil.GroundTruth {
	var out []*testutil.GroundTruth
	sc := bufio.NewScanner(strings.NewReader(log))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "truth ")
		if !ok {
			continue
		}
		var gt testutil.GroundTruth
		if err := json.Unmarshal([]byte(line), &gt); err == nil {
			out = append(out, &gt)
		}
	}
	return out
}

// phase has the container's workload run one measured phase (SIGUSR1 to
// its podrun) and returns the ground truth it logged, with the host pid.
func phase(t *testing.T, c kubernetes.Interface, ct container) *testutil.GroundTruth {
	t.Helper()
	before := len(truths(podLog(t, c, ct, false)))
	if err := syscall.Kill(ct.podrun, syscall.SIGUSR1); err != nil {
		t.Fatalf("%s: signal podrun %d: %v", ct, ct.podrun, err)
	}
	var gt *testutil.GroundTruth
	err := testenv.Eventually(time.Minute, func() error {
		all := truths(podLog(t, c, ct, false))
		if len(all) <= before {
			return fmt.Errorf("%s: %d truth lines, want %d", ct, len(all), before+1)
		}
		gt = all[before]
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	gt.PID = ct.pid
	return gt
}

// perProcess keeps the per-process series (those with a pid label): the
// histograms carry no pid and sum every process the agent ever saw, which
// a node's other pods change.
func perProcess(v values) {
	for k := range v {
		if !strings.Contains(k, "pid=") {
			delete(v, k)
		}
	}
}

// requireCounted waits until the agent's per-process series of each
// container's workload are exactly what their ground truths say, and every
// one of them carries the container's namespace, pod and container labels.
func requireCounted(t *testing.T, a *testutil.Agent, cts []container, gts []*testutil.GroundTruth) {
	t.Helper()
	want := expected(gts)
	perProcess(want)
	pids := make([]int, len(cts))
	for i, ct := range cts {
		pids[i] = ct.pid
	}
	mfs := requireExactOf(t, a, want, pids, perProcess)
	for _, ct := range cts {
		got, err := podLabelsIn(mfs, ct.pid)
		if err != nil {
			t.Fatal(err)
		}
		if w := [3]string{ct.ns, ct.pod, ct.name}; len(got) != 1 || got[w] == 0 {
			t.Errorf("%s (pid %d): series by (namespace, pod, container) %v; want all %v", ct, ct.pid, got, w)
		}
	}
}

// agentPod returns the running agent pod of the release and a client of
// its HTTP endpoints at the pod's address.
func agentPod(t *testing.T, c kubernetes.Interface, ns string) (*corev1.Pod, *testutil.Agent) {
	t.Helper()
	var pod *corev1.Pod
	err := testenv.Eventually(3*time.Minute, func() error {
		pods, err := c.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=profi"})
		if err != nil {
			return err
		}
		for i := range pods.Items {
			p := &pods.Items[i]
			if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && podReady(p) {
				pod = p
				return nil
			}
		}
		return fmt.Errorf("no Ready agent pod in %s among %d", ns, len(pods.Items))
	})
	if err != nil {
		t.Fatal(err)
	}
	return pod, &testutil.Agent{URL: "http://" + pod.Status.PodIP + ":9401"}
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
