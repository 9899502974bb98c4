package aggregate

import (
	"fmt"
	"runtime"
	"slices"
	"sort"
	"time"

	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/ops"
)

// maxCommsPerPID bounds the communicator series of one process; calls on
// further communicators still count in the per-operation families.
const maxCommsPerPID = 16

// Communicator is an NCCL communicator as its init call described it.
type Communicator struct {
	// ID is NCCL's own hash of the ncclUniqueId (the commHash NCCL logs):
	// the same in every rank of the communicator, on every node.
	ID     string
	Rank   int
	NRanks int
}

// unknownComm labels calls on a communicator created before profi
// attached (its init was not seen).
var unknownComm = Communicator{ID: "unknown", Rank: -1, NRanks: -1}

// CommOp keys per-communicator counts.
type CommOp struct {
	Comm Communicator
	Op   string
}

// NCCL is one process's NCCL data.
type NCCL struct {
	Calls map[string]uint64 // by operation
	Bytes map[string]uint64 // by data operation (collectives and point-to-point)
	// CommCalls and CommBytes are the same per communicator (addition).
	CommCalls map[CommOp]uint64
	CommBytes map[CommOp]uint64
	// Oldest is the age of the oldest in-flight call per operation.
	Oldest map[string]time.Duration
	// Hangs counts in-flight calls that exceeded the hang timeout, once each.
	Hangs map[string]uint64
	// Straggler is the straggler ratio per operation (see stragglers).
	Straggler map[string]float64
	// Ranks is this process's position in the collective sequence of
	// each communicator whose init profi saw (sequences).
	Ranks map[Communicator]Sequence
	hists map[string]*Hist // by op; merged into Snapshot.NCCLHists
}

// ncclDataOps are the operations whose bytes are exported.
var ncclDataOps = map[ops.Op]bool{
	ops.OpNcclAllReduce: true, ops.OpNcclAllGather: true, ops.OpNcclReduceScatter: true,
	ops.OpNcclBroadcast: true, ops.OpNcclReduce: true, ops.OpNcclSend: true,
	ops.OpNcclRecv: true, ops.OpNcclAllToAll: true,
}

// CommHash is NCCL's hash of a unique id (getHash in NCCL's utils: DJB2a
// over the bytes as C chars), so the communicator label matches the
// commHash of NCCL_DEBUG=INFO logs. A C char is signed on x86-64 and
// unsigned on arm64 (AAPCS64): NCCL built for each hashes the same id to
// different values, and the agent runs on the node's architecture.
func CommHash(id []byte) uint64 {
	return commHash(id, charSigned)
}

// charSigned: whether this architecture's C char is signed.
const charSigned = runtime.GOARCH == "amd64" || runtime.GOARCH == "386"

func commHash(id []byte, signed bool) uint64 {
	h := uint64(5381)
	for _, b := range id {
		c := uint64(b)
		if signed {
			c = uint64(int64(int8(b)))
		}
		h = (h<<5 + h) ^ c
	}
	return h
}

// commOf returns a communicator's description from its init, as read
// from nccl_comms.
func commOf(c *bpfobj.ProfiNcclComm) Communicator {
	// Formatted as NCCL logs it ("commId 0x..." in its init lines).
	return Communicator{ID: fmt.Sprintf("%#x", CommHash(c.Id[:])), Rank: int(c.Rank), NRanks: int(c.Nranks)}
}

// Sequence is a rank's position in its communicator's sequence of
// collectives, which every rank calls in the same order (NCCL's rule):
// a rank that has entered fewer than the others is the one they wait for.
// Counted from the communicator's init, so only for communicators whose
// init profi saw.
type Sequence struct {
	// Entered counts the collectives called, the one in progress
	// included.
	Entered uint64
	// Returned counts those that returned to the caller: enqueued on the
	// GPU stream (host time), not completed on the GPU.
	Returned uint64
}

