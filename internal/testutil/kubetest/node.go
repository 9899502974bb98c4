package kubetest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// The single-node cluster's network: a host bridge that CNI's bridge plugin
// attaches every pod to. Its address is the node's InternalIP and the one
// address the API server binds, so both the host and the pods reach it
// without leaving the machine (docs/TESTING.md, "The test node").
const (
	NodeBridge = "profi-node0"
	PodCIDR    = "10.244.0.0/24"
	NodeIP     = "10.244.0.1"
)

// NodeBinaries are the Kubernetes binaries a node runs besides
// kube-apiserver, all built by scripts/build-kube.sh at its version.
var NodeBinaries = []string{"kubelet", "kube-controller-manager", "kube-scheduler", "kube-proxy"}

// nodeTools are the Debian-packaged programs StartNode runs, and the
// package each comes from.
var nodeTools = map[string]string{
	"containerd": "containerd", "containerd-shim-runc-v2": "containerd", "ctr": "containerd",
	"runc": "runc", "iptables": "iptables", "ip": "iproute2",
}

// cniPlugins are the CNI plugins the node's network uses, from Debian's
// containernetworking-plugins.
const cniBinDir = "/usr/lib/cni"

var cniPlugins = []string{"bridge", "host-local", "loopback"}

// NodeOptions configure StartNode.
type NodeOptions struct {
	Name   string            // the node's name; default "profi-node"
	Labels map[string]string // node labels kubelet registers (--node-labels)
	// Images are image archives (WriteImageArchive, or docker-archive files)
	// imported into containerd's k8s.io namespace before kubelet starts;
	// the first must be the pause image named PauseImage.
	Images []string
}

// PauseImage is the sandbox image containerd runs for every pod; the test
// writes it (a static binary that waits for SIGTERM) and passes it first
// in NodeOptions.Images.
const PauseImage = "localhost/profi-pause:test"

// Node is a single-node Kubernetes cluster on this machine, as a user's
// GPU node runs it: etcd and kube-apiserver (APIServer), kube-controller-
// manager, kube-scheduler, kube-proxy in iptables mode, kubelet with the
// cgroupfs driver, containerd with runc and a CNI bridge. Images come from
// archives, never a registry (pods need imagePullPolicy: Never).
type Node struct {
	*APIServer
	Name string
	// Dir holds the components' configuration, state and logs (short, for
	// containerd's socket path); Logs lists the log files.
	Dir  string
	Logs map[string]string
	// Cgroup is what kubelet reports it runs on: "v1" or "v2".
	Cgroup string

	procs      []*process // in start order
	containerd string     // containerd's socket
	// The pods' network namespaces that existed before containerd started.
	netnsBefore []string
}

// netnsGlob matches the pods' network namespaces containerd creates.
const netnsGlob = "/var/run/netns/cni-*"

// RequireNode skips the test (fails it under PROFI_E2E=1) when this machine
// cannot run a node, and returns the paths of NodeBinaries.
func RequireNode(t testing.TB) map[string]string {
	t.Helper()
	if testing.Short() {
		t.Skip("skipping test that starts a Kubernetes node in -short mode")
	}
	bins, err := nodeBinaries()
	if err == nil && os.Geteuid() != 0 {
		err = errors.New("a node needs root (kubelet, containerd, network namespaces)")
	}
	if err != nil {
		if os.Getenv(testenv.E2EEnv) == "1" {
			t.Fatalf("node test cannot run (%v) and %s=1 forbids skipping", err, testenv.E2EEnv)
		}
		t.Skipf("skipping node test: %v (set %s=1 to make this a failure)", err, testenv.E2EEnv)
	}
	return bins
}

func nodeBinaries() (map[string]string, error) {
	version, err := KubeVersion()
	if err != nil {
		return nil, err
	}
	bins := map[string]string{}
	for _, b := range NodeBinaries {
		p := filepath.Join(testenv.ToolsCache(), b+"-"+version, b)
		if err := testenv.Executable(p); err != nil {
			return nil, fmt.Errorf("%s %s is not built (%w): run scripts/build-kube.sh", b, version, err)
		}
		bins[b] = p
	}
	for tool, pkg := range nodeTools {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("%s not found (Debian package %s)", tool, pkg)
		}
	}
	for _, p := range cniPlugins {
		if err := testenv.Executable(filepath.Join(cniBinDir, p)); err != nil {
			return nil, fmt.Errorf("CNI plugin %s (Debian package containernetworking-plugins): %w", p, err)
		}
	}
	return bins, nil
}

