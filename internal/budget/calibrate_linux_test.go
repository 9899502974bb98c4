//go:build linux && (amd64 || arm64)

package budget

import (
	"testing"
	"time"

	"github.com/profi-dev/profi/internal/testutil"
)

// The calibration probe really fires: the cost per trap is positive (the
// call is slower with the probe) and in the range a uprobe trap can cost
// (0.5 µs on bare metal, tens of µs on a loaded VM).
func TestCalibrate(t *testing.T) {
	testutil.RequireBPF(t)
	got, err := Calibrate()
	if err != nil {
		t.Fatalf("Calibrate: %v", err)
	}
	if got < 100*time.Nanosecond || got > time.Millisecond {
		t.Errorf("trap cost = %v, want between 100ns and 1ms", got)
	}
	t.Logf("trap cost %v", got)
}