// ncclState is the aggregator's NCCL bookkeeping, owned by the drain.
type ncclState struct {
	comms    map[int]map[uint64]Communicator // pid -> ncclComm_t -> identity
	reported map[inflightKey]bool            // hung calls already counted
	hangs    map[int]map[string]uint64       // pid -> op -> hangs
	// Straggler windows: cumulative histograms at the last computation.
	base      map[stragglerKey]Hist
	straggler map[int]map[string]float64
	lastStrag time.Time
	stale     int
	// entered is the last Sequence.Entered exported per process and
	// communicator: a drain reads nccl_agg before nccl_inflight, so a
	// call returning in between is in neither and the sum dips by one;
	// the export never goes down.
	entered map[int]map[Communicator]uint64
}

type inflightKey struct {
	tid   uint64
	start uint64
}

type stragglerKey struct {
	pid  int
	comm string
	op   string
}

func newNCCLState() ncclState {
	return ncclState{
		comms:     map[int]map[uint64]Communicator{},
		reported:  map[inflightKey]bool{},
		hangs:     map[int]map[string]uint64{},
		base:      map[stragglerKey]Hist{},
		straggler: map[int]map[string]float64{},
		entered:   map[int]map[Communicator]uint64{},
	}
}

func (s *ncclState) forget(pid int) {
	delete(s.comms, pid)
	delete(s.hangs, pid)
	delete(s.straggler, pid)
	delete(s.entered, pid)
	for k := range s.base {
		if k.pid == pid {
			delete(s.base, k)
		}
	}
}

// commReadTries bounds the walks of nccl_comms per drain: a walk of a
// map whose keys are deleted under it (an LRU map at a process's churn
// of communicators) can abort ("iteration aborted"); the next usually
// succeeds.
const commReadTries = 3

// readComms adds the communicators of nccl_comms to the table and returns
// the keys the map held, per process (nil when no walk succeeded: the
// table is kept as it was). The map is LRU: the table keeps an entry
// after it leaves the map only while a call key names it (pruneComms).
func (a *Aggregator) readComms() (map[int]map[uint64]bool, error) {
	var err error
	for range commReadTries {
		seen := map[int]map[uint64]bool{}
		err = a.opts.Source.NCCLComms(func(k bpfobj.ProfiNcclCommKey, v *bpfobj.ProfiNcclComm) {
			pid := int(k.Pid)
			m := a.nccl.comms[pid]
			if m == nil {
				m = map[uint64]Communicator{}
				a.nccl.comms[pid] = m
			}
			m[k.Comm] = commOf(v)
			if seen[pid] == nil {
				seen[pid] = map[uint64]bool{}
			}
			seen[pid][k.Comm] = true
		})
		if err == nil {
			return seen, nil
		}
	}
	return nil, err
}

// pruneComms drops the communicators that are neither in nccl_comms
// (seen) nor named by a call key of their process: a process creating
// communicators with fresh handles grew the table without limit (issue
// 30, docs/SECURITY.md). The table is now bounded by nccl_comms and
// nccl_agg; no label is lost, since only call keys use the table.
func (a *Aggregator) pruneComms(byPID map[int]*pidData, seen map[int]map[uint64]bool) {
	for pid, m := range a.nccl.comms {
		var named map[bpfobj.ProfiNcclKey]bpfobj.ProfiNcclVal
		if d := byPID[pid]; d != nil {
			named = d.nccl
		}
		keep := map[uint64]bool{}
		for k := range named {
			keep[k.Comm] = true
		}
		for c := range m {
			if !seen[pid][c] && !keep[c] {
				delete(m, c)
			}
		}
		if len(m) == 0 {
			delete(a.nccl.comms, pid)
		}
	}
}

