package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/profi-dev/profi/internal/testutil/kubetest"
	"github.com/profi-dev/profi/internal/testutil/testenv"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	yamlutil "k8s.io/apimachinery/pkg/util/yaml"
)

// podman runs buildah and podman with a configuration and storage of their
// own under one directory, never the machine's: containers.conf (runtime
// runc, cgroupfs, no events, default_ulimits = [] because these VMs refuse
// runc's setrlimit), storage.conf (vfs: no mounts left behind) and an empty
// registries.conf.
type podman struct {
	dir string
	env []string // CONTAINERS_* for buildah and podman
}

// requirePodman returns a private podman, or skips (fails under PROFI_E2E=1)
// when buildah, podman or runc is missing.
func requirePodman(t *testing.T) *podman {
	t.Helper()
	for _, tool := range []string{"podman", "buildah", "runc"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv(testenv.E2EEnv) == "1" {
				t.Fatalf("%s not found (Debian packages podman, buildah, runc; scripts/test-setup.sh installs them) and %s=1 forbids skipping", tool, testenv.E2EEnv)
			}
			t.Skipf("skipping: %s not found (Debian packages podman, buildah, runc; set %s=1 to make this a failure)", tool, testenv.E2EEnv)
		}
	}
	// Short: podman's exit command (container cleanup, which records the
	// exit code) refuses a runroot longer than 50 characters, and `podman
	// run` then waits 20 s for an exit code that never comes.
	dir, err := os.MkdirTemp("", "profi-podman-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if run := filepath.Join(dir, "run"); len(run) > 50 {
		t.Fatalf("podman runroot %s is longer than 50 characters (TMPDIR %s)", run, os.TempDir())
	}
	files := map[string]string{
		"containers.conf": fmt.Sprintf(`[containers]
default_ulimits = []
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "none"
tmp_dir = %q
`, filepath.Join(dir, "tmp")),
		"storage.conf": fmt.Sprintf(`[storage]
driver = "vfs"
graphroot = %q
runroot = %q
`, filepath.Join(dir, "storage"), filepath.Join(dir, "run")),
		"registries.conf": "unqualified-search-registries = []\n",
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return &podman{dir: dir, env: []string{
		"CONTAINERS_CONF=" + filepath.Join(dir, "containers.conf"),
		"CONTAINERS_STORAGE_CONF=" + filepath.Join(dir, "storage.conf"),
		"CONTAINERS_REGISTRIES_CONF=" + filepath.Join(dir, "registries.conf"),
	}}
}

// command is argv run with the private configuration (through env(1), so a
// signal to the command reaches podman itself).
func (p *podman) command(argv ...string) []string {
	return append(append([]string{"env"}, p.env...), argv...)
}

