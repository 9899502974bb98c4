package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/profi-dev/profi/internal/explain"
	"github.com/profi-dev/profi/internal/testutil"
	"github.com/profi-dev/profi/internal/testutil/testenv"
	"github.com/profi-dev/profi/internal/top"
)

// profiCmd runs the agent binary's subcommand and returns stdout and the
// exit status.
func profiCmd(t *testing.T, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(agentBin, args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("profi %v: %v", args, err)
	}
	if errOut.Len() > 0 {
		t.Logf("profi %v stderr: %s", args, errOut.String())
	}
	return out.String(), code
}

func explainJSON(t *testing.T, a *testutil.Agent, target string) ([]explain.Process, int) {
	t.Helper()
	out, code := profiCmd(t, "explain", "--agent", a.URL, "--output", "json", target)
	var procs []explain.Process
	if err := json.Unmarshal([]byte(out), &procs); err != nil {
		t.Fatalf("explain %s: %v\n%s", target, err, out)
	}
	if len(procs) != 1 {
		t.Fatalf("explain %s: %d processes, want 1", target, len(procs))
	}
	return procs, code
}

// pidSum adds a family's samples of one pid.
func pidSum(mfs map[string]*dto.MetricFamily, family string, pid int) uint64 {
	var v float64
	for _, s := range testutil.Samples(mfs[family]) {
		if s.Labels["pid"] == strconv.Itoa(pid) {
			v += s.Value
		}
	}
	return uint64(v)
}

// TestExplain answers for an attached, a non-attached and a non-CUDA
// process, from /status and this machine's procfs.
func TestExplain(t *testing.T) {
	a := startAgent(t)
	w := startWorkload(t, fixtures.Workload, defaultArgs)
	waitAttached(t, a, w.PID)
	gt := runPhase(t, w)
	requireExact(t, a, expected([]*testutil.GroundTruth{gt}), w.PID)

	procs, code := explainJSON(t, a, strconv.Itoa(w.PID))
	p := procs[0]
	if code != 0 || p.Verdict != explain.VerdictAttached {
		t.Errorf("attached workload: exit %d verdict %q (%s), want 0 and attached", code, p.Verdict, p.Why)
	}
	var cudart *explain.Library
	for i := range p.Libraries {
		if p.Libraries[i].Path == fixtures.Cudart {
			cudart = &p.Libraries[i]
		}
	}
	if cudart == nil || !cudart.Attached || !cudart.LocalMapped || len(cudart.Probes) == 0 {
		t.Fatalf("libcudart %s not listed as attached and mapped: %+v", fixtures.Cudart, p.Libraries)
	}
	if !strings.Contains(strings.Join(cudart.Probes, ","), "cudaMalloc+0") {
		t.Errorf("probes %v lack cudaMalloc+0", cudart.Probes)
	}
	var mallocs, active uint64
	for _, g := range p.PerGPU { // one entry per GPU the process used
		mallocs += g.Calls["cudaMalloc"]
		active += g.ActiveMemoryBytes
	}
	if mallocs != gt.Calls["cudaMalloc"] || active != gt.ActiveBytes {
		t.Errorf("counters %+v: cudaMalloc %d active memory %d, want %d and %d", p.PerGPU, mallocs, active, gt.Calls["cudaMalloc"], gt.ActiveBytes)
	}
	text, _ := profiCmd(t, "explain", "--agent", a.URL, strconv.Itoa(w.PID))
	if !strings.Contains(text, fmt.Sprintf("PID %d (workload): ATTACHED", w.PID)) || !strings.Contains(text, "libcudart.so "+fixtures.Cudart) {
		t.Errorf("text answer:\n%s", text)
	}

	// A library file the agent cannot attach (not ELF): not attached, with the reason.
	script := fmt.Sprintf("import mmap,sys\nf=open(%q,'rb')\nm=mmap.mmap(f.fileno(),0,prot=mmap.PROT_READ)\nimport os\nprint('ready',os.getpid(),flush=True)\nsys.stdin.read()\n", fixtures.CudartNotELF)
	py := startWorkload(t, "python3", []string{"-c", script})
	var np explain.Process
	if err := testenv.Eventually(15*time.Second, func() error {
		procs, code := explainJSON(t, a, strconv.Itoa(py.PID))
		np = procs[0]
		if code != 1 || np.Verdict != explain.VerdictNotAttached || len(np.Libraries) != 1 || np.Libraries[0].Reason != "not_elf" {
			return fmt.Errorf("exit %d, %+v", code, np)
		}
		return nil
	}); err != nil {
		t.Fatalf("not-ELF library: %v", err)
	}
	if l := np.Libraries[0]; l.Path != fixtures.CudartNotELF || l.Attached || l.Error == "" {
		t.Errorf("not-ELF library = %+v", l)
	}

	// A process without any CUDA library.
	sleep := exec.Command("sleep", "60")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sleep.Process.Kill(); _ = sleep.Wait() })
	procs, code = explainJSON(t, a, strconv.Itoa(sleep.Process.Pid))
	if p := procs[0]; code != 1 || p.Verdict != explain.VerdictNotCUDA || len(p.Libraries) != 0 || p.Comm != "sleep" {
		t.Errorf("sleep: exit %d, %+v, want 1 and not_cuda", code, p)
	}
}

