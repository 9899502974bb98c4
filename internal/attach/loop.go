package attach

import (
	"context"
	"errors"
	"os"
	"sort"
	"time"

	"github.com/profi-dev/profi/internal/discover"
)

// The discovery loop (Run): a pass every --refresh-interval, triggered
// passes at most MinTriggeredPassInterval apart, a pass after one that
// hooked a new loader; and the grouping of a scan into targets (Targets).

// Scanner is the discovery pass the loop runs (discover.Scanner).
type Scanner interface {
	Scan() (*discover.Result, error)
}

// MinTriggeredPassInterval is the least time from the start of one
// discovery pass to the start of a pass a trigger (a library load, see
// WatchLoads) asks for: triggers meanwhile are coalesced into that one pass
// and counted, so processes loading libraries in a loop cost at most one
// extra pass a second, not one per load (docs/OPERATIONS.md).
const MinTriggeredPassInterval = time.Second

// LoopOptions configure Run.
type LoopOptions struct {
	Scanner  Scanner
	ProcRoot string
	Interval time.Duration       // --refresh-interval
	Observe  func(time.Duration) // duration of each pass; may be nil
	Trigger  <-chan struct{}     // extra passes on demand; may be nil
	// MinTriggerInterval replaces MinTriggeredPassInterval when > 0 (tests).
	MinTriggerInterval time.Duration
}

// Run is the discovery loop and the only goroutine that changes links:
// scan, Sync, wait. It returns after closing every link when ctx ends.
func (a *Attacher) Run(ctx context.Context, o LoopOptions) error {
	defer a.Close()
	t := time.NewTicker(o.Interval)
	defer t.Stop()
	minGap := o.MinTriggerInterval
	if minGap <= 0 {
		minGap = MinTriggeredPassInterval
	}
	for {
		began := time.Now()
		a.Pass(o.Scanner, o.ProcRoot)
		if o.Observe != nil {
			o.Observe(time.Since(began))
		}
		a.lastPass.Store(time.Now().UnixNano())
		if a.hookedNow() {
			// A process that mapped a CUDA library between this pass's
			// scan and its loader hook's attach was not seen by the scan
			// and will not trigger a pass: the next scan, once the hook
			// is there, sees it (at the triggered-pass interval, not
			// --refresh-interval later).
			if !a.holdTriggered(ctx, o.Trigger, t.C, minGap-time.Since(began)) {
				return nil
			}
			continue
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-o.Trigger:
			if !a.holdTriggered(ctx, o.Trigger, t.C, minGap-time.Since(began)) {
				return nil
			}
		}
	}
}

// holdTriggered delays a triggered pass by wait (nothing when wait <= 0),
// counting the triggers that arrive meanwhile as coalesced into it; the
// periodic tick ends the wait early, its pass sees everything too. It
// returns false when ctx ends.
func (a *Attacher) holdTriggered(ctx context.Context, trigger <-chan struct{}, tick <-chan time.Time, wait time.Duration) bool {
	if wait <= 0 {
		return true
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-timer.C:
			return true
		case <-tick:
			return true
		case <-trigger:
			a.triggersCoalesced.Add(1)
		}
	}
}

// hookedNow reports whether the last pass attached a loader hook, and
// forgets it.
func (a *Attacher) hookedNow() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	h := a.newHook
	a.newHook = false
	return h
}

// LastPass is when Run last finished a discovery pass, failed scans
// included (the time of New before the first): /health reads it
// (server.Heartbeat).
func (a *Attacher) LastPass() time.Time { return time.Unix(0, a.lastPass.Load()) }

// Pass runs one discovery pass and syncs the links with its result.
func (a *Attacher) Pass(s Scanner, procRoot string) {
	res, err := s.Scan()
	if err != nil {
		// Listing procfs failed: keep the current links rather than
		// detaching everything on a transient error.
		a.log.Warn("discovery scan failed", "err", err)
		return
	}
	for _, p := range res.Problems {
		a.log.Debug("discovery problem", "pid", p.PID, "err", p.Err)
	}
	a.mu.Lock()
	a.scanProblems += uint64(len(res.Problems))
	a.mu.Unlock()
	a.Sync(Targets(res, procRoot))
}

// Targets groups a scan's mappings by library file. Each target opens the
// file inside the root of one of its processes, trying the next when a
// process has exited meanwhile.
func Targets(res *discover.Result, procRoot string) []Target {
	byKey := map[FileKey]*Target{}
	var order []FileKey
	for _, p := range res.Processes {
		for _, m := range p.Libs {
			key := FileKey{Dev: m.Dev, Inode: m.Inode}
			t := byKey[key]
			if t == nil {
				t = &Target{Key: key, Lib: m.Lib, Path: m.Path, Text: map[int]TextRange{}, Static: m.Static}
				byKey[key] = t
				order = append(order, key)
			}
			t.PIDs = append(t.PIDs, p.PID)
			if p.TracerPID != 0 {
				if t.Tracers == nil {
					t.Tracers = map[int]int{}
				}
				t.Tracers[p.PID] = p.TracerPID
			}
			if m.TextEnd > m.TextStart {
				t.Text[p.PID] = TextRange{m.TextStart, m.TextEnd}
			}
		}
	}
	sort.Slice(order, func(i, j int) bool {
		if order[i].Dev != order[j].Dev {
			return order[i].Dev < order[j].Dev
		}
		return order[i].Inode < order[j].Inode
	})
	out := make([]Target, 0, len(order))
	for _, key := range order {
		t := byKey[key]
		pids, path := t.PIDs, t.Path
		// Each process's root in turn: one that is exiting (its root
		// already gone, not yet a zombie: the crash breaker acts at a
		// death) or gone must not make the file unopenable for the
		// others. The first error that is not a process gone is kept.
		t.Open = func() (*os.File, error) {
			var first error
			for _, pid := range pids {
				f, err := discover.OpenInRoot(procRoot, pid, path)
				if err == nil {
					return f, nil
				}
				if first == nil || errors.Is(first, discover.ErrProcessGone) {
					first = err
				}
			}
			return nil, first
		}
		out = append(out, *t)
	}
	return out
}