// run runs argv and returns its combined output and exit code (-1 when it
// could not run).
func (p *podman) run(ctx context.Context, argv ...string) (string, int) {
	full := p.command(argv...)
	cmd := exec.CommandContext(ctx, full[0], full[1:]...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	code := 0
	if err != nil {
		code = -1
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
	}
	return out.String(), code
}

// must runs argv and fails the test unless it exits 0.
func (p *podman) must(t *testing.T, argv ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, code := p.run(ctx, argv...)
	if code != 0 {
		t.Fatalf("%s: exit %d\n%s", strings.Join(argv, " "), code, out)
	}
	return out
}

// buildImage builds the image from bin with scripts/build-image.sh.
func (p *podman) buildImage(t *testing.T, bin, tag string) {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	out := p.must(t, filepath.Join(root, "scripts/build-image.sh"), "--binary", bin, "--tag", tag, "--version", "e2e")
	t.Logf("scripts/build-image.sh: %s", strings.TrimSpace(out))
}

// seccompProfile returns the path of podman's default seccomp profile
// (containers-common: what RuntimeDefault means under podman and CRI-O).
func (p *podman) seccompProfile(t *testing.T) string {
	t.Helper()
	return strings.TrimSpace(p.must(t, "podman", "info", "--format", "{{.Host.Security.SECCOMPProfilePath}}"))
}

// containerdRuntimeDefault writes podman's default seccomp profile with the
// rules for bpf and perf_event_open replaced by containerd's (1.6.9+; Docker
// 23+ has the same): allowed with CAP_BPF (bpf) or CAP_PERFMON
// (perf_event_open), or CAP_SYS_ADMIN; EPERM otherwise. containers-common
// allows both only with CAP_SYS_ADMIN. The rest of the profile is podman's.
func containerdRuntimeDefault(t *testing.T, podmanProfile, dir string) string {
	t.Helper()
	b, err := os.ReadFile(podmanProfile)
	if err != nil {
		t.Fatal(err)
	}
	var prof map[string]any
	if err := json.Unmarshal(b, &prof); err != nil {
		t.Fatalf("%s: %v", podmanProfile, err)
	}
	gated := []string{"bpf", "perf_event_open"}
	var rules []any
	removed := 0
	for _, r := range prof["syscalls"].([]any) {
		rule := r.(map[string]any)
		names, _ := rule["names"].([]any)
		var kept []any
		for _, n := range names {
			if slices.Contains(gated, n.(string)) {
				removed++
				continue
			}
			kept = append(kept, n)
		}
		if len(names) > 0 && len(kept) == 0 {
			continue
		}
		if len(names) > 0 {
			rule["names"] = kept
		}
		rules = append(rules, rule)
	}
	if removed == 0 {
		t.Fatalf("%s has no rule for bpf or perf_event_open: the transformation does not apply", podmanProfile)
	}
	allow := func(name, capability string) map[string]any {
		return map[string]any{"names": []string{name}, "action": "SCMP_ACT_ALLOW", "includes": map[string]any{"caps": []string{capability}}}
	}
	for _, r := range []map[string]any{
		allow("bpf", "CAP_BPF"),
		allow("perf_event_open", "CAP_PERFMON"),
		{"names": gated, "action": "SCMP_ACT_ALLOW", "includes": map[string]any{"caps": []string{"CAP_SYS_ADMIN"}}, "excludes": map[string]any{"caps": []string{"CAP_BPF", "CAP_PERFMON"}}},
		{"names": gated, "action": "SCMP_ACT_ERRNO", "errnoRet": 1, "excludes": map[string]any{"caps": []string{"CAP_SYS_ADMIN", "CAP_BPF", "CAP_PERFMON"}}},
	} {
		rules = append(rules, r)
	}
	prof["syscalls"] = rules
	out, err := json.MarshalIndent(prof, "", "\t")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "containerd-runtime-default.json")
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// renderPod renders the chart with helm template and returns the
// DaemonSet's pod spec.
func renderPod(t *testing.T, set ...string) *corev1.PodSpec {
	t.Helper()
	stdout := bytes.NewReader(helmTemplate(t, "templates/daemonset.yaml", set...))
	var obj map[string]any
	if err := yamlutil.NewYAMLOrJSONDecoder(stdout, 4096).Decode(&obj); err != nil {
		t.Fatalf("decode DaemonSet: %v", err)
	}
	raw, _, err := unstructured.NestedMap(obj, "spec", "template", "spec")
	if err != nil || raw == nil {
		t.Fatalf("DaemonSet without spec.template.spec: %v", err)
	}
	var spec corev1.PodSpec
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(raw, &spec, true); err != nil {
		t.Fatalf("DaemonSet pod spec: %v", err)
	}
	return &spec
}

// helmTemplate renders one template of the chart with helm template (the
// given --set values; the Prometheus Operator's API present) and returns
// it; without helm it skips, or fails under PROFI_E2E=1.
func helmTemplate(t *testing.T, template string, set ...string) []byte {
	t.Helper()
	helm, err := kubetest.HelmBinary()
	if err != nil {
		if os.Getenv(testenv.E2EEnv) == "1" {
			t.Fatalf("%v and %s=1 forbids skipping", err, testenv.E2EEnv)
		}
		t.Skipf("skipping: %v", err)
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	kube, err := kubetest.KubeVersion()
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"template", "profi", filepath.Join(root, "deploy/profi"), "--namespace", "monitoring", "--kube-version", kube,
		"--api-versions", "monitoring.coreos.com/v1/PrometheusRule", "--show-only", template}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(helm, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.Bytes()
}

// Capability bits (linux/capability.h) of the names a chart may add.
var capBits = map[string]uint{"SYS_PTRACE": 19, "SYS_ADMIN": 21, "SYSLOG": 34, "PERFMON": 38, "BPF": 39}

// capMask is the effective set of a container given the chart's add list
// (with drop ALL).
func capMask(t *testing.T, add []corev1.Capability) uint64 {
	t.Helper()
	var m uint64
	for _, c := range add {
		bit, ok := capBits[string(c)]
		if !ok {
			t.Fatalf("capability %s: add its bit to capBits", c)
		}
		m |= 1 << bit
	}
	return m
}

// unhandled lists the non-zero fields of a struct not named in handled.
func unhandled(v any, handled map[string]string) []string {
	var out []string
	rv := reflect.ValueOf(v)
	for i := range rv.NumField() {
		name := rv.Type().Field(i).Name
		if _, ok := handled[name]; !ok && !rv.Field(i).IsZero() {
			out = append(out, name)
		}
	}
	return out
}

// Fields of the pod spec and containers the translation reads, or leaves
// out and why. Any other field the chart sets fails the test: a runtime
// constraint the chart grows must be translated (or explained) here.
var (
	podFields = map[string]string{
		"HostPID":                       "--pid=host",
		"TerminationGracePeriodSeconds": "--stop-timeout: how long a stop waits before SIGKILL, the agent's teardown budget",
		"Volumes":                       "hostPath volumes, mounted by volumeMounts",
		"InitContainers":                "run first, as the kubelet does",
		"Containers":                    "",
		"ServiceAccountName":            "left out: credentials for the API server, which this test does not run",
		"RuntimeClassName":              "left out: the NVIDIA runtime injects NVML; no GPU here",
		"PriorityClassName":             "left out: scheduling",
		"NodeSelector":                  "left out: scheduling",
		"Tolerations":                   "left out: scheduling",
		"Affinity":                      "left out: scheduling",
	}
	containerFields = map[string]string{
		"Name":            "",
		"Image":           "",
		"ImagePullPolicy": "--pull=never: the image is local",
		"Args":            "after the image (its ENTRYPOINT is the agent)",
		"Env":             "--env: values and limits.memory (the entrypoint is the image's)",
		"SecurityContext": "see securityFields",
		"Resources":       "limits: --memory, --cpus; requests only schedule",
		"VolumeMounts":    "--volume=HOST:MOUNT[:ro]",
		"Ports":           "left out: the network is the host's (no CNI here); the chart's listen address is a loopback port",
		"LivenessProbe":   "the test asks /health itself",
		"ReadinessProbe":  "the test waits for /ready itself",
	}
	securityFields = map[string]string{
		"Capabilities":             "--cap-drop, --cap-add",
		"Privileged":               "--privileged when true",
		"RunAsUser":                "--user",
		"RunAsNonRoot":             "checked against the user",
		"ReadOnlyRootFilesystem":   "--read-only --read-only-tmpfs=false (Kubernetes adds no tmpfs)",
		"AllowPrivilegeEscalation": "--security-opt=no-new-privileges when false",
		"SeccompProfile":           "--security-opt=seccomp=...",
	}
)

// podmanRunArgs translates one container of the chart's pod into the
// arguments of `podman run` after "run": every runtime constraint the chart
// sets, the image and its arguments. runtimeDefault is the seccomp profile
// that stands for RuntimeDefault ("" for podman's own).
func podmanRunArgs(t *testing.T, spec *corev1.PodSpec, c corev1.Container, name, runtimeDefault string) []string {
	t.Helper()
	for _, what := range []struct {
		v       any
		handled map[string]string
	}{{*spec, podFields}, {c, containerFields}, {*c.SecurityContext, securityFields}} {
		if u := unhandled(what.v, what.handled); len(u) > 0 {
			t.Fatalf("container %s: the chart sets %v, which the podman translation does not handle", c.Name, u)
		}
	}
	args := []string{"run", "--rm", "--name", name, "--pull=never", "--network=host", "--ipc=private"}
	if g := spec.TerminationGracePeriodSeconds; g != nil {
		args = append(args, fmt.Sprintf("--stop-timeout=%d", *g))
	}
	if spec.HostPID {
		args = append(args, "--pid=host")
	}
	sc := c.SecurityContext
	if sc.RunAsUser == nil {
		t.Fatalf("container %s: no runAsUser (the image's USER would decide)", c.Name)
	}
	if sc.RunAsNonRoot != nil && *sc.RunAsNonRoot && *sc.RunAsUser == 0 {
		t.Fatalf("container %s: runAsNonRoot with runAsUser 0", c.Name)
	}
	args = append(args, fmt.Sprintf("--user=%d:0", *sc.RunAsUser))
	if sc.Privileged != nil && *sc.Privileged {
		args = append(args, "--privileged")
	}
	if sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation {
		args = append(args, "--security-opt=no-new-privileges")
	}
	if sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem {
		args = append(args, "--read-only", "--read-only-tmpfs=false")
	}
	if caps := sc.Capabilities; caps != nil {
		for _, d := range caps.Drop {
			args = append(args, "--cap-drop="+strings.ToLower(string(d)))
		}
		var add []string
		for _, a := range caps.Add {
			add = append(add, string(a))
		}
		if len(add) > 0 {
			args = append(args, "--cap-add="+strings.Join(add, ","))
		}
	}
	switch p := sc.SeccompProfile; {
	case p == nil || p.Type == corev1.SeccompProfileTypeUnconfined:
		args = append(args, "--security-opt=seccomp=unconfined") // the kubelet's default
	case p.Type == corev1.SeccompProfileTypeRuntimeDefault && runtimeDefault != "":
		args = append(args, "--security-opt=seccomp="+runtimeDefault)
	case p.Type == corev1.SeccompProfileTypeRuntimeDefault:
		// podman's own default profile
	default:
		t.Fatalf("container %s: seccomp profile %+v is not translated", c.Name, p)
	}
	hostPaths := map[string]string{}
	for _, v := range spec.Volumes {
		if v.HostPath == nil || !reflect.DeepEqual(v, corev1.Volume{Name: v.Name, VolumeSource: corev1.VolumeSource{HostPath: v.HostPath}}) {
			t.Fatalf("volume %s: only hostPath volumes are translated: %+v", v.Name, v)
		}
		hostPaths[v.Name] = v.HostPath.Path
	}
	for _, m := range c.VolumeMounts {
		path, ok := hostPaths[m.Name]
		if !ok || m.SubPath != "" || m.SubPathExpr != "" || m.MountPropagation != nil || m.RecursiveReadOnly != nil {
			t.Fatalf("volume mount %+v is not translated", m)
		}
		v := "--volume=" + path + ":" + m.MountPath
		if m.ReadOnly {
			v += ":ro"
		}
		args = append(args, v)
	}
	limits := func(containerName string) corev1.ResourceList {
		for _, cc := range slices.Concat(spec.InitContainers, spec.Containers) {
			if cc.Name == containerName {
				return cc.Resources.Limits
			}
		}
		t.Fatalf("resourceFieldRef to unknown container %q", containerName)
		return nil
	}
	if mem, ok := c.Resources.Limits[corev1.ResourceMemory]; ok {
		args = append(args, "--memory="+strconv.FormatInt(mem.Value(), 10))
	}
	if cpu, ok := c.Resources.Limits[corev1.ResourceCPU]; ok {
		args = append(args, "--cpus="+strconv.FormatFloat(float64(cpu.MilliValue())/1000, 'f', 3, 64))
	}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			args = append(args, "--env="+e.Name+"="+e.Value)
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName":
			// Left out: --node-name starts the pod watch, which needs
			// the API server; test/e2e/k8s_test.go covers it.
		case e.ValueFrom.ResourceFieldRef != nil && e.ValueFrom.ResourceFieldRef.Resource == "limits.memory":
			mem := limits(e.ValueFrom.ResourceFieldRef.ContainerName)[corev1.ResourceMemory]
			args = append(args, "--env="+e.Name+"="+strconv.FormatInt(mem.Value(), 10))
		default:
			t.Fatalf("env %s: %+v is not translated", e.Name, e.ValueFrom)
		}
	}
	return append(append(args, c.Image), c.Args...)
}
