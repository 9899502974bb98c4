package e2e

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/profi-dev/profi/internal/testutil"
	"github.com/profi-dev/profi/internal/testutil/certtest"
	"github.com/profi-dev/profi/internal/testutil/kubetest"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// secureAgent is the profi binary serving HTTPS only.
type secureAgent struct {
	addr   string
	client *http.Client // trusts the server CA, presents a client certificate
	logs   *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startSecureAgent runs profi with args and env, and waits until /ready
// answers 200 over HTTPS.
func startSecureAgent(t *testing.T, client *http.Client, env []string, args ...string) *secureAgent {
	t.Helper()
	testutil.RequireBPF(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &secureAgent{addr: ln.Addr().String(), client: client, logs: &syncBuffer{}}
	ln.Close()
	cmd := exec.Command(agentBin, append([]string{"--listen", a.addr, "--refresh-interval", "1", "--cudart", "/nonexistent/libcudart.so"}, args...)...)
	cmd.Stdout, cmd.Stderr = a.logs, a.logs
	cmd.Env = append(append(os.Environ(), "PROFI_LOG_LEVEL=debug"), env...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("agent did not exit cleanly: %v", err)
			}
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			if err := <-done; err != nil {
				t.Logf("killed agent: %v", err)
			}
			t.Error("agent did not stop within 10 s")
		}
		if t.Failed() {
			t.Logf("agent log:\n%s", a.logs.String())
		}
	})
	err = testenv.Eventually(30*time.Second, func() error {
		select {
		case err := <-done:
			done <- err
			return fmt.Errorf("agent exited: %v", err)
		default:
		}
		code, _, err := a.get("/ready")
		if err == nil && code != http.StatusOK {
			err = fmt.Errorf("/ready: HTTP %d", code)
		}
		return err
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, a.logs.String())
	}
	return a
}

func (a *secureAgent) get(path string) (int, []byte, error) {
	resp, err := a.client.Get("https://" + a.addr + path)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, body, err
}

// waitAttached waits until /status (client certificate) lists pid.
func (a *secureAgent) waitAttached(t *testing.T, pid int) {
	t.Helper()
	err := testenv.Eventually(15*time.Second, func() error {
		code, body, err := a.get("/status")
		if err != nil {
			return err
		}
		if code != http.StatusOK {
			return fmt.Errorf("/status: HTTP %d", code)
		}
		var st status
		if err := json.Unmarshal(body, &st); err != nil {
			return err
		}
		for _, l := range st.AttachedLibraries {
			for _, p := range l.PIDs {
				if p == pid {
					return nil
				}
			}
		}
		return fmt.Errorf("pid %d not attached", pid)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// startPrometheusWith runs a real Prometheus with the given configuration.
func startPrometheusWith(t *testing.T, config string) *prometheusServer {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		if os.Getenv(testenv.E2EEnv) == "1" {
			t.Fatalf("prometheus not installed (apt-get install prometheus): %v", err)
		}
		t.Skip("prometheus not installed")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+addr)
	logs := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("prometheus log:\n%s", logs.String())
		}
	})
	return &prometheusServer{url: "http://" + addr}
}