// buildNCCL turns one process's nccl_agg values into its NCCL data.
func (a *Aggregator) buildNCCL(p *Process, keys map[bpfobj.ProfiNcclKey]bpfobj.ProfiNcclVal) {
	if len(keys) == 0 {
		return
	}
	pid := p.Meta.PID
	g := p.Meta.GPU + "/" + p.Meta.GPUUUID
	n := &NCCL{
		Calls: map[string]uint64{}, Bytes: map[string]uint64{},
		CommCalls: map[CommOp]uint64{}, CommBytes: map[CommOp]uint64{},
		hists: map[string]*Hist{},
	}
	p.NCCL = n
	comms := map[string]bool{}
	sorted := make([]bpfobj.ProfiNcclKey, 0, len(keys))
	for k := range keys {
		sorted = append(sorted, k)
	}
	slices.SortFunc(sorted, func(x, y bpfobj.ProfiNcclKey) int {
		if x.Op != y.Op {
			return int(x.Op) - int(y.Op)
		}
		if x.Comm != y.Comm {
			if x.Comm < y.Comm {
				return -1
			}
			return 1
		}
		if x.Err != y.Err {
			return int(x.Err) - int(y.Err)
		}
		return int(int64(x.Dev) - int64(y.Dev))
	})
	for _, k := range sorted {
		v := keys[k]
		op := ops.Name(k.Op)
		p.events += v.Count
		if a.admit(tuple{fam: famNCCL, pid: pid, gpu: g, a: op}) {
			n.Calls[op] += v.Count
			if ncclDataOps[ops.Op(k.Op)] {
				n.Bytes[op] += v.Bytes
			}
		}
		if k.Err != 0 {
			if oc := (OpCode{op, fmt.Sprint(k.Err)}); a.admit(tuple{fam: famErrors, pid: pid, gpu: g, a: oc.Op, b: oc.Code}) {
				p.Errors[oc] += v.Count
			}
		}
		if v.Timed > 0 {
			mergeInto(n.hists, op, newHist(v.Timed, v.DurationNs, v.Buckets[:]))
		}
		if k.Comm == 0 {
			continue // group and init-all calls name no communicator
		}
		comm, ok := a.nccl.comms[pid][k.Comm]
		if !ok {
			comm = unknownComm
		}
		if !comms[comm.ID] && len(comms) >= maxCommsPerPID {
			continue
		}
		if !a.admit(tuple{fam: famNCCLComm, pid: pid, a: op, b: comm.ID}) {
			continue
		}
		comms[comm.ID] = true
		co := CommOp{comm, op}
		n.CommCalls[co] += v.Count
		if ncclDataOps[ops.Op(k.Op)] {
			n.CommBytes[co] += v.Bytes
		}
		if v.Timed > 0 && comm != unknownComm {
			sk := stragglerKey{pid, comm.ID, op}
			h := a.stragHists[sk]
			if h == nil {
				h = &Hist{}
				a.stragHists[sk] = h
			}
			h.add(newHist(v.Timed, v.DurationNs, v.Buckets[:]))
		}
	}
}

// watchInflight finds hung NCCL calls: the oldest in-flight call per
// (process, operation), and every call older than the hang timeout,
// counted once per call (a call is its thread and start time). It
// returns the collectives in progress per process and ncclComm_t.
func (a *Aggregator) watchInflight(procs map[int]*Process, now uint64) (map[int]map[uint64]uint64, error) {
	seen := map[inflightKey]bool{}
	stale := 0
	colls := map[int]map[uint64]uint64{}
	err := a.opts.Source.NCCLInflight(func(tid uint64, c *bpfobj.ProfiNcclCall) {
		p := procs[int(tid>>32)]
		if p == nil {
			return // exited: its entries are deleted
		}
		if ops.Info(ops.Op(c.Op)).Collective() && c.Comm != 0 {
			pid := int(tid >> 32)
			if colls[pid] == nil {
				colls[pid] = map[uint64]uint64{}
			}
			colls[pid][c.Comm]++
		}
		if now < c.StartNs {
			return // entered after the drain's clock was read
		}
		if p.NCCL == nil {
			p.NCCL = &NCCL{}
		}
		n := p.NCCL
		op := ops.Name(c.Op)
		age := time.Duration(now - c.StartNs)
		if n.Oldest == nil {
			n.Oldest = map[string]time.Duration{}
		}
		n.Oldest[op] = max(n.Oldest[op], age)
		if a.opts.NCCLHangTimeout <= 0 || age <= a.opts.NCCLHangTimeout {
			return
		}
		stale++
		k := inflightKey{tid, c.StartNs}
		seen[k] = true
		if a.nccl.reported[k] {
			return
		}
		a.nccl.reported[k] = true
		pid := int(tid >> 32)
		if a.nccl.hangs[pid] == nil {
			a.nccl.hangs[pid] = map[string]uint64{}
		}
		a.nccl.hangs[pid][op]++
		a.log.Warn("NCCL call hung", "pid", pid, "tid", uint32(tid), "operation", op, "age", age.Round(time.Millisecond), "timeout", a.opts.NCCLHangTimeout)
	})
	for k := range a.nccl.reported {
		if !seen[k] {
			delete(a.nccl.reported, k) // returned, or its thread exited
		}
	}
	a.nccl.stale = stale
	for pid, h := range a.nccl.hangs {
		if p := procs[pid]; p != nil {
			if p.NCCL == nil {
				p.NCCL = &NCCL{}
			}
			p.NCCL.Hangs = h
		}
	}
	return colls, err
}

