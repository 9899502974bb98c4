package check

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/testutil"
	"github.com/profi-dev/profi/internal/testutil/certtest"
	"github.com/profi-dev/profi/internal/testutil/kubetest"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// childEnv makes the test binary run `profi check` itself (for the
// subprocess tests that drop privileges).
const childEnv = "PROFI_CHECK_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(seccompChildEnv) != "" {
		os.Exit(seccompChild())
	}
	if os.Getenv(childEnv) == "1" {
		args := os.Args[1:]
		for i, a := range args {
			if a == "--" {
				args = args[i+1:]
				break
			}
		}
		os.Exit(Main(context.Background(), args, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// runMain runs Main in-process and decodes its JSON report.
func runMain(t *testing.T, args ...string) (Report, int) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := Main(context.Background(), append([]string{"--output", "json", "--timeout", "3s"}, args...), &out, &errOut)
	var r Report
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("decode report: %v\nstdout %s\nstderr %s", err, out.String(), errOut.String())
	}
	return r, code
}

func result(t *testing.T, r Report, name string) Result {
	t.Helper()
	for _, res := range r.Results {
		if res.Name == name {
			return res
		}
	}
	t.Fatalf("no %q check in %+v", name, r.Results)
	return Result{}
}

// want asserts a check's status and that its detail and fix say what
// matters.
func want(t *testing.T, r Report, name string, status Status, detail, fix string) {
	t.Helper()
	res := result(t, r, name)
	if res.Status != status || !strings.Contains(res.Detail, detail) || !strings.Contains(res.Fix, fix) {
		t.Errorf("%s = %+v, want status %s, detail containing %q, fix containing %q", name, res, status, detail, fix)
	}
}

// TestPassesHere: as root on a BPF-capable kernel every blocking check
// passes; the probe counted exactly the calls made.
func TestPassesHere(t *testing.T) {
	testutil.RequireBPF(t)
	r, code := runMain(t, "--disable-nvml")
	for _, res := range r.Results {
		if res.Status == Fail {
			t.Errorf("failed: %+v", res)
		}
	}
	if code != 0 || !r.OK {
		t.Errorf("exit %d, ok %v, want 0 and true", code, r.OK)
	}
	want(t, r, "uprobe_attach", OK, fmt.Sprintf("counted %d of %d calls", probeCalls, probeCalls), "")
	want(t, r, "bpf_load", OK, "loaded", "")
	want(t, r, "procfs", OK, "host PID namespace", "")
}

// TestNoPrivileges runs check as root without any capability (setpriv
// empties the bounding set, so exec grants none).
func TestNoPrivileges(t *testing.T) {
	testutil.RequireBPF(t)
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		if os.Getenv(testenv.E2EEnv) == "1" {
			t.Fatalf("setpriv (util-linux) not found: %v", err)
		}
		t.Skipf("setpriv (util-linux) not found: %v", err)
	}
	cmd := exec.Command(setpriv, "--inh-caps=-all", "--bounding-set=-all", os.Args[0], "--", "--output", "json", "--disable-nvml")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("exit: %v, want status 1\nstdout %s\nstderr %s", err, out.String(), errOut.String())
	}
	var r Report
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatal(err)
	}
	want(t, r, "capabilities", Fail, "effective 0x0: has none; lacks CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE, CAP_SYS_ADMIN", "CAP_BPF, CAP_PERFMON and CAP_SYS_PTRACE")
	want(t, r, "bpf_load", Fail, "operation not permitted", "CAP_BPF and CAP_PERFMON")
	if r.OK {
		t.Error("report ok without privileges")
	}
}

