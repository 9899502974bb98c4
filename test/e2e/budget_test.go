package e2e

import (
	"fmt"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/profi-dev/profi/internal/discover"
	"github.com/profi-dev/profi/internal/testutil"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// estimateTolerance is the stated error of the overhead estimate: the
// estimated CPU time of the probes is within ±50 % of the measured one.
// Both sides are noisy on a shared VM: CPU time is read in 10 ms ticks,
// and a trap's cost varies with the vCPU's state (steal, a busy sibling
// hyperthread) between the calibration and the probed library functions.
// Measured on the CI VM type, 12 runs: -5 % to +32 % (the calibration
// interleaves probed and bare rounds spread over 0.2 s; before, a single
// burst of rounds gave up to +76 %).
const estimateTolerance = 0.5

// perPID returns the value of family's series for pid, if present.
func perPID(a *testutil.Agent, family string, pid int) (float64, bool, error) {
	mfs, err := a.Metrics()
	if err != nil {
		return 0, false, err
	}
	for _, s := range testutil.Samples(mfs[family]) {
		if s.Labels["pid"] == strconv.Itoa(pid) {
			return s.Value, true, nil
		}
	}
	return 0, false, nil
}

func cpuTime(t *testing.T, pid int) time.Duration {
	t.Helper()
	c, _, err := discover.ReadCPUTime("/proc", pid)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// The overhead estimate (probe hits × calibrated cost per hit) matches the
// CPU time the probes really cost the workload: the same phases run
// without and with the agent attached, and the difference of the
// process's CPU time is the real cost.
func TestOverheadEstimate(t *testing.T) {
	testutil.RequireBPF(t)
	w := startWorkload(t, fixtures.Workload, []string{"--driver", "2"})
	// Enough phases that the probes cost a few hundred ms of CPU time:
	// the 10 ms ticks of /proc/PID/stat then weigh a few percent.
	const phases = 10
	measure := func() time.Duration {
		before := cpuTime(t, w.PID)
		for range phases {
			runPhase(t, w)
		}
		return cpuTime(t, w.PID) - before
	}
	runPhase(t, w) // warm-up: page faults and lazy binding are not probe cost
	bare := measure()

	// A budget of 100 % turns the estimate on and never duty-cycles.
	a := startAgent(t, "--overhead-budget", "100")
	waitAttached(t, a, w.PID)
	var est0 float64
	if err := testenv.Eventually(10*time.Second, func() error {
		v, ok, err := perPID(a, "profi_system_probe_overhead_seconds_total", w.PID)
		if err == nil && !ok {
			err = fmt.Errorf("no estimate for pid %d yet", w.PID)
		}
		est0 = v
		return err
	}); err != nil {
		t.Fatal(err)
	}
	probed := measure()
	// Two estimation ticks after the last call, every hit is counted.
	time.Sleep(2500 * time.Millisecond)
	est1, _, err := perPID(a, "profi_system_probe_overhead_seconds_total", w.PID)
	if err != nil {
		t.Fatal(err)
	}
	real := (probed - bare).Seconds()
	est := est1 - est0
	if mfs, err := a.Metrics(); err == nil {
		costs := func(name string) []float64 {
			var v []float64
			for _, s := range testutil.Samples(mfs[name]) {
				v = append(v, s.Value)
			}
			return v
		}
		t.Logf("trap cost %v s, cost per hit %v s", costs("profi_system_trap_cost_seconds"), costs("profi_system_probe_hit_cost_seconds"))
	}
	t.Logf("CPU time without probes %v, with %v: probes cost %.3fs; estimated %.3fs (%+.0f%%)", bare, probed, real, est, 100*(est-real)/real)
	if real < 0.15 {
		t.Fatalf("the probes cost only %.3fs of CPU time: too little to judge the estimate", real)
	}
	if math.Abs(est-real) > estimateTolerance*real {
		t.Errorf("estimated probe cost %.3fs, measured %.3fs: beyond ±%.0f%%", est, real, 100*estimateTolerance)
	}
	share, ok, err := perPID(a, "profi_system_sampling_ratio", w.PID)
	if err != nil || !ok || share != 1 {
		t.Errorf("sampling ratio = %v (present %v, err %v), want 1 under a 100%% budget", share, ok, err)
	}
}

// Over budget, the hot probes are duty-cycled: the sampling ratio drops
// below 1, the libraries' hot probes are detached part of each cycle, and
// the never-paused calls (allocations, frees) stay exact.
func TestOverheadBudgetDutyCycles(t *testing.T) {
	testutil.RequireBPF(t)
	a := startAgent(t, "--overhead-budget", "1")
	w := startWorkload(t, fixtures.Workload, nil)
	waitAttached(t, a, w.PID)
	var (
		gt       *testutil.GroundTruth
		minRatio = 1.0
		paused   bool
	)
	// Phases at a fixed pace, so the call rate does not depend on whether
	// the probes are attached; two 10 s cycles and a bit.
	for end := time.Now().Add(23 * time.Second); time.Now().Before(end); {
		next := time.Now().Add(time.Second)
		gt = runPhase(t, w)
		if r, ok, err := perPID(a, "profi_system_sampling_ratio", w.PID); err == nil && ok {
			minRatio = min(minRatio, r)
		}
		mfs, err := a.Metrics()
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range testutil.Samples(mfs["profi_system_duty_cycled_libraries"]) {
			paused = paused || s.Value > 0
		}
		time.Sleep(time.Until(next))
	}
	if minRatio >= 1 || minRatio < 0.05 {
		t.Errorf("lowest sampling ratio %v, want in [0.05, 1) at a 1%% budget", minRatio)
	}
	if !paused {
		t.Error("no library was ever duty-cycled")
	}
	err := testenv.Eventually(5*time.Second, func() error {
		mfs, err := a.Metrics()
		if err != nil {
			return err
		}
		calls := series(mfs, "profi_cuda_calls_total", "pid", "operation")
		for _, op := range []string{"cudaMalloc", "cudaFree"} {
			if got, want := calls[strconv.Itoa(w.PID)+"|"+op], float64(gt.Calls[op]); got != want {
				return fmt.Errorf("%s: %v calls exported, want the exact %v (never paused)", op, got, want)
			}
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
}
