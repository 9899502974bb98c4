package kubetest

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/profi-dev/profi/internal/testutil/testenv"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Where StartAPIServer finds its binaries.
const (
	// KubeAPIServerEnv names a kube-apiserver binary to use instead of the
	// cached one.
	KubeAPIServerEnv = "PROFI_KUBE_APISERVER"

	// kubeWrapperMod is the wrapper module whose k8s.io/kubernetes version
	// names the cached binary.
	kubeWrapperMod = "tools/kube/go.mod"
)

// ServiceCIDR is the API server's Service address range; the "kubernetes"
// Service has its first address.
const ServiceCIDR = "10.0.0.0/24"

// Identity of the admin user of StartAPIServer's kubeconfig. The group
// system:masters passes every RBAC check.
const (
	APIServerAdminUser  = "profi-admin"
	APIServerAdminGroup = "system:masters"
)

// Static-token users of StartAPIServer besides the admin, with no RBAC
// rights until a test grants them some (APIServer.ReaderToken,
// APIServer.NobodyToken).
const (
	APIServerReaderUser  = "profi-reader"
	APIServerReaderGroup = "profi:metrics-readers"
	APIServerNobodyUser  = "profi-nobody"
)

// KubeVersion returns the Kubernetes version that tools/kube
// builds (the version of k8s.io/kubernetes its go.mod requires).
func KubeVersion() (string, error) {
	root, err := testenv.RepoRoot()
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(filepath.Join(root, kubeWrapperMod))
	if err != nil {
		return "", fmt.Errorf("testutil: %w", err)
	}
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) > 0 && f[0] == "require" {
			f = f[1:]
		}
		if len(f) >= 2 && f[0] == "k8s.io/kubernetes" {
			return f[1], nil
		}
	}
	return "", fmt.Errorf("testutil: %s requires no k8s.io/kubernetes", kubeWrapperMod)
}

// KubeAPIServerBinary returns the kube-apiserver to run: $PROFI_KUBE_APISERVER,
// or the one scripts/build-kube.sh cached under
// $PROFI_TOOLS_CACHE (default /var/cache/profi-tools)/kube-apiserver-VERSION/.
func KubeAPIServerBinary() (string, error) {
	if p := os.Getenv(KubeAPIServerEnv); p != "" {
		if err := testenv.Executable(p); err != nil {
			return "", fmt.Errorf("%s=%s: %w", KubeAPIServerEnv, p, err)
		}
		return p, nil
	}
	version, err := KubeVersion()
	if err != nil {
		return "", err
	}
	cache := testenv.ToolsCache()
	p := filepath.Join(cache, "kube-apiserver-"+version, "kube-apiserver")
	if err := testenv.Executable(p); err != nil {
		return "", fmt.Errorf("kube-apiserver %s is not built (%w): run scripts/build-kube.sh "+
			"(about 10 minutes on 2 cores; .ci/run does), or set %s", version, err, KubeAPIServerEnv)
	}
	return p, nil
}

// APIServer is a real kube-apiserver backed by its own etcd, both on free
// loopback ports, started by StartAPIServer. No controller-manager,
// scheduler or kubelet runs: objects are stored and served exactly as in a
// cluster, but nothing acts on them (pods stay Pending unless a test writes
// their status; deleted namespaces stay Terminating). The ServiceAccount
// admission plugin is disabled, so pods need no ServiceAccount; RBAC is on.
type APIServer struct {
	Kubeconfig string // admin kubeconfig (token of APIServerAdminUser in system:masters)
	URL        string // https://127.0.0.1:PORT
	CAFile     string // PEM bundle that verifies the serving certificate
	Token      string // the admin bearer token
	// Static tokens (--token-auth-file) of APIServerReaderUser (group
	// APIServerReaderGroup) and APIServerNobodyUser.
	ReaderToken string
	NobodyToken string
	Dir         string // etcd data, certificates, keys, logs (kube-apiserver.log, etcd.log)
	EtcdURL     string // http://127.0.0.1:PORT

	opts   APIServerOptions
	bin    string
	args   []string
	caData []byte

	mu     sync.Mutex
	kube   *process // nil while down
	etcd   *process
	client kubernetes.Interface
}

