package aggregate

import (
	"cmp"
	"slices"
	"time"

	"github.com/profi-dev/profi/internal/bpfobj"
)

// The series of exited processes (docs/INTERFACE.md, "Series lifecycle").
// Prometheus scrapes every 15-60 s: a process's series removed at its exit
// would lose what it did since the last scrape, and a process shorter than
// a scrape interval would never be seen. So an exited process's counters
// stay exported with their final values (gauges go: they describe a live
// process) while its container lives, and at least --gc-interval
// (Options.GCInterval) after its exit. Once its container has no live
// process and its last exit is --gc-interval old, all of the container's
// exited processes fold, in one drain, into one series per container, comm
// and GPU with pid="" (exported for PID 0).
//
// Why then and not earlier: a sum by pod, container, namespace, comm or gpu
// stays the same across a fold (the folded series take the exact values
// the pid series leave), but a counter that absorbs another one's total
// jumps, and rate() on it would count a long-lived process's work twice.
// Folding a whole container at once into a new series gives rate() a
// first sample, never a jump. Only the bounds fold earlier, the oldest
// first: MaxExitedPerContainer per container (short-lived workers, a
// crash loop), MaxLingering per node, and a PID a new process has taken
// (foldPID: two series must never share a label set).

// MaxLingering bounds the exited processes whose own series are kept, node
// wide; MaxExitedPerContainer per container. Past them the oldest fold at
// once, so a flood of short-lived processes costs folded series, bounded
// by --max-time-series, not memory. And exited processes' series only use
// the room live ones leave under --max-time-series (evictExited).
const (
	MaxLingering          = 1024
	MaxExitedPerContainer = 64
)

// lingering is an exited process whose series are still exported.
type lingering struct {
	pid   int
	at    time.Time  // when its exit was seen
	parts []*Process // its final values, one entry per GPU
}

// foldKey are the labels of a folded series.
type foldKey struct{ Namespace, Pod, Container, Comm, GPU, GPUUUID string }

// id names the folded series in --max-time-series tuples (pid foldedPID).
func (k foldKey) id() string {
	return k.Namespace + "\x00" + k.Pod + "\x00" + k.Container + "\x00" + k.Comm + "\x00" + k.GPU + "\x00" + k.GPUUUID
}

// foldedPID is the pid of the folded series' tuples: no process has it.
const foldedPID = -1

type foldedSeries struct {
	p    *Process
	last time.Time // when a process last folded into it
}

// exit keeps the final series of an exited process that was seen alive,
// then retires its latency data and forgets it.
func (a *Aggregator) exit(pid int, d *pidData, snap *Snapshot, now time.Time) {
	a.foldPID(pid, now) // its keys are another process's: the PID was reused
	if ps, known := a.procs[pid]; known {
		if a.opts.Scale != nil {
			a.estimate(ps, d) // the final values continue the exported estimate
		}
		a.exiting = pid
		parts := a.parts(ps, d, snap)
		a.exiting = 0
		for _, p := range parts {
			p.Exited = true
			p.hists, p.khists, p.CUDAInFlight = nil, nil, nil // retire keeps the histograms
			if p.NCCL != nil {
				p.NCCL.hists, p.NCCL.Oldest, p.NCCL.Straggler = nil, nil, nil
			}
		}
		if len(parts) > 0 {
			a.lingering = append(a.lingering, lingering{pid: pid, at: now, parts: parts})
		}
	}
	a.retire(pid, d)
	if !a.lingers(pid) {
		a.releaseTuples(pid) // nothing of it stays exported
	}
}

// evictExited drops the series of the oldest exited process, or else the
// folded series folded longest ago, to make room under --max-time-series
// for a live process's (admit): exited processes' series use only the
// room live ones leave. The dropped tuples count as cardinality drops.
// False when there is nothing to drop.
func (a *Aggregator) evictExited() bool {
	if len(a.lingering) > 0 {
		a.cardDrops += uint64(a.releaseTuples(a.lingering[0].pid))
		a.lingering = slices.Delete(a.lingering, 0, 1)
		return true
	}
	var oldest foldKey
	found := false
	for k, f := range a.folded {
		if !found || f.last.Before(a.folded[oldest].last) {
			oldest, found = k, true
		}
	}
	if !found {
		return false
	}
	id := oldest.id()
	for t := range a.admitted {
		if t.pid == foldedPID && t.gpu == id {
			delete(a.admitted, t)
			a.cardDrops++
		}
	}
	delete(a.folded, oldest)
	return true
}

