package attach

import (
	"maps"
	"sort"

	"github.com/profi-dev/profi/internal/discover"
)

// The cumulative failure counts and the attach state of the self metrics
// (Counters).

// Counters are cumulative failure counts and the current attach state.
type Counters struct {
	// Failures by library and reason (profi_system_attach_failures_total).
	Failures map[[2]string]uint64
	// Attached library files by library (profi_system_discovery_attached_libraries).
	Attached map[discover.Library]int
	// TrackedPIDs are the processes, seen at the last scan, that map an attached library.
	TrackedPIDs []int
	// ScanProblems counts per-process procfs problems (malformed maps lines, unreadable files).
	ScanProblems uint64
	// LoadChecksSkipped counts library-load events not checked (rate limit);
	// those processes wait for the periodic rescan.
	LoadChecksSkipped uint64
	// Layers are what profi probes of each tracked process (Layers).
	Layers map[int][]Layer
	// TriggersCoalesced counts library-load triggers merged into a pass
	// already due or held back by MinTriggeredPassInterval.
	TriggersCoalesced uint64
	// HandoverWakeups counts the learning records that ran the handover
	// between passes; HandoverLimited those over its rate limit, whose
	// files wait for the next pass (WatchLearning).
	HandoverWakeups, HandoverLimited uint64
	// LimitRefusals count the files the caps refused, each once while it
	// stays mapped, by limit (LimitFilesPerPID, LimitFiles).
	LimitRefusals map[string]uint64
	// CappedFiles are the files the caps refuse now, the link caps'
	// included.
	CappedFiles int
	// Links are what every link costs against the link caps (cost.go).
	Links LinkBudget
	// SwitchGaps are the entry-only gaps of link-set switches by library
	// (profi_system_probe_switch_gaps_total, ..._gap_seconds_total).
	SwitchGaps map[discover.Library]SwitchGaps
}

// Counters returns a copy of the counters.
func (a *Attacher) Counters() Counters {
	c := a.counters()
	c.Layers = Layers(a.Status())
	return c
}

func (a *Attacher) counters() Counters {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := Counters{Failures: map[[2]string]uint64{}, Attached: map[discover.Library]int{}, ScanProblems: a.scanProblems, LoadChecksSkipped: a.loadChecksSkipped.Load(), TriggersCoalesced: a.triggersCoalesced.Load(),
		HandoverWakeups: a.handoverWakeups.Load(), HandoverLimited: a.handoverLimited.Load()}
	for k, v := range a.counts {
		c.Failures[[2]string{k.lib, k.reason}] = v
	}
	c.LimitRefusals = maps.Clone(a.limitRefused)
	c.SwitchGaps = maps.Clone(a.gaps)
	c.CappedFiles = len(a.capped)
	for k := range a.linkCapped {
		if k.pid == 0 {
			c.CappedFiles++
		}
	}
	c.Links = a.linkBudget(false)
	pids := map[int]bool{}
	for _, f := range a.files {
		if !profiled(f.target.Lib) {
			continue // a hook, not a profiled library
		}
		c.Attached[f.target.Lib]++
		for _, p := range f.target.PIDs {
			pids[p] = true
		}
	}
	for p := range pids {
		c.TrackedPIDs = append(c.TrackedPIDs, p)
	}
	sort.Ints(c.TrackedPIDs)
	return c
}
