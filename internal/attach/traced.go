package attach

import (
	"errors"
	"slices"
	"time"

	"github.com/cilium/ebpf"

	"github.com/profi-dev/profi/internal/attach/uprobe"
)

// Traced processes (issue 31; docs/OPERATIONS.md, "Traced processes"). A
// process with a tracer (gdb, strace, CRIU) is where the arm64 kernel's
// uprobe single-step handler misbehaved (docs/KERNELS.md). The hazard is
// the breakpoint itself, so skipping the process in BPF is not enough:
// the kernel must not install the breakpoint in its memory. It installs a
// uprobe's breakpoint only in the processes its consumers' filters accept,
// and a uprobe (perf event) or uprobe_multi link made with a PID accepts
// that process alone. So while a process that maps a file is left
// unprobed, the file's probes are per-process links for the processes
// that map it and are probed; once none is left, one set for every
// process again. The loader hook (ld.so) has no per-process use: it is off
// while a traced process maps that loader, and library loads are then
// found by the periodic pass.

// Policies of --probe-traced-processes.
const (
	TracedAuto   = "auto"
	TracedAlways = "always"
	TracedNever  = "never"
)

// Reasons a process is left unprobed (/status unprobed_pids, layer state
// "unprobed"): a tracer is attached; or the crash breaker quarantined the
// file for the process's tenant (QuarantineTenant).
const (
	ReasonTraced      = "traced"
	ReasonQuarantined = "quarantined"
	// ReasonLinkCap: the process's own set of a file a traced process
	// maps would go past a link cap (cost.go).
	ReasonLinkCap = "link_cap"
)

// quarantinedTenant is tracerOf's answer for a process of a quarantined
// tenant (no tracer pid is negative).
const quarantinedTenant = -1

// ExcludesTraced reports whether policy leaves traced processes unprobed
// on architecture goarch (GOARCH): never does; auto does on arm64, whose
// single-step handler misbehaved, and not elsewhere; always never does.
func ExcludesTraced(policy, goarch string) bool {
	switch policy {
	case TracedNever:
		return true
	case TracedAuto:
		return goarch == "arm64"
	default:
		return false
	}
}

// tracerOf says whether pid is left unprobed in t: quarantinedTenant for
// a process of a tenant quarantined in t, else the tracer of pid when
// traced processes are left unprobed; 0: probed.
func (a *Attacher) tracerOf(t *Target, pid int) int {
	if off := a.tenantsOff[t.Key]; len(off) > 0 && a.opts.Tenant != nil {
		if tenant, ok := a.opts.Tenant(pid); ok && off[tenant] {
			return quarantinedTenant
		}
	}
	if !a.opts.ExcludeTraced {
		return 0
	}
	return t.Tracers[pid]
}

// wantFilters are the PID filters whose link sets file t should have: the
// attacher's own (0: every process) while no process that maps t is left
// unprobed; otherwise one per probed process that maps it (the loader
// hook: none).
func (a *Attacher) wantFilters(t *Target) []int {
	traced := false
	for _, pid := range t.PIDs {
		traced = traced || a.tracerOf(t, pid) != 0
	}
	if !traced {
		return []int{a.opts.PID}
	}
	if a.opts.PID != 0 {
		if a.tracerOf(t, a.opts.PID) != 0 {
			return nil
		}
		return []int{a.opts.PID}
	}
	if !profiled(t.Lib) {
		return nil
	}
	var out []int
	for _, pid := range sortedPIDs(t.PIDs) {
		if a.tracerOf(t, pid) == 0 {
			out = append(out, pid)
		}
	}
	return out
}

