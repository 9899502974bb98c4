package vm

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/profi-dev/profi/internal/testutil"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// arch is one architecture of the matrix: how its programs are built and
// how qemu boots it (docs/KERNELS.md).
type arch struct {
	name    string   // Debian's and Go's name: amd64, arm64
	qemu    string   // the system emulator
	machine []string // qemu arguments naming the machine and CPU
	console string   // the serial console's device
	libDirs []string // where on the host the C libraries of the fixtures come from
	vmLib   string   // where in the VM they go: a directory the architecture's loader searches
	goEnv   []string // environment of the Go builds
	// agentEnv is added for the agent's build: cgo, as shipped (its NVML
	// binding), cross-compiled where the machine is another architecture.
	agentEnv []string
	// skip says why the architecture's lanes do not run yet ("" = they run).
	skip string
}

var arches = []arch{
	{
		name: "amd64", qemu: "qemu-system-x86_64", console: "ttyS0",
		libDirs: []string{"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu"},
		vmLib:   "/lib/x86_64-linux-gnu",
		goEnv:   []string{"GOARCH=amd64"},
	},
	{
		// pauth-impdef=on: boots and traps 2-3 times faster, pointer
		// authentication still on.
		name: "arm64", qemu: "qemu-system-aarch64", console: "ttyAMA0",
		machine: []string{"-M", "virt", "-cpu", "max,pauth-impdef=on"},
		libDirs: []string{"/usr/aarch64-linux-gnu/lib"},
		vmLib:   "/lib/aarch64-linux-gnu",
		// The test binaries without cgo (they need none); the agent with
		// it, as the image ships it (issue 42 item 7).
		goEnv:    []string{"GOARCH=arm64", "CGO_ENABLED=0"},
		agentEnv: []string{"CGO_ENABLED=1", "CC=aarch64-linux-gnu-gcc"},
	},
}

// kernel is one kernel of the matrix: the cloud kernel of a Debian suite.
type kernel struct {
	suite   string
	version string // major.minor, for lane names
	// modes are the link modes the smoke subset runs in: "uprobe_multi"
	// (where the kernel has it, 6.6+) and "classic".
	modes []string
	// tooOld is the one line the agent and `profi check` must refuse the
	// kernel with ("" = supported).
	tooOld string
}

// busyboxSuite is the suite whose static busybox (fetched with its
// kernel) is the VMs' shell, whichever kernel they boot.
const busyboxSuite = "bookworm"

var kernels = []kernel{
	{suite: "bullseye", version: "5.10", tooOld: "is too old for profi: uprobes cannot carry BPF cookies (bpf_get_attach_cookie), which needs 5.15 or newer"},
	{suite: "bookworm", version: "6.1", modes: []string{"classic"}},
	{suite: "trixie", version: "6.12", modes: []string{"uprobe_multi", "classic"}},
}

// newest is Debian's newest kernel (sid: 7.2.13 on 2026-12-07), the
// kernels new GPU nodes (GB300) run. Its lanes run with NewestEnv=1 only:
// on 7.2.13 return probes are lost (docs/KERNELS.md, "Debian's newest"),
// so they fail until that is understood and fixed; then they join
// kernels.
var newest = kernel{suite: "sid", version: "sid", modes: []string{"uprobe_multi", "classic"}}

// NewestEnv=1 adds the newest kernel's lanes (newest).
const NewestEnv = "PROFI_VM_NEWEST"

// matrix is the kernels this run boots.
func matrix() []kernel {
	if os.Getenv(NewestEnv) == "1" {
		return append(slices.Clone(kernels), newest)
	}
	return kernels
}

// loadTests are the BPF load tests: every configuration that changes what
// is loaded (internal/bpfobj).
const loadTests = "^TestLoad"