// StartNode starts a single-node cluster and waits until the node is Ready,
// and stops it (pods, containers, components, network) on t's cleanup.
func StartNode(t testing.TB, opts NodeOptions) *Node {
	t.Helper()
	bins := RequireNode(t)
	if opts.Name == "" {
		opts.Name = "profi-node"
	}
	dir, err := os.MkdirTemp("", "pn-") // containerd's socket path must stay short
	if err != nil {
		t.Fatal(err)
	}
	n := &Node{Name: opts.Name, Dir: dir, Logs: map[string]string{}}
	start := time.Now()
	if err := setupBridge(); err != nil {
		t.Fatalf("node network: %v", err)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", NodeBridge).Run() })
	n.APIServer = StartAPIServerWith(t, APIServerOptions{Address: NodeIP, ServiceAccounts: true})
	// After the API server's: cleanups run last first, and the pods are
	// deleted through it.
	t.Cleanup(func() {
		if t.Failed() {
			for _, c := range slices.Sorted(maps.Keys(n.Logs)) {
				t.Logf("%s log (last lines):\n%s", c, tailFile(n.Logs[c], 25))
			}
		}
		n.stop(t)
	})
	steps := []struct {
		name string
		fn   func() error
	}{
		{"containerd", func() error { return n.startContainerd(opts.Images) }},
		{"kube-controller-manager", func() error { return n.startControllerManager(bins["kube-controller-manager"]) }},
		{"kube-scheduler", func() error { return n.startScheduler(bins["kube-scheduler"]) }},
		{"kube-proxy", func() error { return n.startProxy(bins["kube-proxy"]) }},
		{"kubelet", func() error { return n.startKubelet(bins["kubelet"], opts.Labels) }},
	}
	for _, s := range steps {
		if err := s.fn(); err != nil {
			t.Fatalf("start %s: %v", s.name, err)
		}
	}
	if err := n.waitReady(); err != nil {
		t.Fatalf("node %s: %v", n.Name, err)
	}
	t.Logf("node %s Ready in %v (kubelet on cgroup %s)", n.Name, time.Since(start).Round(time.Millisecond), n.Cgroup)
	return n
}

// setupBridge creates the pods' bridge with the node's address (removing a
// leftover of an earlier run first): the API server binds it before any pod
// exists, and CNI's bridge plugin reuses it.
func setupBridge() error {
	_ = exec.Command("ip", "link", "del", NodeBridge).Run()
	for _, args := range [][]string{
		{"link", "add", NodeBridge, "type", "bridge"},
		{"addr", "add", NodeIP + "/24", "dev", NodeBridge},
		{"link", "set", NodeBridge, "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	return nil
}

func (n *Node) path(parts ...string) string {
	return filepath.Join(append([]string{n.Dir}, parts...)...)
}

func (n *Node) start(name, bin string, args ...string) (*process, error) {
	n.Logs[name] = n.path(name + ".log")
	p, err := startProcess(bin, n.Logs[name], os.Environ(), args...)
	if err != nil {
		return nil, err
	}
	n.procs = append(n.procs, p)
	return p, nil
}

// startContainerd runs containerd with the CRI settings kubelet needs on
// our machines (docs/TESTING.md): the cgroupfs driver, the node's CNI
// network, a local sandbox image, and restrict_oom_score_adj, because the
// machines withhold CAP_SYS_RESOURCE even from root, so runc could not set
// the negative oom_score_adj kubelet asks for and every sandbox would fail.
func (n *Node) startContainerd(images []string) error {
	n.containerd = n.path("containerd.sock")
	n.netnsBefore, _ = filepath.Glob(netnsGlob)
	for _, d := range []string{"cni", "cni-ipam"} {
		if err := os.MkdirAll(n.path(d), 0o755); err != nil {
			return err
		}
	}
	conflist := fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": "profi-node",
  "plugins": [{
    "type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": false, "hairpinMode": true,
    "ipam": {"type": "host-local", "dataDir": %q, "ranges": [[{"subnet": %q, "gateway": %q}]],
             "routes": [{"dst": "0.0.0.0/0"}]}
  }]
}
`, NodeBridge, n.path("cni-ipam"), PodCIDR, NodeIP)
	if err := os.WriteFile(n.path("cni", "10-profi-node.conflist"), []byte(conflist), 0o644); err != nil {
		return err
	}
	config := fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = %q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %q
    conf_dir = %q
`, n.path("containerd", "root"), n.path("containerd", "state"), n.containerd, PauseImage, cniBinDir, n.path("cni"))
	if err := os.WriteFile(n.path("containerd.toml"), []byte(config), 0o644); err != nil {
		return err
	}
	p, err := n.start("containerd", "containerd", "--config", n.path("containerd.toml"))
	if err != nil {
		return err
	}
	err = p.waitReady(30*time.Second, func() error {
		_, err := n.ctr("version")
		return err
	})
	if err != nil {
		return err
	}
	for _, img := range images {
		if err := n.ImportImage(img); err != nil {
			return err
		}
	}
	return nil
}

// ctr runs containerd's ctr against the node's containerd, in the k8s.io
// namespace (the CRI plugin's).
func (n *Node) ctr(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ctr", append([]string{"--address", n.containerd, "--namespace", "k8s.io"}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ctr %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// ImportImage imports an image archive (OCI layout or docker-archive) into
// the node's containerd, where pods with imagePullPolicy Never find it.
func (n *Node) ImportImage(archive string) error {
	_, err := n.ctr("images", "import", archive)
	return err
}

// TagImage gives an imported image another name (a "new version" of it).
func (n *Node) TagImage(src, dst string) error {
	_, err := n.ctr("images", "tag", "--force", src, dst)
	return err
}

func (n *Node) startControllerManager(bin string) error {
	port, err := freePorts(1)
	if err != nil {
		return err
	}
	p, err := n.start("kube-controller-manager", bin,
		"--kubeconfig="+n.Kubeconfig,
		"--bind-address=127.0.0.1", "--secure-port="+strconv.Itoa(port[0]),
		"--leader-elect=false",
		// Tokens of the pods' ServiceAccounts, and the CA bundle they get
		// (the kube-root-ca.crt ConfigMap).
		"--service-account-private-key-file="+filepath.Join(n.APIServer.Dir, "sa.key"),
		"--root-ca-file="+n.CAFile,
		"--cluster-cidr="+PodCIDR,
	)
	if err != nil {
		return err
	}
	// Ready once it has created the default namespace's ServiceAccount,
	// which every pod needs under the ServiceAccount admission plugin.
	return p.waitReady(time.Minute, func() error {
		_, err := n.Client().CoreV1().ServiceAccounts(metav1.NamespaceDefault).Get(context.Background(), "default", metav1.GetOptions{})
		return err
	})
}

func (n *Node) startScheduler(bin string) error {
	port, err := freePorts(1)
	if err != nil {
		return err
	}
	_, err = n.start("kube-scheduler", bin,
		"--kubeconfig="+n.Kubeconfig,
		"--bind-address=127.0.0.1", "--secure-port="+strconv.Itoa(port[0]),
		"--leader-elect=false",
	)
	return err
}

// startProxy runs kube-proxy in iptables mode: the pods reach the API
// server through the "kubernetes" Service's address, as in any cluster.
// It leaves the host's conntrack and route_localnet settings alone.
func (n *Node) startProxy(bin string) error {
	ports, err := freePorts(2)
	if err != nil {
		return err
	}
	config := fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: %q
mode: iptables
hostnameOverride: %q
clusterCIDR: %q
healthzBindAddress: 127.0.0.1:%d
metricsBindAddress: 127.0.0.1:%d
iptables:
  localhostNodePorts: false
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
`, n.Kubeconfig, n.Name, PodCIDR, ports[0], ports[1])
	if err := os.WriteFile(n.path("kube-proxy.yaml"), []byte(config), 0o644); err != nil {
		return err
	}
	_, err = n.start("kube-proxy", bin, "--config="+n.path("kube-proxy.yaml"))
	return err
}

// startKubelet runs kubelet for this host: the cgroupfs driver (no systemd
// here), cgroup v1 allowed (failCgroupV1: false, KEP-5573) where the host
// is hybrid v1, swap allowed. The API server reaches it at the node's
// address for logs; any caller may read them (a test node on a host
// bridge).
func (n *Node) startKubelet(bin string, labels map[string]string) error {
	ports, err := freePorts(1)
	if err != nil {
		return err
	}
	config := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://%s
address: %s
port: %d
readOnlyPort: 0
healthzPort: 0
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%%
  imagefs.available: 1%%
  nodefs.inodesFree: 1%%
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
`, n.containerd, NodeIP, ports[0])
	if err := os.WriteFile(n.path("kubelet.yaml"), []byte(config), 0o644); err != nil {
		return err
	}
	var nl []string
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		nl = append(nl, k+"="+labels[k])
	}
	args := []string{
		"--config=" + n.path("kubelet.yaml"),
		"--kubeconfig=" + n.Kubeconfig,
		"--root-dir=" + n.path("kubelet"),
		"--cert-dir=" + n.path("kubelet-pki"),
		"--hostname-override=" + n.Name,
		"--node-ip=" + NodeIP,
	}
	if len(nl) > 0 {
		args = append(args, "--node-labels="+strings.Join(nl, ","))
	}
	_, err = n.start("kubelet", bin, args...)
	return err
}