// StartAPIServer starts etcd and kube-apiserver, waits until /readyz answers
// 200 and the default namespace exists, and stops both on t's cleanup. It
// skips the test when kube-apiserver is not built or etcd is not installed
// (Debian package etcd-server), or fails it when PROFI_E2E=1 forbids
// skipping; under -short it skips (the start takes seconds).
func StartAPIServer(t testing.TB) *APIServer {
	t.Helper()
	return StartAPIServerWith(t, APIServerOptions{})
}

// APIServerOptions change what StartAPIServerWith starts from the default
// (objects only, on loopback) to the API server of a cluster whose pods
// reach it (StartNode).
type APIServerOptions struct {
	// Address is the one address the server binds, advertises (the
	// "kubernetes" Service's endpoint) and is reached at; its self-signed
	// certificate names it. Empty: 127.0.0.1, and no endpoint reconciler.
	Address string
	// ServiceAccounts turns the ServiceAccount admission plugin on: pods
	// get their ServiceAccount's token mounted, and the ServiceAccount must
	// exist (kube-controller-manager creates each namespace's default one).
	ServiceAccounts bool
}

// StartAPIServerWith is StartAPIServer with options.
func StartAPIServerWith(t testing.TB, opts APIServerOptions) *APIServer {
	t.Helper()
	if testing.Short() {
		t.Skip("skipping test that needs a kube-apiserver in -short mode")
	}
	bin, err := KubeAPIServerBinary()
	if err == nil {
		_, err = exec.LookPath("etcd")
		if err != nil {
			err = errors.New("etcd not found in PATH (Debian package etcd-server)")
		}
	}
	if err != nil {
		if os.Getenv(testenv.E2EEnv) == "1" {
			t.Fatalf("API server test cannot run (%v) and %s=1 forbids skipping", err, testenv.E2EEnv)
		}
		t.Skipf("skipping API server test: %v (set %s=1 to make this a failure)", err, testenv.E2EEnv)
	}

	s := &APIServer{Dir: t.TempDir(), bin: bin, opts: opts}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kube-apiserver log (last lines):\n%s", tailFile(filepath.Join(s.Dir, "kube-apiserver.log"), 40))
		}
		s.Stop()
	})
	if err := s.start(); err != nil {
		t.Fatalf("start API server: %v", err)
	}
	return s
}