// smoke is the end-to-end subset run in each link mode, by group: runtime
// launches, copies and their bytes, driver launches; the one-trap
// handover; full-mode kernel names; a CUDA graph's replays; NVTX phases;
// NCCL collectives (%s: the link mode's subtest); on arm64 a BTI-guarded
// runtime; traced processes; the crash breaker. arch: the group runs on
// that architecture only (""; every one): a step that skips a test fails
// (untested). Call counts are divided by scaleDown (testutil.ScaleDown):
// the emulator traps far slower than hardware (docs/KERNELS.md).
var smoke = []struct{ name, run, arch string }{
	{"launches", "^(TestWorkloadStartedAfterAgent|TestDriverAPI)$", ""},
	{"handover", "^TestOneTrapPerLaunch$/^via-driver$", ""},
	{"names", "^TestCUDA13LaunchesFullMode$/^started-after$", ""},
	{"graphs", "^TestGraphs$/^via-driver$/^anonymous$", ""},
	{"nvtx", "^TestNVTXPhases$/^libnvToolsExt$", ""},
	{"nccl", "^TestNCCLExact$/^%s$", ""},
	{"bti", "^TestBTIGuardedLibrary$", "arm64"}, // a BTI-guarded runtime (x86-64 has no BTI)
	// The crash breaker: a crash in the uprobe page quarantines the file
	// for its tenant, then node-wide, the other tenant exact until then.
	{"breaker", "^TestCrashBreakerQuarantine$/^xol$", ""},
	// A traced process: never, and auto (never on arm64, probed on x86-64),
	// with the breakpoint read from its memory; a tracer attaching mid-run
	// and leaving (the link mode's own per-process links).
	{"traced", "^(TestTracedProcessPolicy|TestTracerAttachesAndLeaves)$/^(never|auto)$", ""},
}

const scaleDown = 10

// skipInVM are the subtests the VMs leave out: the stalled variants
// (testutil.Stall) need the stalling goroutine to preempt the workload,
// which a one-CPU guest does not do often enough; the host runs them.
const skipInVM = "//stalled"

// modes are the link modes: the agent's extra arguments and TestNCCLExact's
// subtest of each.
var modes = map[string]struct{ args, nccl string }{
	"uprobe_multi": {"", "uprobe_multi"},
	"classic":      {"--no-uprobe-multi", "classic_uprobes"},
}

