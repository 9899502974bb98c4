package e2e

import (
	"fmt"
	"maps"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/profi-dev/profi/internal/testutil"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// breakerArgs: the workload makes runtime calls only (no launches, no
// graphs), whose stubs call no driver function: every probe hit of its
// calls is in libcudart, and once libcudart is quarantined nothing of it
// is counted (the driver's probes stay on: another file).
var breakerArgs = []string{"--launches", "0", "--graphs", "0"}

// quarantineStatus is the crash breaker's part of /status.
type quarantineStatus struct {
	Quarantined []struct {
		Library         string     `json:"library"`
		Path            string     `json:"path"`
		File            string     `json:"file"`
		Reason          string     `json:"reason"`
		PID             int        `json:"pid"`
		Comm            string     `json:"comm"`
		Signal          string     `json:"signal"`
		Time            time.Time  `json:"time"`
		SinceHitSeconds float64    `json:"seconds_since_probe_hit"`
		DetachSeconds   float64    `json:"detach_seconds"`
		PIDs            []int      `json:"pids"`
		LiftsAt         *time.Time `json:"lifts_at"`
	} `json:"quarantined"`
	Degraded          bool      `json:"degraded"`
	DegradedReasons   []string  `json:"degraded_reasons"`
	LastDrain         time.Time `json:"last_drain"`
	AttachedLibraries []struct {
		Library string `json:"library"`
		Path    string `json:"path"`
		PIDs    []int  `json:"pids"`
	} `json:"attached_libraries"`
}

// pidSeries keeps the per-process series of v (those of the given pids, as
// observed selects them; histogram families sum over every process)
// except the driver's operations: the driver file is not quarantined, and
// once the runtime's probes are off, the driver calls the stub runtime
// makes inside runtime calls (graph instantiation and launches) are no
// longer recognised as the runtime's and count as driver calls, which no
// ground truth lists.
func pidSeries(v values) values {
	out := values{}
	for k, x := range v {
		if strings.Contains(k, "pid=") && !driverOp.MatchString(k) {
			out[k] = x
		}
	}
	return out
}

var driverOp = regexp.MustCompile(`operation=cu[A-Z]`)

// waitDrainAfter waits until the agent drained its maps after t, so a
// scrape shows every call made before t.
func waitDrainAfter(t *testing.T, a *testutil.Agent, after time.Time) {
	t.Helper()
	err := testenv.Eventually(10*time.Second, func() error {
		var st quarantineStatus
		if err := a.Status(&st); err != nil {
			return err
		}
		if !st.LastDrain.After(after) {
			return fmt.Errorf("last drain %v, not after %v", st.LastDrain, after)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// waitQuarantined waits until /status lists n quarantines.
func waitQuarantined(t *testing.T, a *testutil.Agent, n int) quarantineStatus {
	t.Helper()
	var st quarantineStatus
	err := testenv.Eventually(10*time.Second, func() error {
		st = quarantineStatus{}
		if err := a.Status(&st); err != nil {
			return err
		}
		if len(st.Quarantined) != n {
			return fmt.Errorf("%d quarantines, want %d: %+v", len(st.Quarantined), n, st.Quarantined)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// quarantineCount reads profi_system_probe_quarantines_total by
// "library/reason".
func quarantineCount(t *testing.T, a *testutil.Agent) map[string]float64 {
	t.Helper()
	mfs, err := a.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, s := range testutil.Samples(mfs["profi_system_probe_quarantines_total"]) {
		out[s.Labels["library"]+"/"+s.Labels["reason"]] = s.Value
	}
	// Without a lift, every quarantine is still in force.
	inForce := map[string]float64{}
	for _, s := range testutil.Samples(mfs["profi_system_probe_quarantined_files"]) {
		inForce[s.Labels["library"]+"/"+s.Labels["reason"]] = s.Value
	}
	if !maps.Equal(inForce, out) {
		t.Errorf("profi_system_probe_quarantined_files %v, want %v (no lift)", inForce, out)
	}
	return out
}

// A probed process that dies of SIGSEGV (or SIGILL) right after a probed
// call puts its runtime file into quarantine: /status, the metric and the
// ERROR line say so exactly; a second process of the same file keeps
// running and its calls stop counting (exact counts before and after); a
// third process started later is not probed there either.
func TestCrashBreakerQuarantine(t *testing.T) {
	for _, tc := range []struct {
		cmd    string
		signal syscall.Signal
		name   string
	}{
		{"segv", syscall.SIGSEGV, "SIGSEGV"},
		{"ill", syscall.SIGILL, "SIGILL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := startAgent(t)
			dying := startWorkload(t, fixtures.Workload, breakerArgs)
			other := startWorkload(t, fixtures.Workload, breakerArgs)
			waitAttached(t, a, dying.PID)
			waitAttached(t, a, other.PID)
			gtDying, gtOther := runPhase(t, dying), runPhase(t, other)
			requireExact(t, a, expected([]*testutil.GroundTruth{gtDying, gtOther}), dying.PID, other.PID)

			ws, err := dying.Die(tc.cmd)
			if err != nil {
				t.Fatal(err)
			}
			if !ws.Signaled() || ws.Signal() != tc.signal {
				t.Fatalf("workload exit status %v, want killed by %v", ws, tc.signal)
			}
			st := waitQuarantined(t, a, 1)
			q := st.Quarantined[0]
			cudart, err := filepath.EvalSymlinks(fixtures.Cudart)
			if err != nil {
				t.Fatal(err)
			}
			pids := []int{dying.PID, other.PID}
			slices.Sort(pids)
			if q.Library != "libcudart.so" || q.Path != cudart || q.PID != dying.PID || q.Comm != "workload" || q.Signal != tc.name ||
				q.Reason != strings.ToLower(tc.name) || !slices.Equal(q.PIDs, pids) || q.LiftsAt != nil {
				t.Errorf("quarantine %+v; want libcudart.so %s, pid %d (workload), %s, pids %v, no lift", q, cudart, dying.PID, tc.name, pids)
			}
			if q.SinceHitSeconds < 0 || q.SinceHitSeconds > 5 || q.DetachSeconds <= 0 || q.DetachSeconds > 5 {
				t.Errorf("seconds since the probe hit %v (want within the 5 s window), detach %v s", q.SinceHitSeconds, q.DetachSeconds)
			}
			if time.Since(q.Time) > time.Minute || time.Until(q.Time) > time.Second {
				t.Errorf("quarantine time %v, want about now", q.Time)
			}
			t.Logf("%s: %.6f s from the probe hit to the fault exit, %.6f s from the exit to the last link closed", tc.name, q.SinceHitSeconds, q.DetachSeconds)
			if !st.Degraded || len(st.DegradedReasons) != 1 || !strings.Contains(st.DegradedReasons[0], fmt.Sprintf("process %d (workload) died of %s", dying.PID, tc.name)) {
				t.Errorf("degraded %v %q; want one reason naming pid %d and %s", st.Degraded, st.DegradedReasons, dying.PID, tc.name)
			}
			for _, l := range st.AttachedLibraries {
				if l.Library == "libcudart.so" && l.Path == cudart {
					t.Errorf("the quarantined file is still attached: %+v", l)
				}
			}
			if got, want := quarantineCount(t, a), map[string]float64{"libcudart.so/" + strings.ToLower(tc.name): 1}; !maps.Equal(got, want) {
				t.Errorf("profi_system_probe_quarantines_total %v, want %v", got, want)
			}
			if lines := a.LogLines("probes quarantined"); len(lines) != 1 || !strings.Contains(lines[0], "level=ERROR") {
				t.Errorf("log lines about the quarantine %q, want one ERROR line", lines)
			}

			// The other process keeps running; its calls no longer count.
			gtOther2 := runPhase(t, other)
			if gtOther2.TotalCalls() <= gtOther.TotalCalls() {
				t.Fatalf("the second phase made no calls: %d then %d", gtOther.TotalCalls(), gtOther2.TotalCalls())
			}
			ran := time.Now()
			// A process started after the quarantine is not probed there either.
			late := startWorkload(t, fixtures.Workload, breakerArgs)
			gtLate := runPhase(t, late)
			waitDrainAfter(t, a, time.Now())
			mfs, err := a.Metrics()
			if err != nil {
				t.Fatal(err)
			}
			want := pidSeries(expected([]*testutil.GroundTruth{gtOther}))
			if d := diff(want, pidSeries(observed(mfs, other.PID, late.PID))); d != "" {
				t.Errorf("after the quarantine (drained after %v), the other process counts only its first phase and the late one nothing (late made %d calls):\n%s",
					ran, gtLate.TotalCalls(), d)
			}
			if err := other.Stop(); err != nil {
				t.Errorf("the other process did not exit cleanly: %v", err)
			}
		})
	}
}

// requirePerPID is requireExact for the per-process series only.
func requirePerPID(t *testing.T, a *testutil.Agent, want values, pids ...int) {
	t.Helper()
	err := testenv.Eventually(15*time.Second, func() error {
		mfs, err := a.Metrics()
		if err != nil {
			return err
		}
		if d := diff(want, pidSeries(observed(mfs, pids...))); d != "" {
			return fmt.Errorf("metrics differ from ground truth:\n%s", d)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Exits that are not faults never trip the breaker: exit(0), SIGKILL and
// SIGTERM right after probed calls. A SIGSEGV after them is the sentinel:
// crash events are read in order, so when its quarantine is the only one
// and names its process, none of the earlier exits made one.
func TestCrashBreakerIgnoresOtherExits(t *testing.T) {
	a := startAgent(t)
	ws := map[string]*testutil.Workload{}
	for _, name := range []string{"exit", "SIGKILL", "SIGTERM", "sentinel"} {
		ws[name] = startWorkload(t, fixtures.Workload, breakerArgs)
		waitAttached(t, a, ws[name].PID)
		runPhase(t, ws[name])
	}
	if err := ws["exit"].Stop(); err != nil {
		t.Fatalf("exit: %v", err)
	}
	for name, sig := range map[string]syscall.Signal{"SIGKILL": syscall.SIGKILL, "SIGTERM": syscall.SIGTERM} {
		st, err := ws[name].Signal(sig)
		if err != nil {
			t.Fatal(err)
		}
		if !st.Signaled() || st.Signal() != sig {
			t.Fatalf("%s: exit status %v", name, st)
		}
	}
	st, err := ws["sentinel"].Die("segv")
	if err != nil || !st.Signaled() || st.Signal() != syscall.SIGSEGV {
		t.Fatalf("sentinel: exit status %v, %v; want SIGSEGV", st, err)
	}
	q := waitQuarantined(t, a, 1).Quarantined[0]
	if q.PID != ws["sentinel"].PID || q.Signal != "SIGSEGV" {
		t.Errorf("quarantine %+v; want the sentinel's (pid %d, SIGSEGV) only", q, ws["sentinel"].PID)
	}
	if got, want := quarantineCount(t, a), map[string]float64{"libcudart.so/sigsegv": 1}; !maps.Equal(got, want) {
		t.Errorf("profi_system_probe_quarantines_total %v, want %v", got, want)
	}
}

// With --crash-window 0 the breaker is off: a probed process that dies of
// SIGSEGV quarantines nothing, and the other process keeps counting.
func TestCrashBreakerOff(t *testing.T) {
	a := startAgent(t, "--crash-window", "0")
	dying := startWorkload(t, fixtures.Workload, breakerArgs)
	other := startWorkload(t, fixtures.Workload, breakerArgs)
	waitAttached(t, a, dying.PID)
	waitAttached(t, a, other.PID)
	runPhase(t, dying)
	if st, err := dying.Die("segv"); err != nil || !st.Signaled() || st.Signal() != syscall.SIGSEGV {
		t.Fatalf("exit status %v, %v; want SIGSEGV", st, err)
	}
	gt := runPhase(t, other)
	requirePerPID(t, a, pidSeries(expected([]*testutil.GroundTruth{gt})), other.PID)
	var st quarantineStatus
	if err := a.Status(&st); err != nil {
		t.Fatal(err)
	}
	if len(st.Quarantined) != 0 || st.Degraded {
		t.Errorf("quarantined %+v, degraded %v; want none with the breaker off", st.Quarantined, st.Degraded)
	}
	if got := quarantineCount(t, a); len(got) != 0 {
		t.Errorf("profi_system_probe_quarantines_total %v, want no series", got)
	}
}

// With --quarantine-lift, the quarantine ends on its own: /status and the
// gauge empty, the counter stays, and the file is attached again: a
// process started after the lift is counted exactly.
func TestCrashBreakerLift(t *testing.T) {
	a := startAgent(t, "--quarantine-lift", "2")
	dying := startWorkload(t, fixtures.Workload, breakerArgs)
	waitAttached(t, a, dying.PID)
	runPhase(t, dying)
	if st, err := dying.Die("segv"); err != nil || !st.Signaled() || st.Signal() != syscall.SIGSEGV {
		t.Fatalf("exit status %v, %v; want SIGSEGV", st, err)
	}
	q := waitQuarantined(t, a, 1).Quarantined[0]
	if q.LiftsAt == nil || q.LiftsAt.Sub(q.Time) < 2*time.Second || q.LiftsAt.Sub(q.Time) > 3*time.Second {
		t.Errorf("lifts at %v for a quarantine at %v; want 2 s later", q.LiftsAt, q.Time)
	}
	st := waitQuarantined(t, a, 0)
	if st.Degraded {
		t.Errorf("degraded %q after the lift", st.DegradedReasons)
	}
	mfs, err := a.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	if n := len(testutil.Samples(mfs["profi_system_probe_quarantined_files"])); n != 0 {
		t.Errorf("%d profi_system_probe_quarantined_files series after the lift, want none", n)
	}
	total := testutil.Samples(mfs["profi_system_probe_quarantines_total"])
	if len(total) != 1 || total[0].Value != 1 {
		t.Errorf("profi_system_probe_quarantines_total %+v, want one series at 1", total)
	}
	late := startWorkload(t, fixtures.Workload, breakerArgs)
	waitAttached(t, a, late.PID)
	gt := runPhase(t, late)
	requirePerPID(t, a, pidSeries(expected([]*testutil.GroundTruth{gt})), late.PID)
}