// syncFilters moves every attached file's link sets to wantFilters. A
// process whose probes come back (its tracer left) first loses what the
// in-flight maps hold of it: a call its links saw enter before they
// closed would otherwise make every later call of that thread look
// nested. Called with a.mu held, after the pass's attaches.
func (a *Attacher) syncFilters() {
	back := map[int]bool{}
	for _, f := range a.files {
		for pid := range f.unprobed {
			if slices.Contains(f.target.PIDs, pid) && a.tracerOf(&f.target, pid) == 0 {
				back[pid] = true
			}
		}
	}
	if len(back) > 0 {
		a.forgetInflight(back)
	}
	for _, f := range a.files {
		a.switchFilters(f)
		unprobed := map[int]int{}
		for _, pid := range f.target.PIDs {
			if tr := a.tracerOf(&f.target, pid); tr != 0 {
				unprobed[pid] = tr
			}
		}
		for pid, tr := range unprobed {
			if _, was := f.unprobed[pid]; !was && tr == quarantinedTenant {
				a.log.Warn("process left unprobed: the crash breaker quarantined the file for its tenant", "pid", pid, "lib", f.target.Lib, "path", f.target.Path)
			} else if !was {
				a.log.Info("traced process left unprobed", "pid", pid, "tracer_pid", tr, "lib", f.target.Lib, "path", f.target.Path)
			}
		}
		for pid := range f.unprobed {
			if _, still := unprobed[pid]; !still && slices.Contains(f.target.PIDs, pid) {
				a.log.Info("process no longer traced or quarantined, probed again", "pid", pid, "lib", f.target.Lib, "path", f.target.Path)
			}
		}
		f.unprobed = unprobed
	}
}

// switchFilters moves f's link sets to wantFilters. Probes with a return
// probe of the new sets attach before the old sets close: a call both
// see is counted once (its second entry only nests in the in-flight
// entry; its second return finds none and is counted as an orphan).
// Entry-only probes (anonymous launches, ncclGroupStart, NVTX, kernel
// names, the loader hook) of the old sets close before the new ones
// attach, so none counts a call twice; calls entering in between are not
// counted: the gap docs/OPERATIONS.md states, logged with its length at
// each switch. A set that fails to link is retried at the next pass; the
// old sets close whatever happens, so an unprobed process never keeps a
// breakpoint for that.
func (a *Attacher) switchFilters(f *attached) {
	want := a.wantFilters(&f.target)
	for k := range a.linkCapped {
		if k.file == f.target.Key && k.pid > 0 && !k.upgrade && !slices.Contains(want, k.pid) {
			delete(a.linkCapped, k) // its process is gone, or one set serves all
		}
	}
	var add, drop []int
	for _, pid := range want {
		if f.sets[pid] == nil {
			add = append(add, pid)
		}
	}
	for pid := range f.sets {
		if !slices.Contains(want, pid) {
			drop = append(drop, pid)
		}
	}
	if len(add)+len(drop) == 0 {
		return
	}
	_, wideBefore := f.sets[a.opts.PID]
	wideBefore = wideBefore && len(f.sets) == 1
	added := map[int]*linkSet{}
	var sets map[int]func() (string, error)
	if len(add) > 0 {
		ex, done, err := a.executable(f)
		if err != nil {
			a.log.Warn("could not open the library to link per-process probes; retried at the next pass", "lib", f.target.Lib, "path", f.target.Path, "err", err)
		} else {
			defer done()
			sets = map[int]func() (string, error){}
			links := a.setLinks(f)
			for _, pid := range add {
				// Each per-process set costs a whole set's links: a
				// process that traces itself must not take the node's.
				ck := capKey{file: f.target.Key, pid: pid}
				if limit := a.overLinkCap(links*(1+len(added)), []int{pid}); limit != "" {
					a.refuseLinks(ck, links, limit, "lib", f.target.Lib, "path", f.target.Path, "pid", pid)
					continue
				}
				delete(a.linkCapped, ck)
				set := a.set(ex, f.target, f.syms, f.id, pid)
				ls := &linkSet{}
				if _, err := a.linkKind(f, ls, set, kindTimed); err != nil {
					ls.close()
					a.log.Warn("could not link per-process probes; retried at the next pass", "lib", f.target.Lib, "pid", pid, "err", err)
					continue
				}
				added[pid] = ls
				sets[pid] = func() (string, error) { return a.linkKind(f, ls, set, kindEntry) }
			}
		}
	}
	for _, pid := range drop {
		f.sets[pid].closeKind(kindTimed)
	}
	// The gap: every entry-only link of the old sets closes at once (each
	// close waits for an RCU grace period), then the new ones attach.
	began := time.Now()
	var closing []*uprobe.Links
	for _, pid := range drop {
		closing = append(closing, f.sets[pid].takeKind(kindEntry)...)
		delete(f.sets, pid)
	}
	closeLinks(closing)
	for pid, ls := range added {
		if _, err := sets[pid](); err != nil {
			ls.close()
			a.log.Warn("could not link per-process probes; retried at the next pass", "lib", f.target.Lib, "pid", pid, "err", err)
			continue
		}
		f.sets[pid] = ls
	}
	gap := time.Since(began)
	if len(drop) > 0 && len(added) > 0 {
		// Only a switch that closed entry-only links some process kept
		// using and linked new ones has a gap: dropping one process's
		// set or adding another's leaves every other set in place.
		g := a.gaps[f.target.Lib]
		g.Count++
		g.Time += gap
		a.gaps[f.target.Lib] = g
	}
	_, wideAfter := f.sets[a.opts.PID]
	wideAfter = wideAfter && len(f.sets) == 1
	if wideBefore != wideAfter {
		f.switches++
	}
	a.log.Info("probe link sets switched", "lib", f.target.Lib, "path", f.target.Path, "pids_linked", sortedKeys(added), "pids_unlinked", drop,
		"every_process", wideAfter, "entry_only_gap", gap.String())
}