func (n *Node) waitReady() error {
	return testenv.Eventually(2*time.Minute, func() error {
		node, err := n.Client().CoreV1().Nodes().Get(context.Background(), n.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				n.Cgroup = "v1"
				if isCgroup2("/sys/fs/cgroup") {
					n.Cgroup = "v2"
				}
				return nil
			}
		}
		return fmt.Errorf("not Ready: %+v", node.Status.Conditions)
	})
}

func isCgroup2(path string) bool {
	var st syscall.Statfs_t
	return syscall.Statfs(path, &st) == nil && st.Type == 0x63677270 // CGROUP2_SUPER_MAGIC
}

// stop tears the node down: the controllers first (so that nothing
// recreates a pod), then the pods through kubelet (which releases their
// network namespaces and CNI addresses), whatever container processes
// remain and their shims, the other components, kube-proxy's rules, the
// mounts kubelet and containerd left under Dir, the network namespaces
// this node created and the pods' cgroups.
func (n *Node) stop(t testing.TB) {
	n.stopProcs("kube-controller-manager", "kube-scheduler")
	if _, ok := n.Logs["kubelet"]; ok {
		n.deleteAllPods(t)
	}
	n.stopProcs("kubelet", "kube-proxy")
	killContainers(n.containerd)
	n.stopProcs("containerd")
	if bins, err := nodeBinaries(); err == nil {
		_ = exec.Command(bins["kube-proxy"], "--cleanup").Run()
	}
	unmountUnder(n.Dir)
	now, _ := filepath.Glob(netnsGlob)
	for _, ns := range now {
		if slices.Contains(n.netnsBefore, ns) {
			continue
		}
		_ = syscall.Unmount(ns, syscall.MNT_DETACH)
		_ = os.Remove(ns)
	}
	removeCgroups("kubepods")
	if err := os.RemoveAll(n.Dir); err != nil {
		t.Logf("node %s: %v", n.Dir, err)
	}
}

