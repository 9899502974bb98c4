package aggregate

import (
	"testing"
	"time"

	"github.com/profi-dev/profi/internal/bpfobj"
)

// The launching threads of a process (issue 43 item 2): taken from
// launch_threads once each, sampled at every drain; a thread that exits
// keeps its last sample in the total, a tid another thread took starts
// again; over each complete LaunchWindow the busiest thread's on-CPU share
// and the launch rate. Values worked out by hand.
func TestLaunchThreads(t *testing.T) {
	clock := &fakeClock{t: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
	src := newFakeSource()
	procs := newFakeProcs(map[int]fakeProc{7: {"server", 1}})
	procs.cpu = map[[2]int]time.Duration{{7, 70}: 2 * time.Second, {7, 71}: time.Second}
	a := New(Options{Source: src, Procs: procs, Now: clock.now})
	src.launchers = map[uint32]uint32{70: 7, 71: 7, 99: 9} // pid 9: not a process the drain knows
	src.addLaunch(lkey(7, 0), bpfobj.ProfiLaunchVal{Count: 1000})
	p := process(t, drain(t, a), 7)
	if p.LaunchThreads != 2 || p.LaunchThreadCPU != 3*time.Second || p.LaunchBound != nil {
		t.Fatalf("first drain: %d threads, %v, %+v; want 2, 3s, no window yet", p.LaunchThreads, p.LaunchThreadCPU, p.LaunchBound)
	}
	// 5 s later: thread 70 ran 4.5 s of them, 71 one; 40,000 launches.
	clock.t = clock.t.Add(LaunchWindow)
	procs.cpu[[2]int{7, 70}] = 6500 * time.Millisecond
	procs.cpu[[2]int{7, 71}] = 2 * time.Second
	src.addLaunch(lkey(7, 0), bpfobj.ProfiLaunchVal{Count: 40000})
	p = process(t, drain(t, a), 7)
	b := p.LaunchBound
	if p.LaunchThreadCPU != 8500*time.Millisecond || b == nil || b.BusiestTID != 70 || b.BusiestShare != 0.9 || b.LaunchRate != 8000 {
		t.Fatalf("after a window: %v, %+v; want 8.5s, thread 70 at 0.9, 8000 launches/s", p.LaunchThreadCPU, b)
	}
	// Thread 71 exits (its 2 s stay); a thread reuses tid 70 (its 0.25 s
	// counts on top of the 6.5 s the old one ran).
	delete(procs.cpu, [2]int{7, 71})
	procs.cpu[[2]int{7, 70}] = 250 * time.Millisecond
	clock.t = clock.t.Add(time.Second)
	p = process(t, drain(t, a), 7)
	if p.LaunchThreads != 1 || p.LaunchThreadCPU != 8750*time.Millisecond {
		t.Fatalf("after an exit and a reuse: %d threads, %v; want 1, 8.75s", p.LaunchThreads, p.LaunchThreadCPU)
	}
	if len(src.launchers) != 0 {
		t.Errorf("launch_threads entries left: %v (each is taken once)", src.launchers)
	}
}