// SwitchGaps are the entry-only gaps of one library's link-set switches:
// how many, and their total length. A call that enters an entry-only
// probed function during a gap is not counted, and how many did is not
// known (docs/OPERATIONS.md, "Traced processes"): the time is the
// measure of what was not seen.
type SwitchGaps struct {
	Count uint64
	Time  time.Duration
}

// forgetInflight deletes the in-flight entries (keyed by pid_tgid) of
// pids from Options.Inflight's maps.
func (a *Attacher) forgetInflight(pids map[int]bool) {
	for _, m := range a.opts.Inflight {
		if m == nil {
			continue
		}
		// Keys only (NextKey): the values are not needed. Bounded by the
		// map's size: a key deleted meanwhile restarts the walk.
		var (
			k    uint64
			keys []uint64
		)
		err := m.NextKey(nil, &k)
		for n := uint32(0); err == nil && n < m.MaxEntries(); n++ {
			if pids[int(k>>32)] {
				keys = append(keys, k)
			}
			prev := k
			err = m.NextKey(&prev, &k)
		}
		if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			a.log.Warn("could not read an in-flight map", "map", m.String(), "err", err)
		}
		for _, k := range keys {
			if err := m.Delete(&k); err != nil && !isNotExist(err) {
				a.log.Warn("could not delete an in-flight entry", "map", m.String(), "pid", k>>32, "err", err)
			}
		}
	}
}

func isNotExist(err error) bool { return err != nil && errors.Is(err, ebpf.ErrKeyNotExist) }

func sortedKeys[V any](m map[int]V) []int {
	out := make([]int, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// unprobedOf is f's /status list of processes left unprobed.
func (a *Attacher) unprobedOf(f *attached) []Unprobed {
	var out []Unprobed
	for _, pid := range sortedKeys(f.unprobed) {
		if tr := f.unprobed[pid]; tr == quarantinedTenant {
			out = append(out, Unprobed{PID: pid, Reason: ReasonQuarantined})
		} else {
			out = append(out, Unprobed{PID: pid, Reason: ReasonTraced, TracerPID: tr})
		}
	}
	for _, pid := range a.setsCapped(f) {
		out = append(out, Unprobed{PID: pid, Reason: ReasonLinkCap})
	}
	return out
}

// setsCapped are the processes whose per-process set of f a link cap
// refused, in order.
func (a *Attacher) setsCapped(f *attached) []int {
	var out []int
	for k := range a.linkCapped {
		if k.file == f.target.Key && k.pid > 0 && !k.upgrade {
			out = append(out, k.pid)
		}
	}
	slices.Sort(out)
	return out
}

// probedPIDs are the PID filters of f's per-process sets; nil while one
// set serves every process.
func (a *Attacher) probedPIDs(f *attached) []int {
	if len(f.sets) == 1 && f.sets[a.opts.PID] != nil && len(f.unprobed) == 0 {
		return nil
	}
	out := sortedKeys(f.sets)
	if out == nil {
		out = []int{}
	}
	return out
}

// mergeTracers adds b's entries to a (either may be nil).
func mergeTracers(a, b map[int]int) map[int]int {
	if len(b) == 0 {
		return a
	}
	if a == nil {
		a = map[int]int{}
	}
	for pid, tr := range b {
		a[pid] = tr
	}
	return a
}

// probed reports whether a link set of f serves pid.
func (a *Attacher) probed(f *attached, pid int) bool {
	return a.tracerOf(&f.target, pid) == 0 && (f.sets[pid] != nil || f.sets[0] != nil)
}
