package aggregate

import (
	"time"
)

// LaunchWindow is the span over which a process's launching threads'
// on-CPU share and launch rate are measured (Process.LaunchBound): long
// enough to smooth a scheduler tick, short enough for `profi explain` to
// describe now.
const LaunchWindow = 5 * time.Second

// maxLaunchThreadsPerPID bounds the launching threads sampled per process
// (a process that launches from more threads is sampled in its first
// ones; the rest are counted in Process.LaunchThreadsUnsampled).
const maxLaunchThreadsPerPID = 256

// LaunchBound is how a process's launching went over the last complete
// LaunchWindow: the inputs of the launch-bound verdict (docs/METRICS.md).
type LaunchBound struct {
	Start, End time.Time
	// BusiestTID is the launching thread that ran most over the window,
	// BusiestShare its on-CPU share of the window (0-1).
	BusiestTID   int
	BusiestShare float64
	// LaunchRate is kernel launch calls per second over the window (host
	// calls, captured ones included).
	LaunchRate float64
}

// launchers is one process's launching threads (the threads BPF noted at
// their first counted launch, launch_threads), sampled at every drain.
type launchers struct {
	threads map[int]*launchThread // tid
	// gone is the run time of launching threads that exited (or whose tid
	// another thread took), at their last sample.
	gone       time.Duration
	unsampled  int // threads beyond maxLaunchThreadsPerPID
	base       time.Time
	baseLaunch uint64
	last       *LaunchBound
}

type launchThread struct {
	cpu  time.Duration // at the last sample
	base time.Duration // at the window's start (or its first sample)
}

// noteLaunchers takes the threads BPF noted since the last drain; those
// of a process the drain does not know (exited) are dropped.
func (a *Aggregator) noteLaunchers(live map[int]*Process) error {
	return a.opts.Source.Launchers(func(tid, pid uint32) {
		if live[int(pid)] == nil {
			return
		}
		l := a.launchers[int(pid)]
		if l == nil {
			l = &launchers{threads: map[int]*launchThread{}}
			a.launchers[int(pid)] = l
		}
		if _, ok := l.threads[int(tid)]; ok {
			return // a new thread with a tid seen before: sampleLaunchers tells
		}
		if len(l.threads) >= maxLaunchThreadsPerPID {
			l.unsampled++
			return
		}
		l.threads[int(tid)] = &launchThread{cpu: -1}
	})
}

// sampleLaunchers reads each live process's launching threads' run time
// and closes its window when LaunchWindow has passed; launches are the
// process's kernel launch calls so far (launch_agg).
func (a *Aggregator) sampleLaunchers(live map[int]*Process, byPID map[int]*pidData, now time.Time) {
	for pid, l := range a.launchers {
		p := live[pid]
		if p == nil {
			continue
		}
		for tid, t := range l.threads {
			cpu, ok := a.opts.Procs.ThreadCPU(pid, tid)
			switch {
			case !ok:
				l.gone += max(t.cpu, 0)
				delete(l.threads, tid)
				continue
			case t.cpu < 0: // first sample
				t.base = cpu
			case cpu < t.cpu: // another thread took the tid
				l.gone += t.cpu
				t.base = cpu
			}
			t.cpu = cpu
		}
		var launches uint64
		if d := byPID[pid]; d != nil {
			for _, v := range d.launch {
				launches += v.Count
			}
		}
		if l.base.IsZero() {
			l.base, l.baseLaunch = now, launches
		} else if span := now.Sub(l.base); span >= LaunchWindow {
			b := &LaunchBound{Start: l.base, End: now, LaunchRate: float64(launches-min(launches, l.baseLaunch)) / span.Seconds()}
			for tid, t := range l.threads {
				if s := float64(t.cpu-t.base) / float64(span); s > b.BusiestShare || b.BusiestTID == 0 {
					b.BusiestTID, b.BusiestShare = tid, s
				}
				t.base = t.cpu
			}
			l.last, l.base, l.baseLaunch = b, now, launches
		}
		// Its three series are one tuple of --max-time-series.
		if !a.admit(tuple{fam: famLaunchThreads, pid: pid}) {
			continue
		}
		p.LaunchThreads = len(l.threads)
		p.LaunchThreadsUnsampled = l.unsampled
		p.LaunchThreadCPU = l.gone
		for _, t := range l.threads {
			p.LaunchThreadCPU += t.cpu
		}
		p.LaunchBound = l.last
	}
}