// TestKernelMatrix boots each kernel of the matrix and runs, inside, the
// BPF load tests, `profi check` and the smoke subset in each link mode
// (or, on a kernel too old, checks the agent's one-line refusal). Each VM
// is a subtest named ARCH/KERNEL; its steps are subtests of that.
func TestKernelMatrix(t *testing.T) {
	if testing.Short() {
		t.Skip("boots VMs (minutes)")
	}
	e2e := os.Getenv(testenv.E2EEnv) == "1"
	unavailable := func(t *testing.T, format string, args ...any) {
		t.Helper()
		if e2e {
			t.Fatalf(format+" (and %s=1 forbids skipping)", append(args, testenv.E2EEnv)...)
		}
		t.Skipf(format, args...)
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range arches {
		t.Run(a.name, func(t *testing.T) {
			if a.skip != "" {
				t.Skip(a.skip)
			}
			if _, err := exec.LookPath(a.qemu); err != nil {
				unavailable(t, "%s not found: install Debian's qemu-system-x86 or qemu-system-arm (make test-setup)", a.qemu)
			}
			var suites []string
			for _, k := range matrix() {
				suites = append(suites, k.suite)
			}
			args := append([]string{filepath.Join(root, "scripts/fetch-kernels.sh"), "--check", a.name}, suites...)
			out, err := exec.Command("bash", args...).Output()
			if err != nil {
				unavailable(t, "kernels of %v for %s not fetched: run scripts/fetch-kernels.sh %s %s (make test-setup does)",
					suites, a.name, a.name, strings.Join(suites, " "))
			}
			dirs := map[string]string{}
			for _, l := range strings.Fields(string(out)) {
				if s, d, ok := strings.Cut(l, "="); ok {
					dirs[s] = d
				}
			}
			start := time.Now()
			cpio, err := buildInitramfs(t, root, a, filepath.Join(dirs[busyboxSuite], "busybox"))
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("initramfs for %s built in %v", a.name, time.Since(start).Round(100*time.Millisecond))
			// One VM per kernel and link mode, one core each (-smp 1):
			// the machine's cores run them side by side. The load
			// tests and `profi check` run in a kernel's first VM.
			for _, k := range matrix() {
				if len(k.modes) == 0 {
					t.Run(k.version, func(t *testing.T) {
						t.Parallel()
						runKernel(t, a, k, dirs[k.suite], cpio, nil, false)
					})
				}
				for i, m := range k.modes {
					t.Run(k.version+"/"+m, func(t *testing.T) {
						t.Parallel()
						runKernel(t, a, k, dirs[k.suite], cpio, []string{m}, i == 0)
					})
				}
			}
		})
	}
}

// buildInitramfs builds the programs the VMs run (the agent, the test
// binaries of internal/bpfobj and test/e2e, the fixtures and the C
// libraries they load) and packs them with an /init that runs the steps
// the kernel command line names (vmInit).
func buildInitramfs(t *testing.T, root string, a arch, busybox string) (string, error) {
	dir := t.TempDir()
	r := newInitramfs()
	r.add("/bin/busybox", busybox)
	build := func(out string, args ...string) error {
		cmd := exec.Command("go", args...)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), a.goEnv...)
		if filepath.Base(out) == "profi" {
			cmd.Env = append(cmd.Env, a.agentEnv...)
		}
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, b)
		}
		r.add("/bin/"+filepath.Base(out), out)
		return nil
	}
	// Built one after the other: the Go build cache makes them seconds
	// when warm, and the machine's other core stays free.
	for _, b := range [][]string{
		{"build", "-o", filepath.Join(dir, "profi"), "./cmd/profi"},
		{"test", "-c", "-o", filepath.Join(dir, "bpfobj.test"), "./internal/bpfobj"},
		{"test", "-c", "-o", filepath.Join(dir, "e2e.test"), "./test/e2e"},
	} {
		if err := build(b[len(b)-2], b...); err != nil {
			return "", err
		}
	}
	fx, err := testutil.BuildFixturesFor(a.name, testutil.SharedDir()+"-"+a.name)
	if err != nil {
		return "", err
	}
	if err := r.addTree(fx.Dir); err != nil {
		return "", err
	}
	if err := r.addLibraries(a.libDirs, a.vmLib); err != nil {
		return "", err
	}
	r.write("/init", []byte(vmInit(fx.Dir)))
	out := filepath.Join(dir, "initramfs.cpio")
	return out, r.writeCPIO(out)
}

// vmInit is the VM's /init: it mounts what BPF and the tests need, runs
// the steps named by profi.steps= on the kernel command line (each framed
// by sentinel lines with its exit status) and powers off.
func vmInit(fixtures string) string {
	return `#!/bin/busybox sh
/bin/busybox mkdir -p /bin /proc /sys /dev /tmp /root
/bin/busybox --install -s /bin
export PATH=/bin HOME=/root TMPDIR=/tmp
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tracefs tracefs /sys/kernel/tracing
mount -t debugfs debugfs /sys/kernel/debug
mount -t bpf bpf /sys/fs/bpf
mount -t cgroup2 cgroup2 /sys/fs/cgroup
ip link set lo up
export PROFI_E2E=1 ` + testutil.FixturesEnv + `=` + fixtures + ` ` + testutil.AgentEnv + `=/bin/profi ` +
		testutil.ScaleDownEnv + `=` + strconv.Itoa(scaleDown) + `
step() {
	name=$1
	shift
	echo "PROFI-VM-BEGIN $name"
	"$@" </dev/null 2>&1
	echo "PROFI-VM-END $name rc=$?"
}
echo "PROFI-VM-KERNEL $(uname -r)"
for s in $(tr ' ' '\n' </proc/cmdline | sed -n 's/^profi.steps=//p' | tr ',' ' '); do
	case $s in
	load) step load /bin/bpfobj.test -test.run '` + loadTests + `' -test.v -test.count=1 ;;
	check) step check /bin/profi check ;;
	agent) step agent timeout 60 /bin/profi --listen 127.0.0.1:9400 ;;
` + smokeCases() + `	esac
done
echo PROFI-VM-DONE
poweroff -f
`
}