// stopProcs stops the named components (SIGTERM, SIGKILL after 10 s).
func (n *Node) stopProcs(names ...string) {
	for _, p := range n.procs {
		if slices.Contains(names, p.name) {
			_ = p.stop(10 * time.Second)
		}
	}
}

// killContainers kills every process in a pod's cgroup (kubelet's
// /kubepods tree), then the shims of the containerd at socket: what
// deleting the pods left behind.
func killContainers(socket string) {
	procs, _ := filepath.Glob("/proc/[0-9]*")
	var shims []int
	for _, d := range procs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		if cg, err := os.ReadFile(d + "/cgroup"); err == nil && strings.Contains(string(cg), ":/kubepods/") {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if cmd, err := os.ReadFile(d + "/cmdline"); err == nil && socket != "" &&
			strings.Contains(string(cmd), "containerd-shim") && strings.Contains(string(cmd), socket) {
			shims = append(shims, pid)
		}
	}
	for _, pid := range shims {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// deleteAllPods deletes every pod at once and waits (up to a minute) for
// kubelet to have removed them.
func (n *Node) deleteAllPods(t testing.TB) {
	ctx := context.Background()
	zero := int64(0)
	nss, err := n.Client().CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	for _, ns := range nss.Items {
		_ = n.Client().CoreV1().Pods(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
	}
	err = testenv.Eventually(time.Minute, func() error {
		pods, err := n.Client().CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		if len(pods.Items) > 0 {
			return fmt.Errorf("%d pods left", len(pods.Items))
		}
		return nil
	})
	if err != nil {
		t.Logf("node teardown: %v", err)
	}
}

// unmountUnder detaches every mount below dir, deepest first.
func unmountUnder(dir string) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return
	}
	defer f.Close()
	var points []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && strings.HasPrefix(fields[4], dir+"/") {
			points = append(points, fields[4])
		}
	}
	slices.SortFunc(points, func(a, b string) int { return len(b) - len(a) })
	for _, p := range points {
		_ = syscall.Unmount(p, syscall.MNT_DETACH)
	}
}

// removeCgroups removes the cgroup tree rel (kubelet's) in every mounted
// hierarchy, deepest first; a cgroup is removable once its processes left.
func removeCgroups(rel string) {
	roots, _ := filepath.Glob("/sys/fs/cgroup/*")
	roots = append(roots, "/sys/fs/cgroup")
	for _, root := range roots {
		top := filepath.Join(root, rel)
		var dirs []string
		_ = filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		slices.SortFunc(dirs, func(a, b string) int { return len(b) - len(a) })
		for _, d := range dirs {
			_ = os.Remove(d)
		}
	}
}
