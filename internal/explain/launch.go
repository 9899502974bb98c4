package explain

import (
	"fmt"

	"github.com/profi-dev/profi/internal/status"
)

// The launch-bound verdict's thresholds (docs/METRICS.md, "Launch-bound");
// the chart's ProfiLaunchBound alert has the same defaults
// (deploy/chartcheck checks them).
const (
	// LaunchBoundShare: the busiest launching thread's on-CPU share of the
	// window, at least.
	LaunchBoundShare = 0.9
	// LaunchBoundRate: kernel launch calls per second, at least.
	LaunchBoundRate = 1000
	// LaunchBoundGPUBusy: the driver-sampled SM utilization of the
	// process, below.
	LaunchBoundGPUBusy = 0.5
)

// Launch verdicts (Process.Launch).
const (
	LaunchBound         = "launch-bound"
	LaunchMaybeBound    = "possibly launch-bound"
	LaunchNotBound      = "not launch-bound"
	LaunchMeasuring     = "measuring"
	launchBoundAdvice   = "the GPU waits for the CPU to launch: batch launches into CUDA graphs (torch.compile mode=\"reduce-overhead\", the serving engine's CUDA graphs), fuse kernels, or launch from more than one thread"
	launchUnknownAdvice = "GPU busy not known (no NVML sample of the process)"
)

// LaunchVerdict says whether the process is launch-bound: its busiest
// launching thread is on the CPU nearly all the time, it launches many
// kernels a second, and its GPU is mostly idle. The verdict and its line
// for `profi explain`.
func LaunchVerdict(l *status.Launching) (verdict, line string) {
	if l.Window == nil {
		return LaunchMeasuring, fmt.Sprintf("%s: %d launching thread(s), the first window is not complete yet", LaunchMeasuring, l.Threads)
	}
	w := l.Window
	facts := fmt.Sprintf("the launching thread %d is on-CPU %.0f%% of the time, %.0f launches/s", w.BusiestTID, 100*w.BusiestShare, w.LaunchRate)
	busy := launchUnknownAdvice
	if l.GPUBusy != nil {
		busy = fmt.Sprintf("GPU busy %.0f%%", 100**l.GPUBusy)
	}
	hot := w.BusiestShare >= LaunchBoundShare && w.LaunchRate >= LaunchBoundRate
	switch {
	case hot && l.GPUBusy != nil && *l.GPUBusy < LaunchBoundGPUBusy:
		return LaunchBound, fmt.Sprintf("%s: %s, %s: %s", LaunchBound, facts, busy, launchBoundAdvice)
	case hot && l.GPUBusy == nil:
		return LaunchMaybeBound, fmt.Sprintf("%s: %s, %s", LaunchMaybeBound, facts, busy)
	default:
		return LaunchNotBound, fmt.Sprintf("%s: %s, %s", LaunchNotBound, facts, busy)
	}
}