// TestChartCapabilities runs check with exactly the chart's capabilities
// (CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE; root, nothing else). Where the
// kernel has uprobe_multi links the probe goes through one, as the agent's
// do, and passes. Classic uprobes (--no-uprobe-multi, the path of kernels
// before 6.6) need CAP_SYS_ADMIN on kernels with the CVE-2025-38466 fix:
// there the check fails and says so; on older kernels it passes.
func TestChartCapabilities(t *testing.T) {
	testutil.RequireBPF(t)
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Fatalf("setpriv (util-linux) not found: %v", err)
	}
	const caps = "-all,+bpf,+perfmon,+sys_ptrace"
	run := func(args ...string) (Report, int) {
		cmd := exec.Command(setpriv, append([]string{"--inh-caps=" + caps, "--ambient-caps=" + caps, "--bounding-set=" + caps,
			os.Args[0], "--", "--output", "json", "--disable-nvml"}, args...)...)
		cmd.Env = append(os.Environ(), childEnv+"=1")
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		code := 0
		if err := cmd.Run(); err != nil {
			ee, ok := err.(*exec.ExitError)
			if !ok {
				t.Fatalf("%v\nstderr %s", err, errOut.String())
			}
			code = ee.ExitCode()
		}
		var r Report
		if err := json.Unmarshal(out.Bytes(), &r); err != nil {
			t.Fatalf("decode report: %v\nstdout %s\nstderr %s", err, out.String(), errOut.String())
		}
		return r, code
	}
	r, code := run()
	want(t, r, "capabilities", OK, "has CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE; lacks CAP_SYS_ADMIN", "")
	if bpfobj.HaveUprobeMulti() == nil {
		want(t, r, "uprobe_attach", OK, fmt.Sprintf("a uprobe_multi link (the agent's attach path here) on profi's own %s counted %d of %d calls", probeTargetSymbol, probeCalls, probeCalls), "")
		if code != 0 || !r.OK {
			t.Errorf("exit %d ok %v with the chart's capabilities on a kernel with uprobe_multi: %+v", code, r.OK, r.Results)
		}
	}
	r, code = run("--no-uprobe-multi")
	res := result(t, r, "uprobe_attach")
	switch res.Status {
	case OK:
		want(t, r, "uprobe_attach", OK, "a classic uprobe (the agent's attach path here)", "")
		t.Logf("classic uprobes attach without CAP_SYS_ADMIN on this kernel (no CVE-2025-38466 fix)")
	default:
		want(t, r, "uprobe_attach", Fail, "permission denied", "CVE-2025-38466")
		if code != 1 {
			t.Errorf("exit %d with a failed check, want 1", code)
		}
		t.Logf("classic uprobes need CAP_SYS_ADMIN on this kernel: %s", res.Detail)
	}
}

// TestFeatureForcedOff: the hidden knob (flag and env var) reports a
// feature absent, with its consequence and fix.
func TestFeatureForcedOff(t *testing.T) {
	t.Setenv("PROFI_CHECK_PRETEND_MISSING", "btf")
	r, code := runMain(t, "--disable-nvml", "--pretend-missing", "uprobe_multi,uprobe_pmu,tracepoints")
	if code != 1 || r.OK {
		t.Errorf("exit %d ok %v, want 1 and false", code, r.OK)
	}
	want(t, r, "uprobe_multi", Warn, "no uprobe_multi links (forced off): every library falls back to one classic uprobe per function", "kernel 6.6")
	want(t, r, "btf", Fail, "without CONFIG_DEBUG_INFO_BTF", "CONFIG_DEBUG_INFO_BTF=y")
	want(t, r, "uprobe_pmu", Fail, "no perf uprobe PMU", "CONFIG_UPROBE_EVENTS=y")
	if os.Geteuid() == 0 {
		want(t, r, "uprobe_attach", Fail, "forced off", "CONFIG_UPROBE_EVENTS")
		want(t, r, "tracepoints", Warn, "forced off", "CONFIG_TRACEPOINTS")
	}
}

// TestUretprobeSyscallArch: the uretprobe syscall exists on x86-64 only;
// on arm64 the check never claims it, not even by kernel version (as it
// would where kallsyms is unreadable), and says there is nothing to fix.
func TestUretprobeSyscallArch(t *testing.T) {
	env := &Env{}
	if haveUretprobeSyscall(env, "arm64", 6, 12) {
		t.Error("uretprobe syscall claimed on arm64 6.12")
	}
	r := Report{Results: []Result{uretprobeSyscallResult("arm64", false)}}
	want(t, r, "uretprobe_syscall", Warn, "no uretprobe syscall on arm64", "x86-64 only")
	r = Report{Results: []Result{uretprobeSyscallResult("amd64", false)}}
	want(t, r, "uretprobe_syscall", Warn, "no uretprobe syscall:", "kernel 6.11 or newer")
}

func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// TestAPIServerDown: KUBECONFIG names an API server on a closed port.
func TestAPIServerDown(t *testing.T) {
	addr := closedPort(t)
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	err := os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://`+addr+`", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBECONFIG", kc)
	r, code := runMain(t, "--disable-nvml", "--node-name", "node-1")
	if code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	want(t, r, "kubernetes", Fail, "https://"+addr+" (KUBECONFIG "+kc+") unreachable", "check that the API server is up")
}

// TestOTLPDown: nothing listens at the OTLP endpoint.
func TestOTLPDown(t *testing.T) {
	addr := closedPort(t)
	r, code := runMain(t, "--disable-nvml", "--otlp-endpoint", "http://"+addr)
	if code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	want(t, r, "otlp", Fail, "cannot connect to "+addr, "start the collector")
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("port taken meanwhile: %v", err)
	}
	defer l.Close()
	r, _ = runMain(t, "--disable-nvml", "--otlp-endpoint", "http://"+addr)
	want(t, r, "otlp", OK, "TCP connect to "+addr+" ok", "")
}

type certFiles struct{ cert, key string }