// smokeCases are the init script's case branches of the smoke steps,
// named smoke-MODE-GROUP.
func smokeCases() string {
	var b strings.Builder
	for _, mode := range []string{"uprobe_multi", "classic"} {
		for _, g := range smoke {
			run := g.run
			if strings.Contains(run, "%s") {
				run = fmt.Sprintf(run, modes[mode].nccl)
			}
			fmt.Fprintf(&b, "\tsmoke-%s-%s) %s='%s' step $s /bin/e2e.test -test.run '%s' -test.skip '%s' -test.v -test.count=%d ;;\n",
				mode, g.name, testutil.AgentArgsEnv, modes[mode].args, run, skipInVM, smokeCount())
		}
	}
	return b.String()
}

// SmokeEnv narrows the smoke subset to the groups it names (comma
// separated; the load tests and `profi check` are then left out unless
// it names "load": "load" alone runs only those, for verifier budgets), and
// CountEnv runs each smoke test that many times in one boot: a flaky
// count, reproduced in minutes. Unset: every group, once.
const (
	SmokeEnv = "PROFI_VM_SMOKE"
	CountEnv = "PROFI_VM_COUNT"
)

// smokeGroups are the groups SmokeEnv names; nil: every group.
func smokeGroups() map[string]bool {
	v := os.Getenv(SmokeEnv)
	if v == "" {
		return nil
	}
	out := map[string]bool{}
	for _, g := range strings.Split(v, ",") {
		out[strings.TrimSpace(g)] = true
	}
	return out
}

// smokeCount is CountEnv's count (1 when unset or invalid).
func smokeCount() int {
	n, err := strconv.Atoi(os.Getenv(CountEnv))
	if err != nil || n < 1 {
		return 1
	}
	return n
}

// stepResult is one step's output and exit status, and its wall time.
type stepResult struct {
	rc     int
	output []string
	took   time.Duration
}

var endRE = regexp.MustCompile(`^PROFI-VM-END (\S+) rc=(\d+)$`)

// boot runs qemu on kernel and initramfs with the given steps and
// returns each step's result, the kernel's release, the time to the first
// step and the whole serial log.
func boot(ctx context.Context, a arch, vmlinuz, cpio string, steps []string) (map[string]*stepResult, string, time.Duration, string, error) {
	args := append(append([]string{}, a.machine...),
		"-m", "2G", "-smp", "1", "-nographic", "-no-reboot", "-nic", "none",
		"-kernel", vmlinuz, "-initrd", cpio,
		"-append", "console="+a.console+" panic=-1 quiet profi.steps="+strings.Join(steps, ","))
	cmd := exec.CommandContext(ctx, a.qemu, args...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, "", 0, "", err
	}
	cmd.Stderr = cmd.Stdout
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, "", 0, "", err
	}
	results := map[string]*stepResult{}
	var (
		log     strings.Builder
		release string
		booted  time.Duration
		cur     *stepResult
		began   time.Time
		done    bool
	)
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r") // the serial console ends lines with CRLF
		log.WriteString(line + "\n")
		switch {
		case strings.Contains(line, "PROFI-VM-KERNEL "): // after the firmware's escape sequences
			release = line[strings.Index(line, "PROFI-VM-KERNEL ")+len("PROFI-VM-KERNEL "):]
			booted = time.Since(start)
		case strings.HasPrefix(line, "PROFI-VM-BEGIN "):
			cur = &stepResult{rc: -1}
			results[strings.TrimPrefix(line, "PROFI-VM-BEGIN ")] = cur
			began = time.Now()
		case endRE.MatchString(line):
			m := endRE.FindStringSubmatch(line)
			if r := results[m[1]]; r != nil {
				r.rc, _ = strconv.Atoi(m[2])
				r.took = time.Since(began)
			}
			cur = nil
		case line == "PROFI-VM-DONE":
			done = true
		case cur != nil:
			cur.output = append(cur.output, line)
		}
	}
	_, _ = io.Copy(io.Discard, stdout)
	werr := cmd.Wait()
	if !done {
		return results, release, booted, log.String(), fmt.Errorf("the VM stopped before its last step (%v; qemu: %v)", ctx.Err(), werr)
	}
	return results, release, booted, log.String(), nil
}

