package e2e

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/profi-dev/profi/internal/testutil"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// A process that holds device memory and then launches nothing (issue 43,
// "GPUs held idle"): profi_cuda_held_idle_seconds appears for it, grows
// while it sleeps, and never exceeds the time since its last launch
// began (the test's own clock); a new phase of launches sets it back
// below that phase's age; at its exit the gauge goes (gauges describe live
// processes). internal/aggregate's TestHeldIdle has the exact steps.
func TestGPUHeldIdle(t *testing.T) {
	a := startAgent(t)
	w := startWorkload(t, fixtures.Workload, defaultArgs)
	waitAttached(t, a, w.PID)
	pid := strconv.Itoa(w.PID)
	idle := func() (float64, bool) {
		t.Helper()
		mfs, err := a.Metrics()
		if err != nil {
			t.Fatal(err)
		}
		v, ok := series(mfs, "profi_cuda_held_idle_seconds", "pid")[pid]
		return v, ok
	}
	began := time.Now()
	gt := runPhase(t, w)
	if gt.ActiveBytes == 0 {
		t.Fatal("the workload's phase left no device memory allocated: nothing is held")
	}
	requireExact(t, a, expected([]*testutil.GroundTruth{gt}), w.PID)

	first, ok := idle()
	if !ok {
		t.Fatalf("no held-idle gauge for pid %s, which holds %d B", pid, gt.ActiveBytes)
	}
	time.Sleep(3 * time.Second)
	second, ok := idle()
	if age := time.Since(began).Seconds(); !ok || second <= first || second > age {
		t.Errorf("held idle %v s, then %v s after sleeping 3 s (present %v); want it to grow and stay below the %v s since the last launches began", first, second, ok, age)
	}
	t.Logf("held idle: %v s, then %v s", first, second)

	// Launches again: counted from their drain.
	began = time.Now()
	runPhase(t, w)
	err := testenv.Eventually(5*time.Second, func() error {
		v, ok := idle()
		if age := time.Since(began).Seconds(); !ok || v > age {
			return fmt.Errorf("held idle %v s (present %v) after a phase of launches %v s ago", v, ok, age)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Stop(); err != nil {
		t.Fatal(err)
	}
	err = testenv.Eventually(5*time.Second, func() error {
		if v, ok := idle(); ok {
			return fmt.Errorf("held idle %v s for a process that exited", v)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
