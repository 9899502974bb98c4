package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	pstatus "github.com/profi-dev/profi/internal/status"
	"github.com/profi-dev/profi/internal/testutil"
	"github.com/profi-dev/profi/internal/testutil/certtest"
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

// requireKernelLog checks /status's kernel log: read from path (""
// : any) and running, or not running with an error containing errPart.
func requireKernelLog(t *testing.T, a *testutil.Agent, path, errPart string) {
	t.Helper()
	var st struct {
		KernelLog *struct {
			Path    string `json:"path"`
			Running bool   `json:"running"`
			Error   string `json:"error"`
		} `json:"kernel_log"`
	}
	err := testenv.Eventually(15*time.Second, func() error {
		if err := a.Status(&st); err != nil {
			return err
		}
		k := st.KernelLog
		switch {
		case k == nil:
			return fmt.Errorf("/status has no kernel_log")
		case path != "" && k.Path != path:
			return fmt.Errorf("kernel log %+v, want path %s", *k, path)
		case errPart == "" && !k.Running:
			return fmt.Errorf("kernel log %+v, want running", *k)
		case errPart != "" && (k.Running || !strings.Contains(k.Error, errPart)):
			return fmt.Errorf("kernel log %+v, want not running: %s", *k, errPart)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// requireNoQuarantine fails the test when the crash breaker took any
// probes off.
func requireNoQuarantine(t *testing.T, a *testutil.Agent) {
	t.Helper()
	var st quarantineStatus
	if err := a.Status(&st); err != nil {
		t.Fatal(err)
	}
	if len(st.Quarantined) > 0 || st.Degraded {
		t.Errorf("quarantined %+v, degraded %q: want none", st.Quarantined, st.DegradedReasons)
	}
}

// podSum is the sum of a family's series of one pod, every pid (exited
// ones' and the folded pid="" included).
func podSum(t *testing.T, a *testutil.Agent, ns, pod, family string) float64 {
	t.Helper()
	mfs, err := a.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, s := range testutil.Samples(mfs[family]) {
		if s.Labels["namespace"] == ns && s.Labels["pod"] == pod {
			sum += s.Value
		}
	}
	return sum
}

// deletePod deletes a pod (its processes get SIGTERM, podrun ends the
// workload) and waits until it is gone.
func deletePod(t *testing.T, c kubernetes.Interface, ns, name string) {
	t.Helper()
	ctx := context.Background()
	if err := c.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err := testenv.Eventually(time.Minute, func() error {
		_, err := c.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("pod %s/%s still there (%v)", ns, name, err)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// since is what counters say happened between two expectations of the
// same processes: after minus before, the keys that changed.
func since(after, before values) values {
	out := values{}
	for k, v := range after {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	dropGauges(out)
	return out
}

// dropGauges removes the gauges of an expectation: a new agent's
// active-memory gauge starts at its attach, not as a difference.
func dropGauges(v values) {
	for k := range v {
		if strings.HasPrefix(k, "profi_cuda_active_memory_bytes") {
			delete(v, k)
		}
	}
}

func crdFiles(t *testing.T) []string {
	t.Helper()
	files, err := kubetest.CRDFiles()
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// requireObject fails the test unless the object exists.
func requireObject(t *testing.T, n *kubetest.Node, group, resource, ns, name string) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(n.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	gvr := schema.GroupVersionResource{Group: group, Version: "v1", Resource: resource}
	if _, err := dyn.Resource(gvr).Namespace(ns).Get(context.Background(), name, metav1.GetOptions{}); err != nil {
		t.Errorf("%s %s/%s: %v", resource, ns, name, err)
	}
}

// helmUpgradeAgent upgrades the release with its values and set, waits
// for the rolled agent pod (another pod than a's) and returns a client of
// it with a's TLS configuration and token.
func helmUpgradeAgent(t *testing.T, n *kubetest.Node, a *testutil.Agent, set ...string) *testutil.Agent {
	t.Helper()
	c := n.Client()
	old := a.URL
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"upgrade", "profi", filepath.Join(root, "deploy/profi"), "--namespace", agentNamespace,
		"--reuse-values", "--wait", "--timeout", "3m"}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	start := time.Now()
	helm(t, n, args...)
	scheme := "http"
	if a.HTTP != nil {
		scheme = "https"
	}
	var pod *corev1.Pod
	err = testenv.Eventually(2*time.Minute, func() error {
		var b *testutil.Agent
		pod, b = agentPod(t, c, agentNamespace)
		if u := scheme + "://" + pod.Status.PodIP + ":9401"; u == old {
			return fmt.Errorf("agent pod %s is the one before the upgrade", pod.Name)
		}
		_ = b
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("helm upgrade %v: agent pod %s Ready after %v", set, pod.Name, time.Since(start).Round(time.Millisecond))
	requireNoErrorLog(t, c, pod)
	return &testutil.Agent{URL: scheme + "://" + pod.Status.PodIP + ":9401", HTTP: a.HTTP, Token: a.Token}
}

// upgradeWithAuth upgrades the release as a user turning on HTTPS and
// bearer auth with Prometheus's ServiceAccount as the reader, and a new
// image tag: the serving certificate comes from a Secret (a CA of the
// test's), and the agent must check every token with a TokenReview and a
// SubjectAccessReview against the API server. It returns a client that
// authenticates as a cluster admin.
func upgradeWithAuth(t *testing.T, n *kubetest.Node, a *testutil.Agent) *testutil.Agent {
	t.Helper()
	c := n.Client()
	ctx := context.Background()
	createNamespace(t, c, "monitoring")
	ca := certtest.NewCA(t, "profi-test-ca")
	server := ca.Issue(t, certtest.CertOptions{CommonName: "profi", DNSNames: []string{agentServerName}})
	_, err := c.CoreV1().Secrets(agentNamespace).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "profi-metrics-tls"},
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{"tls.crt": server.CertPEM, "tls.key": server.KeyPEM, "ca.crt": ca.PEM},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.TagImage(profiImage+":"+profiTag, profiImage+":"+profiTag+"2"); err != nil {
		t.Fatal(err)
	}
	b := &testutil.Agent{URL: a.URL, HTTP: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: ca.Pool(), ServerName: agentServerName},
	}}}
	b = helmUpgradeAgent(t, n, b, "image.tag="+profiTag+"2",
		"profi.metricsTls.mode=server", "profi.metricsTls.existingSecret=profi-metrics-tls",
		"profi.metricsAuth.mode=bearer",
		"profi.metricsAuth.readers[0].kind=ServiceAccount", "profi.metricsAuth.readers[0].name=prometheus",
		"profi.metricsAuth.readers[0].namespace=monitoring")
	if code, _, err := b.Get("/metrics"); err != nil || code != http.StatusUnauthorized {
		t.Errorf("/metrics without a token: %d %v, want 401", code, err)
	}
	// Prometheus's ServiceAccount may read /metrics (the chart's readers),
	// nothing else; the test reads /status as a cluster admin.
	b.Token = n.ServiceAccountToken(t, "monitoring", "prometheus")
	if code, _, err := b.Get("/metrics"); err != nil || code != http.StatusOK {
		t.Errorf("/metrics as monitoring/prometheus: %d %v, want 200", code, err)
	}
	if code, _, err := b.Get("/status"); err != nil || code != http.StatusForbidden {
		t.Errorf("/status as monitoring/prometheus: %d %v, want 403 (a reader of /metrics only)", code, err)
	}
	b.Token = n.Token
	return b
}

// agentServerName is the name Prometheus verifies the agent's certificate
// for: the chart's default (serviceMonitor.tls.serverName empty).
const agentServerName = "profi.profi.svc"

// requirePrometheusSD runs a real Prometheus that finds the agent as the
// Prometheus Operator would from the release's ServiceMonitor (role
// endpoints discovery in its namespaces, the operator's relabeling to the
// Service and port, then the ServiceMonitor's own endpoint settings:
// scheme, path, TLS, bearer token, honorLabels, relabelings), with the
// token of its ServiceAccount monitoring/prometheus, and checks that what
// it scraped per (namespace, pod, container) of cts equals the agent's own
// /metrics in mfs.
//
// Debian's Prometheus (2.42) is built without kubernetes_sd_configs, so the
// discovery is served to it over http_sd_configs by endpointsSD: the
// targets and __meta_kubernetes_* labels that role endpoints gives, read
// from the API server with Prometheus's own token. Everything after the
// discovery (relabeling, TLS, auth, the scrape) is Prometheus's.
func requirePrometheusSD(t *testing.T, n *kubetest.Node, mfs map[string]*dto.MetricFamily, cts []container) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(n.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	gvr := schema.GroupVersionResource{Group: "monitoring.coreos.com", Version: "v1", Resource: "servicemonitors"}
	sm, err := dyn.Resource(gvr).Namespace(agentNamespace).Get(context.Background(), "profi", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// What Prometheus's ServiceAccount needs for endpoints discovery (as
	// kube-prometheus grants it); get on /metrics comes from the chart's
	// profi.metricsAuth.readers.
	n.GrantClusterRole(t, "prometheus-sd", []rbacv1.PolicyRule{{APIGroups: []string{""},
		Resources: []string{"endpoints", "services", "pods"}, Verbs: []string{"get", "list", "watch"}}},
		rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: "monitoring", Name: "prometheus"})
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	token := n.ServiceAccountToken(t, "monitoring", "prometheus")
	promCfg := n.RESTConfig()
	promCfg.BearerToken = token
	promClient, err := kubernetes.NewForConfig(promCfg)
	if err != nil {
		t.Fatal(err)
	}
	sd := httptest.NewServer(endpointsSD(t, promClient, sm.Object))
	t.Cleanup(sd.Close)
	cfg, err := scrapeConfigFromServiceMonitor(sm.Object, sd.URL, write, func(ns, name, key string) []byte {
		s, err := n.Client().CoreV1().Secrets(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return s.Data[key]
	}, token)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("prometheus config:\n%s", cfg)
		}
	})
	p := startPrometheusWith(t, string(cfg))

	want := map[[3]string]float64{}
	keep := map[[3]string]bool{}
	for _, ct := range cts {
		keep[[3]string{ct.ns, ct.pod, ct.name}] = true
	}
	for _, s := range testutil.Samples(mfs["profi_cuda_calls_total"]) {
		if k := [3]string{s.Labels["namespace"], s.Labels["pod"], s.Labels["container"]}; keep[k] {
			want[k] += s.Value
		}
	}
	err = testenv.Eventually(90*time.Second, func() error {
		up, err := p.query(`up`)
		if err != nil {
			return err
		}
		if len(up) != 1 || up[0].value != 1 {
			return fmt.Errorf("up %+v, want one target up", up)
		}
		got, err := p.query(`sum by (namespace, pod, container) (profi_cuda_calls_total)`)
		if err != nil {
			return err
		}
		have := map[[3]string]float64{}
		for _, s := range got {
			if k := [3]string{s.labels["namespace"], s.labels["pod"], s.labels["container"]}; keep[k] {
				have[k] = s.value
			}
		}
		if !maps.Equal(have, want) {
			return fmt.Errorf("Prometheus: calls by (namespace, pod, container) %v; the agent's /metrics: %v", have, want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Prometheus (role endpoints discovery, the ServiceMonitor's settings, bearer token of monitoring/prometheus) scraped the calls of %d containers exactly", len(want))
}

// scrapeConfigFromServiceMonitor writes the Prometheus configuration the
// Prometheus Operator generates for a ServiceMonitor's first endpoint
// (its job name, the role endpoints discovery in the namespaceSelector's
// namespaces, the keep rules for the selector's labels and the port name,
// the target labels namespace, service, pod, container and endpoint, then
// the endpoint's own settings), with the discovery at sdURL (endpointsSD).
// Files (the CA from its Secret, the token for bearerTokenFile) go through
// write.
func scrapeConfigFromServiceMonitor(sm map[string]any, sdURL string, write func(string, []byte) string,
	secret func(ns, name, key string) []byte, token string) ([]byte, error) {
	ns, _, _ := unstructured.NestedString(sm, "metadata", "namespace")
	name, _, _ := unstructured.NestedString(sm, "metadata", "name")
	spec, _, _ := unstructured.NestedMap(sm, "spec")
	eps, _, _ := unstructured.NestedSlice(spec, "endpoints")
	if len(eps) != 1 {
		return nil, fmt.Errorf("ServiceMonitor %s/%s: %d endpoints, want 1", ns, name, len(eps))
	}
	ep := eps[0].(map[string]any)
	str := func(m map[string]any, path ...string) string {
		v, _, _ := unstructured.NestedString(m, path...)
		return v
	}
	tokenFile := write("token", []byte(token))
	job := map[string]any{
		"job_name":        fmt.Sprintf("serviceMonitor/%s/%s/0", ns, name),
		"scrape_interval": "1s",
		"scheme":          str(ep, "scheme"),
		"metrics_path":    str(ep, "path"),
		"http_sd_configs": []any{map[string]any{"url": sdURL, "refresh_interval": "1s"}},
	}
	if h, ok, _ := unstructured.NestedBool(ep, "honorLabels"); ok {
		job["honor_labels"] = h
	}
	if str(ep, "bearerTokenFile") != "" {
		job["authorization"] = map[string]any{"credentials_file": tokenFile}
	}
	if tc, ok, _ := unstructured.NestedMap(ep, "tlsConfig"); ok {
		tlsCfg := map[string]any{"server_name": str(tc, "serverName")}
		if skip, _, _ := unstructured.NestedBool(tc, "insecureSkipVerify"); skip {
			tlsCfg["insecure_skip_verify"] = true
		}
		if sec := str(tc, "ca", "secret", "name"); sec != "" {
			tlsCfg["ca_file"] = write("ca.crt", secret(ns, sec, str(tc, "ca", "secret", "key")))
		}
		job["tls_config"] = tlsCfg
	}
	var relabel []any
	labels, _, _ := unstructured.NestedStringMap(spec, "selector", "matchLabels")
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		relabel = append(relabel, map[string]any{"action": "keep",
			"source_labels": []string{"__meta_kubernetes_service_label_" + sanitize(k)}, "regex": labels[k]})
	}
	port := str(ep, "port")
	relabel = append(relabel,
		map[string]any{"action": "keep", "source_labels": []string{"__meta_kubernetes_endpoint_port_name"}, "regex": port},
		map[string]any{"source_labels": []string{"__meta_kubernetes_namespace"}, "target_label": "namespace"},
		map[string]any{"source_labels": []string{"__meta_kubernetes_service_name"}, "target_label": "service"},
		map[string]any{"source_labels": []string{"__meta_kubernetes_pod_name"}, "target_label": "pod"},
		map[string]any{"source_labels": []string{"__meta_kubernetes_pod_container_name"}, "target_label": "container"},
		map[string]any{"target_label": "endpoint", "replacement": port},
	)
	rl, _, _ := unstructured.NestedSlice(ep, "relabelings")
	relabel = append(relabel, snakeKeys(rl)...)
	job["relabel_configs"] = relabel
	if mrl, ok, _ := unstructured.NestedSlice(ep, "metricRelabelings"); ok {
		job["metric_relabel_configs"] = snakeKeys(mrl)
	}
	return json.Marshal(map[string]any{ // JSON is YAML
		"global":         map[string]any{"scrape_interval": "1s", "evaluation_interval": "1s"},
		"scrape_configs": []any{job},
	})
}

// endpointsSD serves, in http_sd_configs' format, what Prometheus's
// kubernetes_sd_configs role endpoints discovers in the ServiceMonitor's
// namespaces: one target per endpoint address and port, with the
// __meta_kubernetes_* labels the relabeling uses (namespace, service name
// and labels, endpoint port name, pod name, the container that declares
// the port). It lists with c, Prometheus's own credentials.
func endpointsSD(t *testing.T, c kubernetes.Interface, sm map[string]any) http.HandlerFunc {
	namespaces, _, _ := unstructured.NestedStringSlice(sm, "spec", "namespaceSelector", "matchNames")
	return func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		groups := []map[string]any{}
		for _, ns := range namespaces {
			eps, err := c.CoreV1().Endpoints(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			for _, ep := range eps.Items {
				svc, err := c.CoreV1().Services(ns).Get(ctx, ep.Name, metav1.GetOptions{})
				if err != nil {
					continue
				}
				for _, sub := range ep.Subsets {
					for _, addr := range sub.Addresses {
						for _, port := range sub.Ports {
							labels := map[string]string{
								"__meta_kubernetes_namespace":          ns,
								"__meta_kubernetes_service_name":       svc.Name,
								"__meta_kubernetes_endpoint_port_name": port.Name,
							}
							for k, v := range svc.Labels {
								labels["__meta_kubernetes_service_label_"+sanitize(k)] = v
							}
							if ref := addr.TargetRef; ref != nil && ref.Kind == "Pod" {
								labels["__meta_kubernetes_pod_name"] = ref.Name
								if pod, err := c.CoreV1().Pods(ns).Get(ctx, ref.Name, metav1.GetOptions{}); err == nil {
									for _, ctr := range pod.Spec.Containers {
										for _, p := range ctr.Ports {
											if p.ContainerPort == port.Port {
												labels["__meta_kubernetes_pod_container_name"] = ctr.Name
											}
										}
									}
								}
							}
							groups = append(groups, map[string]any{
								"targets": []string{fmt.Sprintf("%s:%d", addr.IP, port.Port)}, "labels": labels,
							})
						}
					}
				}
			}
		}
		w.Header().Set("Content-Type", "application/json")
		if err := json.NewEncoder(w).Encode(groups); err != nil {
			t.Logf("endpoints discovery: %v", err)
		}
	}
}

// sanitize is Prometheus's label name sanitizing of a Kubernetes label key.
func sanitize(k string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' {
			return r
		}
		return '_'
	}, k)
}

// snakeKeys turns a ServiceMonitor's relabelings (sourceLabels,
// targetLabel) into Prometheus's relabel_configs (source_labels,
// target_label).
func snakeKeys(rules []any) []any {
	var out []any
	for _, r := range rules {
		m := map[string]any{}
		for k, v := range r.(map[string]any) {
			var b strings.Builder
			for _, c := range k {
				if c >= 'A' && c <= 'Z' {
					b.WriteByte('_')
					c += 'a' - 'A'
				}
				b.WriteRune(c)
			}
			m[b.String()] = v
		}
		out = append(out, m)
	}
	return out
}

// logRolloutGap reports, per attached file, how long its processes went
// uncounted across a rollout at most: from the start of the upgrade (the
// old agent was counting until then at least) to the new agent's attach
// of the file (/status attached_at).
func logRolloutGap(t *testing.T, a *testutil.Agent, upgrade time.Time) {
	t.Helper()
	var st struct {
		Attached []struct {
			Path       string    `json:"path"`
			PIDs       []int     `json:"pids"`
			AttachedAt time.Time `json:"attached_at"`
		} `json:"attached_libraries"`
	}
	if err := a.Status(&st); err != nil {
		t.Fatal(err)
	}
	for _, f := range st.Attached {
		gap := f.AttachedAt.Sub(upgrade)
		if gap <= 0 {
			t.Errorf("%s: attached at %v, before the upgrade began (%v)", f.Path, f.AttachedAt, upgrade)
		}
		t.Logf("rollout gap of %s (%d processes): at most %v", f.Path, len(f.PIDs), gap.Round(time.Millisecond))
	}
}

// requirePodTenants checks that the agent admits each container's process
// under its pod's cgroup (/status processes[].tenant; issue 47: the pod
// is the tenant), the cgroup kubelet made for the pod: the parent of the
// process's own in the host's cgroup v2 hierarchy (its "0::" line), its
// id that directory's inode. Containers of one pod share it.
func requirePodTenants(t *testing.T, a *testutil.Agent, cts []container) {
	t.Helper()
	root := cgroup2Root(t)
	want := map[int]uint64{}
	for _, ct := range cts {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", ct.pid))
		if err != nil {
			t.Fatal(err)
		}
		var path string
		for _, line := range strings.Split(string(b), "\n") {
			if p, ok := strings.CutPrefix(line, "0::"); ok {
				path = p
			}
		}
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(root, filepath.Dir(path)), &st); err != nil {
			t.Fatalf("%s: the pod cgroup of %q: %v", ct, path, err)
		}
		want[ct.pid] = st.Ino
	}
	var doc pstatus.Doc
	err := testenv.Eventually(10*time.Second, func() error {
		if err := a.Status(&doc); err != nil {
			return err
		}
		got := map[int]uint64{}
		for _, p := range doc.Processes {
			got[p.PID] = p.Tenant
		}
		for _, ct := range cts {
			if got[ct.pid] != want[ct.pid] {
				return fmt.Errorf("%s (pid %d): tenant %d, want its pod's cgroup %d", ct, ct.pid, got[ct.pid], want[ct.pid])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%v (pod cgroups: %+v)", err, doc.PodCgroups)
	}
	t.Logf("every container's process admitted under its pod's cgroup (%d pod cgroups in %s)", doc.PodCgroups.Pods, doc.PodCgroups.Dir)
}

// requireLinkCaps: the chart's link caps reach the agent (issue 47,
// docs/OPERATIONS.md "Descriptors and teardown"): the teardown cap is the
// chart's terminationGracePeriodSeconds (75 in deploy/profi/values.yaml)
// less 15, the descriptor cap three quarters of the agent's descriptor
// limit, and the time one link takes to go was measured at start.
func requireLinkCaps(t *testing.T, a *testutil.Agent) {
	t.Helper()
	var doc pstatus.Doc
	if err := a.Status(&doc); err != nil {
		t.Fatal(err)
	}
	l, fds := doc.ProbeLinks, doc.FileDescriptors
	if l == nil || fds == nil {
		t.Fatalf("/status has no probe_links (%v) or file_descriptors (%v)", l, fds)
	}
	const grace, shutdown = 75, 15
	if l.MaxTeardownSeconds != grace-shutdown || uint64(l.MaxDescriptors) != fds.Limit/4*3 || l.LinkReleaseSeconds == 0 {
		t.Errorf("probe_links %+v with descriptor limit %d: want max_teardown %d s, max_descriptors %d, a measured link release", *l, fds.Limit, grace-shutdown, fds.Limit/4*3)
	}
	files := 0
	for _, lib := range doc.AttachedLibraries {
		files += lib.Descriptors
	}
	if files == 0 || files > l.Descriptors || l.Descriptors > fds.Open {
		t.Errorf("probe links hold %d descriptors, the attached files %d, the agent has %d open: want 0 < files <= links <= open", l.Descriptors, files, fds.Open)
	}
	t.Logf("probe links: %d links, %d descriptors (%d of the attached files'), %d open of %d; one link released in %.3f s, teardown estimate %.3f s of %.0f",
		l.Links, l.Descriptors, files, fds.Open, fds.Limit, l.LinkReleaseSeconds, l.TeardownSeconds, l.MaxTeardownSeconds)
}
