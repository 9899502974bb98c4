package e2e

import (
	"fmt"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/profi-dev/profi/internal/explain"
	pstatus "github.com/profi-dev/profi/internal/status"
	"github.com/profi-dev/profi/internal/testutil"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// readJitter bounds how far apart, in the agent's drain, the clock it
// stamps a window with and its reads of the threads' run time can be
// (both at the window's start and end): the share's tolerance, over a
// window of internal/aggregate's LaunchWindow.
const readJitter = 50 * time.Millisecond

// Launch-bound (issue 43 item 2): one workload whose launching thread
// spins between launches (--spin-us) and one whose thread sleeps
// (--pause-us), both with the fake NVML sampling them 20 % SM busy. While
// each runs, `profi explain` gives its launching thread's on-CPU share
// over a window inside the run; the workload's own clocks bound that
// share (the thread's CPU time in the window is at most its CPU time over
// the whole run, its time off the CPU at most its time off over the run),
// and the verdict follows from the bounds wherever they decide it. Once
// the thread is parked (it runs no more), the agent's CPU seconds of the
// process's launching threads are the thread's CPU clock, to the
// nanosecond.
func TestLaunchBound(t *testing.T) {
	testutil.RequireBPF(t)
	scenario := fakeNVML(t, "driver 580.65.06\ngpu "+gpuA+" 00000000:3B:00.0 H100 procutil=ok\n")
	a := startAgent(t, "--nvml-interval", "1")
	for _, c := range []struct {
		name string
		args []string
		// sleeper: its bounds must decide the verdict (not launch-bound).
		sleeper bool
	}{
		{"spinner", []string{"--threads", "1", "--park", "--launches", "10", "--spin-us", "1000", "--iters", "1"}, false},
		{"sleeper", []string{"--threads", "1", "--park", "--launches", "10", "--pause-us", "2000", "--iters", "1"}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := startWorkload(t, fixtures.Workload, c.args)
			if err := testutil.WriteScenario(scenario, fmt.Sprintf("driver 580.65.06\ngpu %s 00000000:3B:00.0 H100 procutil=ok\nsample %s %d 20 0 0 0\n", gpuA, gpuA, w.PID)); err != nil {
				t.Fatal(err)
			}
			waitAttached(t, a, w.PID)
			var p explain.Process
			var running time.Time
			gt, err := w.RunUntil(func() {
				running = time.Now()
				// A window that starts after the thread's first launch
				// was drained (every thread present from its start).
				if err := testenv.Eventually(30*time.Second, func() error {
					procs, _ := explainJSON(t, a, strconv.Itoa(w.PID))
					p = procs[0]
					l := launching(p)
					if l == nil || l.Window == nil || l.GPUBusy == nil || l.Window.Start.Before(running.Add(1500*time.Millisecond)) {
						return fmt.Errorf("no window inside the run yet: %+v", l)
					}
					return nil
				}); err != nil {
					t.Fatal(err)
				}
			})
			if err != nil {
				t.Fatalf("%v\n%s", err, w.Stderr())
			}
			if len(gt.Threads) != 1 {
				t.Fatalf("threads %+v, want the one worker", gt.Threads)
			}
			th := gt.Threads[0]
			l := launching(p)
			win := l.Window
			if win.Start.UnixNano() < int64(th.WallStartNS) || win.End.UnixNano() > int64(th.WallEndNS) {
				t.Fatalf("window %v-%v is not inside the thread's run %v-%v", win.Start, win.End, time.Unix(0, int64(th.WallStartNS)), time.Unix(0, int64(th.WallEndNS)))
			}
			if win.BusiestTID != th.TID || *l.GPUBusy != 0.2 || l.Threads != 1 {
				t.Errorf("busiest tid %d, GPU busy %v, %d threads; want %d, 0.2 (the fake's samples), 1", win.BusiestTID, *l.GPUBusy, l.Threads, th.TID)
			}
			span := win.End.Sub(win.Start).Seconds()
			run := float64(th.WallEndNS-th.WallStartNS) / 1e9
			cpu := float64(th.CPUNS-th.CPUStartNS) / 1e9
			slack := 2 * readJitter.Seconds() / span
			upper, lower := cpu/span+slack, 1-(run-cpu)/span-slack
			t.Logf("%s: share %.3f in [%.3f, %.3f] (run %.2fs on-CPU %.2fs, window %.2fs), %.0f launches/s: %s",
				c.name, win.BusiestShare, lower, upper, run, cpu, span, win.LaunchRate, p.LaunchWhy)
			if win.BusiestShare > upper || win.BusiestShare < lower {
				t.Errorf("share %v outside the workload's bounds [%v, %v]", win.BusiestShare, lower, upper)
			}
			switch {
			case lower >= explain.LaunchBoundShare && win.LaunchRate >= explain.LaunchBoundRate && p.Launch != explain.LaunchBound:
				t.Errorf("verdict %q (%s), want %q: the thread was on the CPU at least %.2f of the window", p.Launch, p.LaunchWhy, explain.LaunchBound, lower)
			case upper < explain.LaunchBoundShare && p.Launch != explain.LaunchNotBound:
				t.Errorf("verdict %q (%s), want %q: the thread was on the CPU at most %.2f of the window", p.Launch, p.LaunchWhy, explain.LaunchNotBound, upper)
			case c.sleeper && upper >= explain.LaunchBoundShare:
				t.Errorf("the sleeper ran %.2fs of its %.2fs run: not a sleeper", cpu, run)
			}

			// Parked: the launching thread's run time, exactly.
			want := float64(th.CPUNS) / 1e9
			var got float64
			if err := testenv.Eventually(10*time.Second, func() error {
				mfs, err := a.Metrics()
				if err != nil {
					return err
				}
				got = math.NaN()
				for _, s := range testutil.Samples(mfs["profi_cuda_launch_thread_cpu_seconds_total"]) {
					if s.Labels["pid"] == strconv.Itoa(w.PID) {
						got = s.Value
					}
				}
				var threads float64
				for _, s := range testutil.Samples(mfs["profi_cuda_launch_threads"]) {
					if s.Labels["pid"] == strconv.Itoa(w.PID) {
						threads = s.Value
					}
				}
				if math.Abs(got-want) > 1e-9 || threads != 1 {
					return fmt.Errorf("cpu seconds %v, want %v; %v threads, want 1", got, want, threads)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// launching is the process's launching state in an explain answer.
func launching(p explain.Process) *pstatus.Launching {
	for _, s := range p.PerGPU {
		if s.Launching != nil {
			return s.Launching
		}
	}
	return nil
}
