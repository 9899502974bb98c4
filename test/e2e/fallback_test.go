package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	pstatus "github.com/profi-dev/profi/internal/status"
	"github.com/profi-dev/profi/internal/testutil"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// The probe-free fallback (issue 31 item 5): with every probe off (a
// kernel warning in the uprobe code, written into /dev/kmsg by the test),
// the agent keeps polling NVML and serving its GPU metrics (a value the
// fake NVML changes after the stop is exported), /health and /ready
// answer 200, /status says degraded with the reason and NVML up, and the
// workload's calls after the stop are not counted.
func TestProbeFreeFallbackServesNVML(t *testing.T) {
	testutil.RequireBPF(t)
	const gpu = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
	devices := fmt.Sprintf("driver 580.65.06\ngpu %s 00000000:3B:00.0 H100 gpm=ok\n", gpu)
	scenario := fakeNVML(t, devices+fmt.Sprintf("gpmval %s 2 63.5\n", gpu))
	a := startAgent(t, "--kmsg-trust-user", "--nvml-interval", "1", "--gpm-interval", "1")
	w := startWorkload(t, fixtures.Workload, breakerArgs)
	waitAttached(t, a, w.PID)
	gt := runPhase(t, w)
	requireExact(t, a, expected([]*testutil.GroundTruth{gt}), w.PID)
	// GPM's sm_active is metric 2 (percent): the ratio is value / 100.
	waitSMActive(t, a, gpu, 0.635)

	writeUprobeWarning(t, w.PID)
	st := waitQuarantined(t, a, 1, "node")
	if !st.Degraded || len(st.DegradedReasons) != 1 || !strings.Contains(st.DegradedReasons[0], "every probe on the node is off (kernel_warning)") {
		t.Errorf("degraded %v %q; want one reason: every probe off, kernel_warning", st.Degraded, st.DegradedReasons)
	}

	// NVML is still polled and served: a value changed after the stop shows.
	if err := testutil.WriteScenario(scenario, devices+fmt.Sprintf("gpmval %s 2 12.5\n", gpu)); err != nil {
		t.Fatal(err)
	}
	waitSMActive(t, a, gpu, 0.125)
	var nv struct {
		NVML *pstatus.NVML `json:"nvml"`
	}
	if err := a.Status(&nv); err != nil {
		t.Fatal(err)
	}
	if nv.NVML == nil || !nv.NVML.Up || nv.NVML.DeviceCount != 1 {
		t.Errorf("nvml = %+v after the stop, want up with 1 GPU", nv.NVML)
	}
	for _, path := range []string{"/health", "/ready"} {
		if code, body, err := a.Get(path); err != nil || code != 200 {
			t.Errorf("%s %d %q %v after the stop, want 200", path, code, body, err)
		}
	}
	gt2 := runPhase(t, w)
	if gt2.TotalCalls() <= gt.TotalCalls() {
		t.Fatalf("the second phase made no calls: %d then %d", gt.TotalCalls(), gt2.TotalCalls())
	}
	waitDrainAfter(t, a, time.Now())
	mfs, err := a.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	if d := diff(expected([]*testutil.GroundTruth{gt}), observed(mfs, w.PID)); d != "" {
		t.Errorf("after the stop, the workload counts only its first phase:\n%s", d)
	}
	if err := w.Stop(); err != nil {
		t.Errorf("the workload did not exit cleanly: %v", err)
	}
}

// waitSMActive waits until profi_gpu_gpm_ratio{metric="sm_active"} of gpu
// is want.
func waitSMActive(t *testing.T, a *testutil.Agent, gpu string, want float64) {
	t.Helper()
	err := testenv.Eventually(20*time.Second, func() error {
		mfs, err := a.Metrics()
		if err != nil {
			return err
		}
		for _, s := range testutil.Samples(mfs["profi_gpu_gpm_ratio"]) {
			if s.Labels["gpu_uuid"] == gpu && s.Labels["metric"] == "sm_active" {
				if abs(s.Value-want) < 1e-9 {
					return nil
				}
				return fmt.Errorf("sm_active %v, want %v", s.Value, want)
			}
		}
		return fmt.Errorf("no sm_active series of %s", gpu)
	})
	if err != nil {
		t.Fatal(err)
	}
}