// topRow finds pid's row in a `profi top --raw` screen and returns its
// cells, one per top.Columns.
func topRow(screen string, pid int) []string {
	for _, line := range strings.Split(screen, "\n") {
		f := strings.Fields(line)
		if len(f) == len(top.Columns) && f[2] == strconv.Itoa(pid) { // one field per column
			return f
		}
	}
	return nil
}

// wantTopRow compares pid's row with the agent's exact counts of an idle
// workload: no rate, no graph share, no latency in the window, no NVML
// (SM% -); launches are the kernels that ran (direct and through graphs);
// HELD IDLE, how long it has launched nothing while holding device
// memory, is a number of seconds when it holds some (its value is the
// clock's: checked to be one), "-" otherwise; LAUNCH CPU%, the on-CPU
// share of its busiest launching thread in the agent's last window, is
// "-" before a window ends and a percentage after (the scheduler's: checked
// to be one; test/e2e/launchbound_test.go checks its value).
func wantTopRow(screen string, pid int, launches, calls, active uint64) error {
	got := topRow(screen, pid)
	idle := "-"
	if len(got) > heldIdleField && active > 0 {
		if v, err := strconv.ParseFloat(got[heldIdleField], 64); err == nil && v >= 0 {
			idle = got[heldIdleField]
		}
	}
	launchCPU := "-"
	if len(got) > launchCPUField {
		if v, err := strconv.ParseFloat(got[launchCPUField], 64); err == nil && v >= 0 && v <= 100 {
			launchCPU = got[launchCPUField]
		}
	}
	want := []string{"-", "-", strconv.Itoa(pid), "workload", "0.0", "-", strconv.FormatUint(launches, 10), strconv.FormatUint(calls, 10),
		"-", "-", "0", "0", "0", strconv.FormatUint(active, 10), "-", launchCPU, idle, "0", "-"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		return fmt.Errorf("row %q, want %q; screen:\n%s", got, want, screen)
	}
	return nil
}

// heldIdleField is the HELD IDLE value's index among a row's fields.
var heldIdleField = top.ColumnIndex("held_idle")

// launchCPUField is the LAUNCH CPU% value's index among a row's fields.
var launchCPUField = top.ColumnIndex("launch_cpu")

// TestTop runs `profi top` against the agent and an idle workload whose
// counts are proven exact: once with --once, once live in a real terminal
// (tmux), reading the screen with capture-pane.
func TestTop(t *testing.T) {
	a := startAgent(t)
	w := startWorkload(t, fixtures.Workload, defaultArgs)
	waitAttached(t, a, w.PID)
	gt := runPhase(t, w)
	mfs := requireExact(t, a, expected([]*testutil.GroundTruth{gt}), w.PID)
	direct := pidSum(mfs, "profi_cuda_kernel_launches_total", w.PID)
	graph := pidSum(mfs, "profi_cuda_graph_kernel_launches_total", w.PID)
	launches := direct + graph
	calls := pidSum(mfs, "profi_cuda_calls_total", w.PID)
	if direct == 0 || calls == 0 {
		t.Fatalf("launches %d calls %d: the workload made none", direct, calls)
	}

	out, code := profiCmd(t, "top", "--agent", a.URL, "--once", "--raw", "--interval", "500ms")
	if code != 0 {
		t.Fatalf("top --once: exit %d\n%s", code, out)
	}
	if err := wantTopRow(out, w.PID, launches, calls, gt.ActiveBytes); err != nil {
		t.Errorf("top --once: %v", err)
	}

	tmux, err := exec.LookPath("tmux")
	if err != nil {
		if os.Getenv(testenv.E2EEnv) == "1" {
			t.Fatalf("tmux not installed (apt-get install tmux): %v", err)
		}
		t.Skipf("tmux not installed: %v", err)
	}
	sock := fmt.Sprintf("profi-e2e-%d", os.Getpid())
	tm := func(args ...string) (string, error) {
		out, err := exec.Command(tmux, append([]string{"-L", sock}, args...)...).CombinedOutput()
		return string(out), err
	}
	if out, err := tm("new-session", "-d", "-s", "top", "-x", "250", "-y", "40",
		agentBin+" top --agent "+a.URL+" --interval 1s --raw --sort pid --asc"); err != nil {
		t.Fatalf("tmux new-session: %v\n%s", err, out)
	}
	t.Cleanup(func() { _, _ = tm("kill-server") })
	var screen string
	err = testenv.Eventually(20*time.Second, func() error {
		var err error
		if screen, err = tm("capture-pane", "-p", "-t", "top"); err != nil {
			return fmt.Errorf("capture-pane: %v: %s", err, screen)
		}
		return wantTopRow(screen, w.PID, launches, calls, gt.ActiveBytes)
	})
	if err != nil {
		t.Fatalf("tmux screen: %v", err)
	}
	if !strings.Contains(screen, "profi top  "+a.URL) || !strings.Contains(screen, "sort pid asc") {
		t.Errorf("header missing:\n%s", screen)
	}
	// The sort keys work: reverse the order, the header says so.
	if out, err := tm("send-keys", "-t", "top", "r"); err != nil {
		t.Fatalf("send-keys: %v %s", err, out)
	}
	if err := testenv.Eventually(10*time.Second, func() error {
		screen, _ = tm("capture-pane", "-p", "-t", "top")
		if !strings.Contains(screen, "sort pid desc") {
			return fmt.Errorf("no 'sort pid desc' in:\n%s", screen)
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
	if out, err := tm("send-keys", "-t", "top", "q"); err != nil {
		t.Fatalf("send-keys q: %v %s", err, out)
	}
}