// sequences sets each live process's Ranks: per communicator whose init
// was seen, the collectives that returned (nccl_agg, read first) and
// those in progress (inflight, read after), never below the last export.
// Each (process, communicator) is one tuple of --max-time-series, at most
// maxCommsPerPID per process.
func (a *Aggregator) sequences(procs map[int]*Process, byPID map[int]*pidData, inflight map[int]map[uint64]uint64) {
	for pid, p := range procs {
		comms := a.nccl.comms[pid]
		if len(comms) == 0 {
			continue
		}
		ranks := map[Communicator]Sequence{}
		add := func(handle uint64, returned, entered uint64) {
			comm, ok := comms[handle]
			if !ok || comm.Rank < 0 {
				return // created before profi attached: no position known
			}
			s, ok := ranks[comm]
			if !ok && (len(ranks) >= maxCommsPerPID || !a.admit(tuple{fam: famNCCLRank, pid: pid, a: comm.ID, b: fmt.Sprint(comm.Rank)})) {
				return
			}
			s.Returned += returned
			s.Entered += entered
			ranks[comm] = s
		}
		if d := byPID[pid]; d != nil {
			for k, v := range d.nccl {
				if k.Comm != 0 && ops.Info(ops.Op(k.Op)).Collective() {
					add(k.Comm, v.Count, v.Count)
				}
			}
		}
		for handle, n := range inflight[pid] {
			add(handle, 0, n)
		}
		if len(ranks) == 0 {
			continue
		}
		last, now := a.nccl.entered[pid], map[Communicator]uint64{}
		for comm, s := range ranks {
			s.Entered = max(s.Entered, last[comm])
			now[comm] = s.Entered
			ranks[comm] = s
		}
		a.nccl.entered[pid] = now
		if p.NCCL == nil {
			p.NCCL = &NCCL{}
		}
		p.NCCL.Ranks = ranks
	}
}

// stragglers computes, every StragglerInterval, each process's p95 NCCL
// latency over the window since the last computation divided by the
// median p95 of its peers: the other processes on this node in the same
// communicator, same operation. A peer group needs at least 2 processes
// with at least 10 calls each in the window; a process in several
// communicators gets its largest ratio per operation.
func (a *Aggregator) stragglers(procs map[int]*Process, now time.Time) {
	if now.Sub(a.nccl.lastStrag) >= a.opts.StragglerInterval {
		a.nccl.lastStrag = now
		type member struct {
			pid int
			p95 float64
		}
		groups := map[[2]string][]member{}
		for k, h := range a.stragHists {
			base := a.nccl.base[k]
			w := h.sub(&base)
			a.nccl.base[k] = h.clone()
			if w.Count < 10 {
				continue
			}
			g := [2]string{k.comm, k.op}
			groups[g] = append(groups[g], member{k.pid, w.Quantile(0.95, bpfobj.NCCLLatencyBoundsNs[:])})
		}
		a.nccl.straggler = map[int]map[string]float64{}
		for g, ms := range groups {
			if len(ms) < 2 {
				continue
			}
			for i, m := range ms {
				var peers []float64
				for j, o := range ms {
					if j != i {
						peers = append(peers, o.p95)
					}
				}
				med := median(peers)
				if med <= 0 {
					continue
				}
				r := m.p95 / med
				if a.nccl.straggler[m.pid] == nil {
					a.nccl.straggler[m.pid] = map[string]float64{}
				}
				a.nccl.straggler[m.pid][g[1]] = max(a.nccl.straggler[m.pid][g[1]], r)
			}
		}
	}
	for pid, s := range a.nccl.straggler {
		if p := procs[pid]; p != nil && p.NCCL != nil {
			p.NCCL.Straggler = s
		}
	}
}

func median(v []float64) float64 {
	sort.Float64s(v)
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}