// writeCert writes a certificate valid from notBefore to notAfter and a
// key: its own, or keyFrom (another certificate's key: a mismatch).
func writeCert(t *testing.T, dir, name string, notBefore, notAfter time.Time, keyFrom []byte) (certFiles, []byte) {
	t.Helper()
	kp := certtest.NewCA(t, name+" CA").Issue(t, certtest.CertOptions{CommonName: name, NotBefore: notBefore, NotAfter: notAfter})
	key := kp.KeyPEM
	if keyFrom != nil {
		key = keyFrom
	}
	f := certFiles{filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")}
	if err := os.WriteFile(f.cert, kp.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.key, key, 0o600); err != nil {
		t.Fatal(err)
	}
	return f, kp.KeyPEM
}

// TestTLSFiles: good, expired, expiring, mismatched and unreadable files.
func TestTLSFiles(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	good, goodKey := writeCert(t, dir, "good", now.Add(-time.Hour), now.Add(90*24*time.Hour), nil)
	expired, _ := writeCert(t, dir, "expired", now.Add(-48*time.Hour), now.Add(-time.Hour), nil)
	soon, _ := writeCert(t, dir, "soon", now.Add(-time.Hour), now.Add(48*time.Hour), nil)
	mismatch, _ := writeCert(t, dir, "mismatch", now.Add(-time.Hour), now.Add(time.Hour*24*90), goodKey)
	missing := filepath.Join(dir, "missing.pem")
	notPEM := filepath.Join(dir, "ca.txt")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	tls := func(c certFiles, mode, ca string) []string {
		args := []string{"--disable-nvml", "--metrics-tls-mode", mode, "--metrics-tls-cert", c.cert, "--metrics-tls-key", c.key}
		if ca != "" {
			args = append(args, "--metrics-tls-client-ca", ca)
		}
		return args
	}
	tests := []struct {
		name           string
		args           []string
		check          string
		status         Status
		detail, fix    string
		wantExitStatus int
	}{
		{"good", tls(good, "mtls", good.cert), "metrics_tls", OK, "(CN=good) valid until", "", -1},
		{"good client CA", tls(good, "mtls", good.cert), "metrics_tls_client_ca", OK, "1 CA certificate(s), valid", "", -1},
		{"expired", tls(expired, "server", ""), "metrics_tls", Fail, "(CN=expired) expired at", "renew the certificate", 1},
		{"expiring", tls(soon, "server", ""), "metrics_tls", Warn, "in less than 7 days", "renew it soon", -1},
		{"key mismatch", tls(mismatch, "server", ""), "metrics_tls", Fail, "private key does not match public key", "the key must be the private key of the certificate", 1},
		{"unreadable key", tls(certFiles{good.cert, missing}, "server", ""), "metrics_tls", Fail, "--metrics-tls-key " + missing + ": open " + missing + ": no such file or directory", "mount the Secret", 1},
		{"unreadable cert", tls(certFiles{dir, good.key}, "server", ""), "metrics_tls", Fail, "--metrics-tls-cert " + dir + ": read " + dir + ": is a directory", "mount the Secret", 1},
		{"client CA not PEM", tls(good, "mtls", notPEM), "metrics_tls_client_ca", Fail, "holds no PEM certificate", "replace it with a PEM CA bundle", 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, code := runMain(t, tc.args...)
			want(t, r, tc.check, tc.status, tc.detail, tc.fix)
			if tc.wantExitStatus >= 0 && code != tc.wantExitStatus {
				t.Errorf("exit %d, want %d", code, tc.wantExitStatus)
			}
		})
	}
}

// TestKubernetesRBAC runs against a real kube-apiserver: a service
// account without a binding is denied pods list/watch; with a ClusterRole
// binding it is allowed; bearer auth also needs tokenreviews create.
func TestKubernetesRBAC(t *testing.T) {
	s := kubetest.StartAPIServer(t)
	cfg := s.ServiceAccountConfig(t, "default", "profi")
	t.Setenv("KUBECONFIG", kubetest.WriteKubeconfig(t, cfg))

	r, code := runMain(t, "--disable-nvml", "--node-name", "node-1")
	if code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	want(t, r, "kubernetes", OK, "reachable, version v", "")
	want(t, r, "kubernetes_rbac", Fail, "the agent may not list pods, watch pods", "ClusterRole with pods get/list/watch")

	ctx := context.Background()
	c := s.Client()
	_, err := c.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "profi-check"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "profi-check"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "profi-check"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: "default", Name: "profi"}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// RBAC answers from an informer cache: wait until the binding is seen.
	if err := testenv.Eventually(30*time.Second, func() error {
		r, _ = runMain(t, "--disable-nvml", "--node-name", "node-1")
		if res := result(t, r, "kubernetes_rbac"); res.Status != OK {
			return fmt.Errorf("%+v", res)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want(t, r, "kubernetes_rbac", OK, "allowed: list pods, watch pods", "")
}