// lingers reports whether pid's series are kept.
func (a *Aggregator) lingers(pid int) bool {
	return slices.ContainsFunc(a.lingering, func(l lingering) bool { return l.pid == pid })
}

// foldPID folds the kept series of an exited process whose PID a new
// process has taken, before the new one's series are built: two series
// must never share a label set, nor the new process's tuples be released
// with the old one's.
func (a *Aggregator) foldPID(pid int, now time.Time) {
	i := slices.IndexFunc(a.lingering, func(l lingering) bool { return l.pid == pid })
	if i < 0 {
		return
	}
	a.releaseTuples(pid)
	a.fold(a.lingering[i].parts, now)
	a.lingering = slices.Delete(a.lingering, i, i+1)
}

// exitedSeries folds the lingering processes that are due (see above),
// expires folded series, and puts both into snap.Exited.
func (a *Aggregator) exitedSeries(snap *Snapshot, now time.Time) {
	liveContainers := map[foldKey]bool{}
	for _, p := range snap.Processes {
		liveContainers[containerOf(p.Meta)] = true
	}
	// Per container: how many linger, and when the last one exited.
	count := map[foldKey]int{}
	last := map[foldKey]time.Time{}
	for _, l := range a.lingering {
		k := containerOf(l.parts[0].Meta)
		count[k]++
		if l.at.After(last[k]) {
			last[k] = l.at
		}
	}
	overNode := len(a.lingering) - MaxLingering
	kept := a.lingering[:0]
	for i, l := range a.lingering { // oldest first
		k := containerOf(l.parts[0].Meta)
		done := !liveContainers[k] && now.Sub(last[k]) >= a.opts.GCInterval
		if done || i < overNode || count[k] > MaxExitedPerContainer {
			count[k]--
			// Its slots first: the folded series may take them.
			a.releaseTuples(l.pid)
			a.fold(l.parts, now)
			continue
		}
		kept = append(kept, l)
	}
	clear(a.lingering[len(kept):])
	a.lingering = kept

	// A folded series whose container has no live process expires like the
	// retained histograms: RetainedExpiry after its last fold.
	for k, f := range a.folded {
		if !liveContainers[containerOf(f.p.Meta)] && now.Sub(f.last) >= RetainedExpiry {
			delete(a.folded, k)
			id := k.id()
			for t := range a.admitted {
				if t.pid == foldedPID && t.gpu == id {
					delete(a.admitted, t)
				}
			}
			a.expired++
		}
	}

	for _, l := range a.lingering {
		snap.Exited = append(snap.Exited, l.parts...)
	}
	folded := make([]*Process, 0, len(a.folded))
	for _, f := range a.folded {
		folded = append(folded, f.p)
	}
	slices.SortFunc(folded, func(x, y *Process) int {
		m, n := x.Meta, y.Meta
		return cmp.Or(cmp.Compare(m.Namespace, n.Namespace), cmp.Compare(m.Pod, n.Pod), cmp.Compare(m.Container, n.Container),
			cmp.Compare(m.Comm, n.Comm), cmp.Compare(m.GPU, n.GPU), cmp.Compare(m.GPUUUID, n.GPUUUID))
	})
	snap.Exited = append(snap.Exited, folded...)
}

// containerOf are the labels that say which container a process ran in
// (the pod's; comm and pid for a process outside any pod).
func containerOf(m Meta) foldKey {
	if m.Pod == "" {
		return foldKey{Comm: m.Comm}
	}
	return foldKey{Namespace: m.Namespace, Pod: m.Pod, Container: m.Container}
}