func (s *APIServer) start() error {
	if err := s.prepare(); err != nil {
		return err
	}
	var err error
	for attempt := 0; attempt < 3; attempt++ { // a free port can be taken before we bind it
		if err = s.startEtcd(); err == nil || !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	if err != nil {
		return err
	}
	for attempt := 0; attempt < 3; attempt++ {
		port, perr := freePorts(1)
		if perr != nil {
			return perr
		}
		s.setArgs(port[0])
		if err = s.startKube(); err == nil || !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	if err != nil {
		return err
	}
	if err := s.writeKubeconfig(); err != nil {
		return err
	}
	// The system namespaces are created by a controller inside
	// kube-apiserver, shortly after /readyz may already answer.
	return testenv.Eventually(30*time.Second, func() error {
		_, err := s.Client().CoreV1().Namespaces().Get(context.Background(), metav1.NamespaceDefault, metav1.GetOptions{})
		return err
	})
}

// prepare writes the admin token file and the service account signing key.
func (s *APIServer) prepare() error {
	var lines strings.Builder
	for _, u := range []struct {
		token        *string
		user, groups string
	}{
		{&s.Token, APIServerAdminUser, APIServerAdminGroup},
		{&s.ReaderToken, APIServerReaderUser, APIServerReaderGroup},
		{&s.NobodyToken, APIServerNobodyUser, ""},
	} {
		tok := make([]byte, 16)
		if _, err := rand.Read(tok); err != nil {
			return err
		}
		*u.token = hex.EncodeToString(tok)
		// token,user,uid,"group,..."
		fmt.Fprintf(&lines, "%s,%s,%s,%q\n", *u.token, u.user, u.user, u.groups)
	}
	if err := os.WriteFile(filepath.Join(s.Dir, "tokens.csv"), []byte(lines.String()), 0o600); err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
	return os.WriteFile(filepath.Join(s.Dir, "sa.key"), keyPEM, 0o600)
}

func (s *APIServer) startEtcd() error {
	ports, err := freePorts(2)
	if err != nil {
		return err
	}
	s.EtcdURL = fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	peer := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	data := filepath.Join(s.Dir, "etcd")
	if err := os.RemoveAll(data); err != nil { // a failed attempt's
		return err
	}
	p, err := startProcess("etcd", filepath.Join(s.Dir, "etcd.log"), etcdEnv(),
		"--name", "profi-test",
		"--data-dir", data,
		"--listen-client-urls", s.EtcdURL,
		"--advertise-client-urls", s.EtcdURL,
		"--listen-peer-urls", peer,
		"--initial-advertise-peer-urls", peer,
		"--initial-cluster", "profi-test="+peer,
		"--initial-cluster-state", "new",
		"--logger", "zap", "--log-outputs", "stderr",
	)
	if err != nil {
		return err
	}
	err = p.waitReady(30*time.Second, func() error {
		resp, err := http.Get(s.EtcdURL + "/health")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"health":"true"`) {
			return fmt.Errorf("etcd /health: HTTP %d %s", resp.StatusCode, body)
		}
		return nil
	})
	if err != nil {
		_ = p.stop(5 * time.Second)
		return fmt.Errorf("etcd: %w", err)
	}
	s.etcd = p
	return nil
}

// etcdEnv drops ETCD_* variables (Debian's /etc/default/etcd style
// configuration), which etcd would read as flags.
func etcdEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ETCD_") {
			env = append(env, kv)
		}
	}
	return env
}

func (s *APIServer) setArgs(port int) {
	addr := s.opts.Address
	if addr == "" {
		addr = "127.0.0.1"
	}
	s.URL = fmt.Sprintf("https://%s:%d", addr, port)
	certDir := filepath.Join(s.Dir, "certs")
	s.CAFile = filepath.Join(certDir, "apiserver.crt") // the serving cert followed by its CA
	sa := filepath.Join(s.Dir, "sa.key")
	s.args = []string{
		"--etcd-servers=" + s.EtcdURL,
		"--bind-address=" + addr,
		"--advertise-address=" + addr,
		"--secure-port=" + strconv.Itoa(port),
		// Self-signed serving certificate, generated on the first start
		// and reused by Restart, so the kubeconfig stays valid.
		"--cert-dir=" + certDir,
		"--token-auth-file=" + filepath.Join(s.Dir, "tokens.csv"),
		"--authorization-mode=RBAC",
		"--service-account-key-file=" + sa,
		"--service-account-signing-key-file=" + sa,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-cluster-ip-range=" + ServiceCIDR,
		"--profiling=false",
		// Every list and watch straight from etcd: after Restart the watch
		// cache waits for etcd progress notifications, which Debian's etcd
		// 3.4.23 sends late ("Too large resource version" for minutes), and
		// tests should not depend on that.
		"--watch-cache=false",
	}
	if s.opts.Address == "" {
		// No "kubernetes" Service endpoints to reconcile to a loopback address.
		s.args = append(s.args, "--endpoint-reconciler-type=none")
	} else {
		// Logs and exec through the kubelet at the node's address, not a
		// DNS lookup of the node's name.
		s.args = append(s.args, "--kubelet-preferred-address-types=InternalIP")
	}
	if !s.opts.ServiceAccounts {
		// No controller-manager creates the namespaces' default
		// ServiceAccount, which this plugin would require of every pod.
		s.args = append(s.args, "--disable-admission-plugins=ServiceAccount")
	}
}

func (s *APIServer) startKube() error {
	p, err := startProcess(s.bin, filepath.Join(s.Dir, "kube-apiserver.log"), os.Environ(), s.args...)
	if err != nil {
		return err
	}
	var httpc *http.Client
	err = p.waitReady(2*time.Minute, func() error {
		if httpc == nil {
			ca, err := os.ReadFile(s.CAFile)
			if err != nil {
				return err // not generated yet
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(ca) {
				return fmt.Errorf("no certificate in %s", s.CAFile)
			}
			if s.caData == nil { // Up reuses the first start's certificate
				s.caData = ca
			}
			httpc = &http.Client{
				Timeout:   5 * time.Second,
				Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}},
			}
		}
		req, err := http.NewRequest(http.MethodGet, s.URL+"/readyz", nil)
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+s.Token)
		resp, err := httpc.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			body, _ := io.ReadAll(resp.Body)
			return fmt.Errorf("/readyz: HTTP %d %s", resp.StatusCode, body)
		}
		return nil
	})
	if httpc != nil {
		httpc.CloseIdleConnections()
	}
	if err != nil {
		_ = p.stop(10 * time.Second)
		return fmt.Errorf("kube-apiserver: %w", err)
	}
	s.mu.Lock()
	s.kube = p
	s.mu.Unlock()
	return nil
}

func (s *APIServer) writeKubeconfig() error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["profi-test"] = &clientcmdapi.Cluster{Server: s.URL, CertificateAuthorityData: s.caData}
	cfg.AuthInfos[APIServerAdminUser] = &clientcmdapi.AuthInfo{Token: s.Token}
	cfg.Contexts["profi-test"] = &clientcmdapi.Context{Cluster: "profi-test", AuthInfo: APIServerAdminUser}
	cfg.CurrentContext = "profi-test"
	s.Kubeconfig = filepath.Join(s.Dir, "kubeconfig")
	return clientcmd.WriteToFile(*cfg, s.Kubeconfig)
}

// RESTConfig returns a new admin client configuration (no client-side
// rate limit).
func (s *APIServer) RESTConfig() *rest.Config {
	return &rest.Config{
		Host:            s.URL,
		BearerToken:     s.Token,
		TLSClientConfig: rest.TLSClientConfig{CAData: append([]byte(nil), s.caData...)},
		QPS:             -1,
	}
}

// Client returns an admin clientset (the same one on every call).
func (s *APIServer) Client() kubernetes.Interface {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.client == nil {
		c, err := kubernetes.NewForConfig(s.RESTConfig())
		if err != nil {
			panic(fmt.Sprintf("testutil: clientset: %v", err)) // only a malformed config fails
		}
		s.client = c
	}
	return s.client
}

// ServiceAccountConfig returns a client configuration that authenticates as
// the ServiceAccount namespace/name (created if missing) with a one-hour
// token from the TokenRequest API: what RBAC allows it is what a test's
// Roles and bindings grant, as for an agent running in a pod.
func (s *APIServer) ServiceAccountConfig(t testing.TB, namespace, name string) *rest.Config {
	t.Helper()
	ctx := context.Background()
	sas := s.Client().CoreV1().ServiceAccounts(namespace)
	_, err := sas.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create ServiceAccount %s/%s: %v", namespace, name, err)
	}
	cfg := s.RESTConfig()
	cfg.BearerToken = s.ServiceAccountToken(t, namespace, name)
	return cfg
}

// ServiceAccountToken returns a one-hour token of the ServiceAccount
// namespace/name (created if missing) from the TokenRequest API, bound to
// audiences (none: the API server's own audience, its issuer).
func (s *APIServer) ServiceAccountToken(t testing.TB, namespace, name string, audiences ...string) string {
	t.Helper()
	ctx := context.Background()
	sas := s.Client().CoreV1().ServiceAccounts(namespace)
	_, err := sas.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create ServiceAccount %s/%s: %v", namespace, name, err)
	}
	ttl := int64(3600)
	tr, err := sas.CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &ttl, Audiences: audiences},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for ServiceAccount %s/%s: %v", namespace, name, err)
	}
	return tr.Status.Token
}

// GrantClusterRole creates a ClusterRole name with rules and binds it
// (a ClusterRoleBinding of the same name) to subjects.
func (s *APIServer) GrantClusterRole(t testing.TB, name string, rules []rbacv1.PolicyRule, subjects ...rbacv1.Subject) {
	t.Helper()
	_, err := s.Client().RbacV1().ClusterRoles().Create(context.Background(),
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create ClusterRole %s: %v", name, err)
	}
	s.BindClusterRole(t, name, name, subjects...)
}

// BindClusterRole binds the existing ClusterRole role (e.g. the bootstrap
// system:auth-delegator) to subjects with a ClusterRoleBinding named binding.
func (s *APIServer) BindClusterRole(t testing.TB, binding, role string, subjects ...rbacv1.Subject) {
	t.Helper()
	_, err := s.Client().RbacV1().ClusterRoleBindings().Create(context.Background(), &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: binding},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects:   subjects,
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create ClusterRoleBinding %s: %v", binding, err)
	}
}

// WriteKubeconfig writes a kubeconfig for cfg's server, CA and bearer token
// (from RESTConfig or ServiceAccountConfig) into a new file in t's temp dir
// and returns its path.
func WriteKubeconfig(t testing.TB, cfg *rest.Config) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken}
	kc.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	kc.CurrentContext = "c"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatalf("write kubeconfig: %v", err)
	}
	return path
}

// Down stops kube-apiserver (SIGTERM, SIGKILL after 5 s: open watches
// hold a graceful shutdown for a minute), leaving etcd running: clients
// see the server go away until Up.
func (s *APIServer) Down(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	p := s.kube
	s.kube = nil
	s.mu.Unlock()
	if p == nil {
		t.Fatal("APIServer.Down: kube-apiserver is not running")
	}
	if err := p.stop(5 * time.Second); err != nil {
		t.Logf("kube-apiserver exit: %v", err)
	}
}

// Up starts kube-apiserver again after Down, on the same port with the same
// etcd, certificate and tokens, and waits until it is ready.
func (s *APIServer) Up(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	running := s.kube != nil
	s.mu.Unlock()
	if running {
		t.Fatal("APIServer.Up: kube-apiserver is already running")
	}
	if err := s.startKube(); err != nil {
		t.Fatalf("restart kube-apiserver: %v", err)
	}
}

// Restart stops kube-apiserver and starts it again on the same port with
// the same etcd (Down then Up), for testing clients that reconnect.
func (s *APIServer) Restart(t testing.TB) {
	t.Helper()
	s.Down(t)
	s.Up(t)
}

// Stop stops kube-apiserver and etcd; it is idempotent and runs on the
// test's cleanup anyway.
func (s *APIServer) Stop() {
	s.mu.Lock()
	kube, etcd := s.kube, s.etcd
	s.kube, s.etcd = nil, nil
	s.mu.Unlock()
	if kube != nil {
		_ = kube.stop(30 * time.Second)
	}
	if etcd != nil {
		_ = etcd.stop(10 * time.Second)
	}
}

// process is a child whose output goes to a log file.
type process struct {
	name string
	log  string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

func startProcess(bin, logPath string, env []string, args ...string) (*process, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer f.Close() // the child has its own copy
	fmt.Fprintf(f, "==== %s %s\n", time.Now().Format(time.RFC3339), strings.Join(append([]string{bin}, args...), " "))
	p := &process{name: filepath.Base(bin), log: logPath, done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = env
	p.cmd.Stdout = f
	p.cmd.Stderr = f
	// Killed with the test binary, even when a timeout panics it.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	return p, nil
}

// waitReady polls ready every 100 ms until it returns nil, the process
// exits or timeout passes.
func (p *process) waitReady(timeout time.Duration, ready func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := ready()
		if err == nil {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited before ready: %v\n%s", p.name, p.err, tailFile(p.log, 30))
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %v: %v\n%s", p.name, timeout, err, tailFile(p.log, 30))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stop sends SIGTERM, then SIGKILL after grace, and returns the exit error
// of an unclean exit.
func (p *process) stop(grace time.Duration) error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	return p.err
}

// freePorts returns n distinct free loopback TCP ports.
func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer ln.Close() // held until all are chosen, so they differ
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// tailFile returns the last n lines of a file, or why it cannot.
func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
