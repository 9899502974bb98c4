package explain

import (
	"strings"
	"testing"

	"github.com/profi-dev/profi/internal/status"
)

func TestLaunchVerdict(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	win := func(share, rate float64) *status.LaunchWindow {
		return &status.LaunchWindow{BusiestTID: 41, BusiestShare: share, LaunchRate: rate}
	}
	for _, c := range []struct {
		name string
		l    status.Launching
		want string
		line string
	}{
		{"no window yet", status.Launching{Threads: 1}, LaunchMeasuring, "measuring: 1 launching thread(s)"},
		{"spinning launcher, idle GPU", status.Launching{Threads: 1, Window: win(0.97, 41000), GPUBusy: f(0.22)}, LaunchBound,
			"launch-bound: the launching thread 41 is on-CPU 97% of the time, 41000 launches/s, GPU busy 22%: the GPU waits for the CPU"},
		{"spinning launcher, GPU unknown", status.Launching{Threads: 1, Window: win(0.95, 5000)}, LaunchMaybeBound,
			"possibly launch-bound: the launching thread 41 is on-CPU 95% of the time, 5000 launches/s, GPU busy not known"},
		{"busy GPU", status.Launching{Threads: 1, Window: win(0.97, 41000), GPUBusy: f(0.9)}, LaunchNotBound, "not launch-bound"},
		{"sleeping launcher", status.Launching{Threads: 1, Window: win(0.05, 41000), GPUBusy: f(0.1)}, LaunchNotBound, "on-CPU 5% of the time"},
		{"few launches", status.Launching{Threads: 1, Window: win(1, 999), GPUBusy: f(0.1)}, LaunchNotBound, "999 launches/s"},
		{"at the thresholds", status.Launching{Threads: 1, Window: win(0.9, 1000), GPUBusy: f(0.49)}, LaunchBound, "launch-bound"},
	} {
		v, line := LaunchVerdict(&c.l)
		if v != c.want || !strings.HasPrefix(line, c.want) || !strings.Contains(line, c.line) {
			t.Errorf("%s: %q, %q; want %q and a line with %q", c.name, v, line, c.want, c.line)
		}
	}
}