// fold adds an exited process's final values to its folded series, each
// series within --max-time-series (a refused one's data is dropped and
// counted, never added to another series).
func (a *Aggregator) fold(parts []*Process, now time.Time) {
	for _, p := range parts {
		m := p.Meta
		k := foldKey{m.Namespace, m.Pod, m.Container, m.Comm, m.GPU, m.GPUUUID}
		f := a.folded[k]
		if f == nil {
			f = &foldedSeries{p: &Process{
				Meta:   Meta{Comm: m.Comm, Namespace: m.Namespace, Pod: m.Pod, Container: m.Container, GPU: m.GPU, GPUUUID: m.GPUUUID},
				Exited: true,
				Calls:  map[OpStream]uint64{}, Errors: map[OpCode]uint64{}, Memcpy: map[DirStream]uint64{},
				Memset: map[OpStream]uint64{}, Launches: map[Kernel]Launch{}, Captured: map[Kernel]Launch{},
				Graph: map[Kernel]Launch{},
			}}
			a.folded[k] = f
		}
		f.last = now
		q, id := f.p, k.id()
		admit := func(fam seriesFamily, x, y string) bool {
			return a.admit(tuple{fam: fam, pid: foldedPID, gpu: id, a: x, b: y})
		}
		for cs, v := range p.Calls {
			if admit(famCalls, cs.Op, cs.Stream) {
				q.Calls[cs] += v
			}
		}
		for oc, v := range p.Errors {
			if admit(famErrors, oc.Op, oc.Code) {
				q.Errors[oc] += v
			}
		}
		for ds, v := range p.Memcpy {
			if admit(famMemcpy, ds.Direction, ds.Stream) {
				q.Memcpy[ds] += v
			}
		}
		for cs, v := range p.Memset {
			if admit(famMemset, cs.Op, cs.Stream) {
				q.Memset[cs] += v
			}
		}
		if p.memory && admit(famMemory, "", "") {
			q.memory = true
			q.MallocBytes += p.MallocBytes
			q.FreedBytes += p.FreedBytes
		}
		if p.hostMemory && admit(famHostMemory, "", "") {
			q.hostMemory = true
			q.MallocHostBytes += p.MallocHostBytes
		}
		foldLaunches := func(fam seriesFamily, dst, src map[Kernel]Launch) {
			for kern, l := range src {
				if admit(fam, kern.Name, kern.Class+"/"+kern.Phase) {
					addLaunch(dst, kern, bpfobj.ProfiLaunchVal{Count: l.Count, GridBlocks: l.GridBlocks, BlockThreads: l.BlockThreads, SharedBytes: l.SharedBytes})
				}
			}
		}
		foldLaunches(famLaunch, q.Launches, p.Launches)
		foldLaunches(famCaptured, q.Captured, p.Captured)
		foldLaunches(famGraphLaunch, q.Graph, p.Graph)
		if n := p.NCCL; n != nil {
			if q.NCCL == nil {
				q.NCCL = &NCCL{Calls: map[string]uint64{}, Bytes: map[string]uint64{}, Hangs: map[string]uint64{},
					CommCalls: map[CommOp]uint64{}, CommBytes: map[CommOp]uint64{}}
			}
			for op, v := range n.Calls {
				if admit(famNCCL, op, "") {
					q.NCCL.Calls[op] += v
					if b, ok := n.Bytes[op]; ok {
						q.NCCL.Bytes[op] += b
					}
					if h, ok := n.Hangs[op]; ok {
						q.NCCL.Hangs[op] += h
					}
				}
			}
			for co, v := range n.CommCalls {
				if admit(famNCCLComm, co.Op, co.Comm.ID) {
					q.NCCL.CommCalls[co] += v
					if b, ok := n.CommBytes[co]; ok {
						q.NCCL.CommBytes[co] += b
					}
				}
			}
		}
	}
}

// parts builds a process's exported entries from its map values, one per
// GPU it used (none when it has no key to export).
func (a *Aggregator) parts(ps *procState, d *pidData, snap *Snapshot) []*Process {
	graphs := a.expandGraphs(d, func(graph uint64, reason string) {
		if ps.refusedGraphs == nil {
			ps.refusedGraphs = map[uint64]bool{}
		}
		if !ps.refusedGraphs[graph] {
			ps.refusedGraphs[graph] = true
			a.graphRefused[reason]++
		}
	})
	var parts []*Process
	for _, part := range a.splitByGPU(ps, d) {
		p := a.build(ps, part.meta, part.data, snap)
		p.GPUs = part.attrs
		parts = append(parts, p)
	}
	if len(parts) == 0 {
		return nil
	}
	mergePerPID(parts)
	parts[0].Graphs = graphs
	if a.exiting == 0 {
		for _, p := range parts {
			p.IdleFor = ps.idleFor(p, snap.Time)
		}
	}
	return parts
}

// idleFor is how long process part p has launched no kernel on its GPU
// (eagerly or by a graph replay), as the drains at now see it: since its
// kernel count last grew, or since the agent first saw the process.
func (ps *procState) idleFor(p *Process, now time.Time) time.Duration {
	var n uint64
	for _, m := range []map[Kernel]Launch{p.Launches, p.Graph} {
		for _, l := range m {
			n += l.Count
		}
	}
	if ps.launched == nil {
		ps.launched = map[string]launchMark{}
	}
	m, ok := ps.launched[p.Meta.GPU]
	if !ok || m.kernels != n {
		m = launchMark{kernels: n, since: now}
		ps.launched[p.Meta.GPU] = m
	}
	return now.Sub(m.since)
}