// A real Prometheus scrapes profi over HTTPS: one job with a client
// certificate (mTLS) and a bearer token, one with the bearer token only
// (a ServiceAccount token from the real API server, for profi's
// audience, authorised by RBAC through a SubjectAccessReview), one with
// neither. The counts it stores equal the workload's ground truth, and
// profi's own auth counters equal Prometheus' count of its scrapes.
func TestPrometheusScrapesOverMTLSWithBearer(t *testing.T) {
	testutil.RequireBPF(t)
	api := kubetest.StartAPIServer(t)
	// The agent's identity: a ServiceAccount that may create TokenReviews
	// and SubjectAccessReviews, as the chart binds it.
	api.BindClusterRole(t, "profi-auth-delegator", "system:auth-delegator",
		rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: "profi", Namespace: "default"})
	agentKubeconfig := kubetest.WriteKubeconfig(t, api.ServiceAccountConfig(t, "default", "profi"))
	// The scraper's identity: may get /metrics.
	api.GrantClusterRole(t, "profi-metrics-reader",
		[]rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}},
		rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: "prometheus", Namespace: "default"})
	token := api.ServiceAccountToken(t, "default", "prometheus", "profi")

	serverCA, clientCA := certtest.NewCA(t, "server-ca"), certtest.NewCA(t, "client-ca")
	server, scraper, tester := serverCA.Server(t), clientCA.Client(t, "prometheus"), clientCA.Client(t, "e2e-test")
	dir := t.TempDir()
	files := map[string][]byte{
		"tls.crt": server.CertPEM, "tls.key": server.KeyPEM, "client-ca.crt": clientCA.PEM, "server-ca.crt": serverCA.PEM,
		"prom.crt": scraper.CertPEM, "prom.key": scraper.KeyPEM, "token": []byte(token),
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	path := func(name string) string { return filepath.Join(dir, name) }

	testerCert := tester.TLSCertificate(t)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: serverCA.Pool(), Certificates: []tls.Certificate{testerCert}}}
	t.Cleanup(tr.CloseIdleConnections)
	a := startSecureAgent(t, &http.Client{Transport: tr, Timeout: 10 * time.Second},
		[]string{"KUBECONFIG=" + agentKubeconfig},
		"--metrics-tls-mode", "mtls", "--metrics-tls-cert", path("tls.crt"), "--metrics-tls-key", path("tls.key"),
		"--metrics-tls-client-ca", path("client-ca.crt"), "--metrics-auth-mode", "mtls-or-bearer",
		"--metrics-auth-audience", "profi", "--metrics-auth-authorize",
		// One TokenReview for the whole test: the count below is exact.
		"--metrics-auth-cache-ttl", "3600")

	w := startWorkload(t, fixtures.Workload, defaultArgs)
	a.waitAttached(t, w.PID)
	gt := runPhase(t, w)

	job := func(name, tlsExtra, authz string) string {
		return fmt.Sprintf("- job_name: %s\n  scheme: https\n  tls_config: {ca_file: %q%s}\n%s  static_configs: [{targets: [%q]}]\n",
			name, path("server-ca.crt"), tlsExtra, authz, a.addr)
	}
	bearer := fmt.Sprintf("  authorization: {credentials_file: %q}\n", path("token"))
	cfg := "global: {scrape_interval: 1s, evaluation_interval: 1s}\nscrape_configs:\n" +
		job("profi-mtls", fmt.Sprintf(", cert_file: %q, key_file: %q", path("prom.crt"), path("prom.key")), bearer) +
		job("profi-bearer", "", bearer) +
		job("profi-anonymous", "", "")
	p := startPrometheusWith(t, cfg)

	// Enough scrapes of each job stored (a precondition, not the check).
	err := testenv.Eventually(60*time.Second, func() error {
		res, err := p.query(`count_over_time(up[1h])`)
		if err != nil {
			return err
		}
		n := map[string]float64{}
		for _, s := range res {
			n[s.labels["job"]] = s.value
		}
		for _, j := range []string{"profi-mtls", "profi-bearer", "profi-anonymous"} {
			if n[j] < 3 {
				return fmt.Errorf("scrapes stored per job: %v", n)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	want := expected([]*testutil.GroundTruth{gt})
	families := map[string][]string{
		"profi_cuda_calls_total":         {"operation", "pid", "stream"},
		"profi_cuda_errors_total":        {"operation", "pid", "error_code"},
		"profi_cuda_memcpy_bytes_total":  {"direction", "pid"},
		"profi_cuda_malloc_bytes_total":  {"pid"},
		"profi_cuda_active_memory_bytes": {"pid"},
	}
	for _, j := range []string{"profi-mtls", "profi-bearer"} {
		for fam, labels := range families {
			wantFam := values{}
			for k, v := range want {
				if strings.HasPrefix(k, fam+"{") {
					wantFam[k] = v
				}
			}
			err := testenv.Eventually(15*time.Second, func() error {
				res, err := p.query(fmt.Sprintf(`%s{job=%q,pid="%d"}`, fam, j, w.PID))
				if err != nil {
					return err
				}
				got := values{}
				for _, s := range res {
					got[key(fam, pick(s.labels, labels)...)] += s.value
				}
				if d := diff(wantFam, got); d != "" {
					return fmt.Errorf("job %s, %s stored by Prometheus differs from ground truth:\n%s", j, fam, d)
				}
				return nil
			})
			if err != nil {
				t.Error(err)
			}
		}
	}

	// Exact auth accounting, each in one instant query (one evaluation
	// time): only the bearer job authenticates by token, so profi's bearer
	// successes equal that job's scrapes; its token was reviewed once
	// (cache TTL 1 h) and every other scrape hit the cache.
	for expr, wantVal := range map[string]float64{
		`profi_system_http_auth_success_total{job="profi-bearer",method="bearer"} - on() count_over_time(up{job="profi-bearer"}[1h])`:         0,
		`profi_system_http_tokenreview_cache_total{job="profi-bearer",result="miss"}`:                                                         1,
		`profi_system_http_tokenreview_cache_total{job="profi-bearer",result="hit"} - on() (count_over_time(up{job="profi-bearer"}[1h]) - 1)`: 0,
		`sum_over_time(up{job="profi-mtls"}[1h]) - on() count_over_time(up{job="profi-mtls"}[1h])`:                                            0,
		`sum_over_time(up{job="profi-bearer"}[1h]) - on() count_over_time(up{job="profi-bearer"}[1h])`:                                        0,
		// Without credentials every scrape is refused (401).
		`max_over_time(up{job="profi-anonymous"}[1h])`: 0,
		`profi_system_http_tls_handshakes_total{job="profi-mtls",result="bad_cert"} + on() profi_system_http_tls_handshakes_total{job="profi-mtls",result="error"}`: 0,
	} {
		res, err := p.query(expr)
		if err != nil {
			t.Fatal(err)
		}
		if len(res) != 1 || res[0].value != wantVal {
			t.Errorf("%s = %+v, want %v", expr, res, wantVal)
		}
	}
}
