package attach

import (
	"fmt"
	"sync"

	"github.com/cilium/ebpf/link"

	"github.com/profi-dev/profi/internal/attach/uprobe"
	"github.com/profi-dev/profi/internal/ops"
)

// linkSet is the links of one attached file under one uprobe PID filter
// (0: every process). A file has one, for every process, until a process
// that maps it is left unprobed; then one per probed process (traced.go).
type linkSet struct {
	// cold are the probes the overhead budget never pauses, hot the
	// Pausable ones (nil while paused). Index kindTimed holds the probes
	// with a return probe, kindEntry the entry-only ones: the two kinds
	// switch between link sets differently (traced.go).
	cold, hot [2]*uprobe.Links
	// launches are a handover candidate's runtime launch probes
	// (entry-only), each alone; nil while handed over or paused.
	launches map[ops.Op]*uprobe.Links
}

// Probe kinds of a linkSet.
const (
	kindTimed = 0 // entry and return probe: the in-flight nesting counts a call seen twice once
	kindEntry = 1 // entry only: a call seen by two links counts twice
)

func kindOf(p ops.Probe) int {
	if p.Return != "" {
		return kindTimed
	}
	return kindEntry
}

func probesOfKind(probes []ops.Probe, k int) []ops.Probe {
	var out []ops.Probe
	for _, p := range probes {
		if kindOf(p) == k {
			out = append(out, p)
		}
	}
	return out
}

// splitPausable splits probes into those the overhead budget never
// pauses and those it may (Pausable).
func splitPausable(probes []ops.Probe) (cold, hot []ops.Probe) {
	for _, p := range probes {
		if ops.Pausable(p.Op) {
			hot = append(hot, p)
		} else {
			cold = append(cold, p)
		}
	}
	return cold, hot
}

// Len is the number of links.
func (s *linkSet) Len() int {
	if s == nil {
		return 0
	}
	n := 0
	for k := range 2 {
		n += s.cold[k].Len() + s.hot[k].Len()
	}
	for _, l := range s.launches {
		n += l.Len()
	}
	return n
}

// classLen is the number of links of the never-paused (0) and Pausable
// (1) classes; launch probes count in their class.
func (s *linkSet) classLen() [2]int {
	var n [2]int
	if s == nil {
		return n
	}
	for k := range 2 {
		n[0] += s.cold[k].Len()
		n[1] += s.hot[k].Len()
	}
	for op, l := range s.launches {
		if ops.Pausable(op) {
			n[1] += l.Len()
		} else {
			n[0] += l.Len()
		}
	}
	return n
}

// multi reports whether some links are uprobe_multi links.
func (s *linkSet) multi() bool {
	if s == nil {
		return false
	}
	for k := range 2 {
		for _, l := range []*uprobe.Links{s.cold[k], s.hot[k]} {
			if l != nil && l.Multi {
				return true
			}
		}
	}
	for _, l := range s.launches {
		if l != nil && l.Multi {
			return true
		}
	}
	return false
}

// closeKind detaches the probes of kind k (each Links: entries before
// returns).
func (s *linkSet) closeKind(k int) {
	s.cold[k].Close()
	s.hot[k].Close()
	s.cold[k], s.hot[k] = nil, nil
	if k == kindEntry {
		for op, l := range s.launches {
			l.Close()
			delete(s.launches, op)
		}
	}
}

// takeKind removes the links of kind k from s and returns them, for the
// caller to close.
func (s *linkSet) takeKind(k int) []*uprobe.Links {
	out := []*uprobe.Links{s.cold[k], s.hot[k]}
	s.cold[k], s.hot[k] = nil, nil
	if k == kindEntry {
		for op, l := range s.launches {
			out = append(out, l)
			delete(s.launches, op)
		}
	}
	return out
}

// closeLinks closes links in parallel: each close waits for RCU grace
// periods, and at a switch that time is a gap (traced.go).
func closeLinks(links []*uprobe.Links) {
	var wg sync.WaitGroup
	for _, l := range links {
		wg.Go(l.Close)
	}
	wg.Wait()
}

// close detaches every probe of s: timed ones first, like a switch.
func (s *linkSet) close() {
	if s == nil {
		return
	}
	s.closeKind(kindTimed)
	s.closeKind(kindEntry)
}

// linkKind links f's probes of kind k into s, under set's PID filter: the
// never-paused ones, the Pausable ones unless f is paused, and (entry-only)
// each launch probe neither handed over nor paused. On error the caller
// closes s.
func (a *Attacher) linkKind(f *attached, s *linkSet, set uprobe.Set, k int) (string, error) {
	cold, hot := splitPausable(probesOfKind(f.rest, k))
	var (
		reason string
		err    error
	)
	if s.cold[k], reason, err = a.linker.Link(set, cold); err != nil {
		return reason, err
	}
	if !f.paused {
		if s.hot[k], reason, err = a.linker.Link(set, hot); err != nil {
			return reason, err
		}
	}
	if k != kindEntry {
		return "", nil
	}
	for op, lp := range f.launches {
		if lp.handed || f.paused && ops.Pausable(op) {
			continue
		}
		if s.launches == nil {
			s.launches = map[ops.Op]*uprobe.Links{}
		}
		l, reason, err := a.linker.Link(set, []ops.Probe{lp.probe})
		if err != nil {
			return reason, err
		}
		s.launches[op] = l
	}
	return "", nil
}

// executable opens f's file again for linking, with the symbols read at
// the first attach; done closes it.
func (a *Attacher) executable(f *attached) (ex *link.Executable, done func(), err error) {
	file, err := f.target.Open()
	if err != nil {
		return nil, nil, fmt.Errorf("open %s: %w", f.target.Path, err)
	}
	ex, err = link.OpenExecutable(fmt.Sprintf("/proc/self/fd/%d", file.Fd()))
	if err != nil {
		file.Close()
		return nil, nil, fmt.Errorf("open executable %s: %w", f.target.Path, err)
	}
	return ex, func() { file.Close() }, nil
}

// linkCount is the number of f's links, every set.
func (f *attached) linkCount() int {
	n := 0
	for _, s := range f.sets {
		n += s.Len()
	}
	return n
}

// allLinks counts f's links with its full-mode upgrades'.
func (f *attached) allLinks() int {
	n := f.linkCount()
	for _, u := range f.upgrades {
		n += u.Len()
	}
	return n
}

// multi reports whether some of f's links are uprobe_multi links.
func (f *attached) multi() bool {
	for _, s := range f.sets {
		if s.multi() {
			return true
		}
	}
	return false
}

// closeLinks detaches every probe of f.
func (f *attached) closeLinks() {
	for pid, ls := range f.sets {
		ls.close()
		delete(f.sets, pid)
	}
}