// runKernel boots one kernel for the smoke subset in modes (and the load
// tests and `profi check` with load) and checks each step: every step passes on a
// supported kernel; on one too old, `profi check` and the agent fail with
// the one line naming what is missing, and no verifier log.
func runKernel(t *testing.T, a arch, k kernel, dir, cpio string, modes []string, load bool) {
	steps := []string{"check", "agent"}
	if k.tooOld == "" {
		steps = nil
		if load {
			steps = []string{"load", "check"}
		}
		groups := smokeGroups()
		for _, m := range modes {
			for _, g := range smoke {
				if (g.arch == "" || g.arch == a.name) && (groups == nil || groups[g.name]) {
					steps = append(steps, "smoke-"+m+"-"+g.name)
				}
			}
		}
		if groups != nil && !groups["load"] {
			steps = slices.DeleteFunc(steps, func(s string) bool { return s == "load" || s == "check" })
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	start := time.Now()
	results, release, booted, log, err := boot(ctx, a, filepath.Join(dir, "vmlinuz"), cpio, steps)
	t.Logf("%s %s (Debian %s): booted to /init in %v, whole run %v", a.name, release, k.suite,
		booted.Round(100*time.Millisecond), time.Since(start).Round(100*time.Millisecond))
	logFile := filepath.Join(os.TempDir(), fmt.Sprintf("profi-vm-%s-%s.log", a.name, strings.Join(append([]string{k.version}, modes...), "-")))
	if werr := os.WriteFile(logFile, []byte(log), 0o644); werr == nil {
		t.Logf("serial log: %s", logFile)
	}
	if err != nil {
		t.Fatalf("%v; serial log:\n%s", err, log)
	}
	for _, s := range steps {
		t.Run(s, func(t *testing.T) {
			r := results[s]
			if r == nil {
				t.Fatalf("step %s did not run; serial log:\n%s", s, log)
			}
			t.Logf("%s: exit status %d in %v", s, r.rc, r.took.Round(100*time.Millisecond))
			out := strings.Join(r.output, "\n")
			if k.tooOld == "" {
				if r.rc != 0 {
					t.Errorf("%s on %s failed (exit status %d):\n%s", s, release, r.rc, out)
				}
				if why := untested(s, r.output); r.rc == 0 && why != "" {
					t.Errorf("%s on %s passed without testing: %s:\n%s", s, release, why, out)
				}
				return
			}
			// Too old: a failure whose message says why, in one line,
			// never a verifier log.
			if r.rc == 0 {
				t.Errorf("%s on %s succeeded, want a refusal:\n%s", s, release, out)
			}
			if !strings.Contains(out, k.tooOld) {
				t.Errorf("%s on %s: output does not say %q:\n%s", s, release, k.tooOld, out)
			}
			if strings.Contains(out, "verifier") {
				t.Errorf("%s on %s: a verifier log, want one line:\n%s", s, release, out)
			}
		})
	}
}

// untested says why a test step's exit status 0 proves nothing ("" if it
// does): its test binary ran no test (a -test.run that matches nothing) or
// skipped one, which PROFI_E2E forbids (issue 42 item 7). Steps that are not
// test binaries (check, agent) are not judged here.
func untested(step string, output []string) string {
	if step != "load" && !strings.HasPrefix(step, "smoke-") {
		return ""
	}
	passed := 0
	for _, l := range output {
		l = strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(l, "testing: warning: no tests to run"):
			return "no test matched"
		case strings.HasPrefix(l, "--- SKIP"):
			return "a test skipped: " + l
		case strings.HasPrefix(l, "--- PASS"):
			passed++
		}
	}
	if passed == 0 {
		return "no test passed"
	}
	return ""
}
