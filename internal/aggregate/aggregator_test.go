package aggregate

import (
	"errors"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/ops"
)

// fakeSource is a Source whose values are already summed over CPUs, like
// MapSource hands them out. DeletePIDs records each call and removes the
// keys, as the real maps do.
type fakeSource struct {
	agg          map[bpfobj.ProfiAggKey]bpfobj.ProfiAggVal
	launch       map[bpfobj.ProfiLaunchKey]bpfobj.ProfiLaunchVal
	nccl         map[bpfobj.ProfiNcclKey]bpfobj.ProfiNcclVal
	inflight     map[uint64]bpfobj.ProfiNcclCall
	cudaInflight map[uint64]bpfobj.ProfiInflightCall
	comms        map[bpfobj.ProfiNcclCommKey]bpfobj.ProfiNcclComm
	nodes        map[bpfobj.ProfiGraphNodeKey]bpfobj.ProfiGraphNodeVal
	replays      map[bpfobj.ProfiReplayKey]uint64
	quotas       map[uint32]bpfobj.ProfiPidQuota
	tenants      map[uint64]bpfobj.ProfiTenantQuota
	drops        [bpfobj.NumDrops]uint64
	deleted      []map[uint32]bool // one entry per DeletePIDs call
	deleteErr    error             // returned by DeletePIDs (keys are then kept)
	readErr      error             // returned by Aggregated
	// commsErrs are returned by the next NCCLComms calls, one each, after
	// handing out the entries read so far (a walk aborted midway).
	commsErrs []error
	// gcPIDs are the PIDs DeleteDead asks about; gcAlive their answers.
	gcPIDs  []uint32
	gcAlive []bool
	// unseen are BPF's notes of processes userspace never registered.
	unseen map[uint32]bpfobj.ProfiProcIdentity
	// launchers are launch_threads' entries (tid -> pid), taken by
	// Launchers.
	launchers map[uint32]uint32
}

func newFakeSource() *fakeSource {
	return &fakeSource{
		agg:          map[bpfobj.ProfiAggKey]bpfobj.ProfiAggVal{},
		launch:       map[bpfobj.ProfiLaunchKey]bpfobj.ProfiLaunchVal{},
		nccl:         map[bpfobj.ProfiNcclKey]bpfobj.ProfiNcclVal{},
		inflight:     map[uint64]bpfobj.ProfiNcclCall{},
		cudaInflight: map[uint64]bpfobj.ProfiInflightCall{},
		comms:        map[bpfobj.ProfiNcclCommKey]bpfobj.ProfiNcclComm{},
		nodes:        map[bpfobj.ProfiGraphNodeKey]bpfobj.ProfiGraphNodeVal{},
		replays:      map[bpfobj.ProfiReplayKey]uint64{},
		quotas:       map[uint32]bpfobj.ProfiPidQuota{},
	}
}

func (s *fakeSource) NCCL(fn func(bpfobj.ProfiNcclKey, *bpfobj.ProfiNcclVal)) error {
	for k, v := range s.nccl {
		fn(k, &v)
	}
	return nil
}

func (s *fakeSource) NCCLInflight(fn func(uint64, *bpfobj.ProfiNcclCall)) error {
	for k, v := range s.inflight {
		fn(k, &v)
	}
	return nil
}

func (s *fakeSource) CUDAInflight(fn func(uint64, *bpfobj.ProfiInflightCall)) error {
	for k, v := range s.cudaInflight {
		fn(k, &v)
	}
	return nil
}

func (s *fakeSource) NCCLComms(fn func(bpfobj.ProfiNcclCommKey, *bpfobj.ProfiNcclComm)) error {
	var err error
	if len(s.commsErrs) > 0 {
		err, s.commsErrs = s.commsErrs[0], s.commsErrs[1:]
	}
	for k, v := range s.comms {
		fn(k, &v)
		if err != nil {
			return err // after one entry: an aborted walk
		}
	}
	return err
}

func (s *fakeSource) Aggregated(fn func(bpfobj.ProfiAggKey, *bpfobj.ProfiAggVal)) error {
	if s.readErr != nil {
		return s.readErr
	}
	for k, v := range s.agg {
		fn(k, &v)
	}
	return nil
}

func (s *fakeSource) Launches(fn func(bpfobj.ProfiLaunchKey, *bpfobj.ProfiLaunchVal)) error {
	for k, v := range s.launch {
		fn(k, &v)
	}
	return nil
}

func (s *fakeSource) Drops() ([bpfobj.NumDrops]uint64, error) { return s.drops, nil }

func (s *fakeSource) GraphNodes(fn func(bpfobj.ProfiGraphNodeKey, *bpfobj.ProfiGraphNodeVal)) error {
	for k, v := range s.nodes {
		fn(k, &v)
	}
	return nil
}

func (s *fakeSource) GraphReplays(fn func(bpfobj.ProfiReplayKey, uint64)) error {
	for k, v := range s.replays {
		fn(k, v)
	}
	return nil
}

func (s *fakeSource) Launchers(fn func(tid, pid uint32)) error {
	for tid, pid := range s.launchers {
		fn(tid, pid)
	}
	clear(s.launchers)
	return nil
}

func (s *fakeSource) Tenants(fn func(uint64, *bpfobj.ProfiTenantQuota)) error {
	for k, v := range s.tenants {
		fn(k, &v)
	}
	return nil
}

func (s *fakeSource) Quotas(fn func(uint32, bpfobj.ProfiPidQuota)) error {
	for k, v := range s.quotas {
		fn(k, v)
	}
	return nil
}

func (s *fakeSource) DeletePIDs(pids map[uint32]bool) error {
	s.deleted = append(s.deleted, maps.Clone(pids))
	if s.deleteErr != nil {
		return s.deleteErr
	}
	maps.DeleteFunc(s.agg, func(k bpfobj.ProfiAggKey, _ bpfobj.ProfiAggVal) bool { return pids[k.Pid] })
	maps.DeleteFunc(s.launch, func(k bpfobj.ProfiLaunchKey, _ bpfobj.ProfiLaunchVal) bool { return pids[k.Pid] })
	maps.DeleteFunc(s.nccl, func(k bpfobj.ProfiNcclKey, _ bpfobj.ProfiNcclVal) bool { return pids[k.Pid] })
	maps.DeleteFunc(s.comms, func(k bpfobj.ProfiNcclCommKey, _ bpfobj.ProfiNcclComm) bool { return pids[k.Pid] })
	maps.DeleteFunc(s.inflight, func(tid uint64, _ bpfobj.ProfiNcclCall) bool { return pids[uint32(tid>>32)] })
	return nil
}

// Unseen returns what unseen notes for pid.
func (s *fakeSource) Unseen(pid uint32) (bpfobj.ProfiProcIdentity, bool) {
	id, ok := s.unseen[pid]
	return id, ok
}

// DeleteDead asks alive about each of gcPIDs and reports how many are dead.
func (s *fakeSource) DeleteDead(alive func(pid uint32) bool) (int, error) {
	s.gcAlive = s.gcAlive[:0]
	n := 0
	for _, pid := range s.gcPIDs {
		a := alive(pid)
		s.gcAlive = append(s.gcAlive, a)
		if !a {
			n++
		}
	}
	return n, nil
}

// add accumulates into a key like BPF does: values only grow.
func (s *fakeSource) add(k bpfobj.ProfiAggKey, v bpfobj.ProfiAggVal) {
	cur := s.agg[k]
	cur.Add(&v)
	s.agg[k] = cur
}

func (s *fakeSource) addLaunch(k bpfobj.ProfiLaunchKey, v bpfobj.ProfiLaunchVal) {
	cur := s.launch[k]
	cur.Add(&v)
	s.launch[k] = cur
}

type fakeProc struct {
	comm  string
	start uint64
}

// fakeProcs is the set of live processes.
type fakeProcs struct {
	live    map[int]fakeProc
	lookups map[int]int // Lookup calls per PID
	// cpu is each live thread's run time, by pid and tid.
	cpu map[[2]int]time.Duration
}

func (f *fakeProcs) ThreadCPU(pid, tid int) (time.Duration, bool) {
	d, ok := f.cpu[[2]int{pid, tid}]
	return d, ok
}

func newFakeProcs(live map[int]fakeProc) *fakeProcs {
	return &fakeProcs{live: live, lookups: map[int]int{}}
}

func (f *fakeProcs) Lookup(pid int) (string, uint64, bool) {
	f.lookups[pid]++
	p, ok := f.live[pid]
	return p.comm, p.start, ok
}

// Alive is discover.Alive: start 0 matches any start time.
func (f *fakeProcs) Alive(pid int, start uint64) bool {
	p, ok := f.live[pid]
	return ok && (start == 0 || p.start == start)
}

func akey(pid uint32, op ops.Op, kind uint32, err int32, stream uint64) bpfobj.ProfiAggKey {
	return bpfobj.ProfiAggKey{Pid: pid, Op: uint32(op), Kind: kind, Err: err, Stream: stream}
}

func lkeyPhase(pid uint32, stream uint64, phase bpfobj.Phase) bpfobj.ProfiLaunchKey {
	k := lkey(pid, stream)
	k.Phase = uint32(phase)
	return k
}

func lkey(pid uint32, stream uint64) bpfobj.ProfiLaunchKey {
	return bpfobj.ProfiLaunchKey{Pid: pid, Op: uint32(ops.OpCudaLaunchKernel), Stream: stream}
}

// aval is a value of count calls, all in bucket b, with the given sum and bytes.
func aval(count, sumNs, bytes uint64, b int) bpfobj.ProfiAggVal {
	v := bpfobj.ProfiAggVal{Count: count, Timed: count, DurationNs: sumNs, Bytes: bytes} // unsampled: every call timed
	v.Buckets[b] = count
	return v
}

func hist(sumNs uint64, buckets map[int]uint64) Hist {
	h := Hist{Buckets: make([]uint64, len(bpfobj.LatencyBoundsNs)+1)}
	for b, n := range buckets {
		h.Buckets[b] = n
		h.Count += n
	}
	h.SumNs = sumNs
	return h
}

// view is the exported part of a Process, for comparisons.
type view struct {
	Meta        Meta
	Calls       map[OpStream]uint64
	Errors      map[OpCode]uint64
	Memcpy      map[DirStream]uint64
	MallocBytes uint64
	FreedBytes  uint64
	ActiveBytes uint64
	HasMemory   bool
	Launches    map[Kernel]Launch
}

func viewOf(p *Process) view {
	return view{
		Meta: p.Meta, Calls: p.Calls, Errors: p.Errors, Memcpy: p.Memcpy,
		MallocBytes: p.MallocBytes, FreedBytes: p.FreedBytes, ActiveBytes: p.ActiveBytes(),
		HasMemory: p.HasMemory(), Launches: p.Launches,
	}
}

func hists(s *Snapshot) map[HistKey]Hist {
	out := map[HistKey]Hist{}
	for k, h := range s.Hists {
		out[k] = *h
	}
	return out
}

func drain(t *testing.T, a *Aggregator) *Snapshot {
	t.Helper()
	if err := a.Drain(); err != nil {
		t.Fatalf("Drain: %v", err)
	}
	return a.Snapshot()
}

func pidsOf(s *Snapshot) []int {
	var out []int
	for _, p := range s.Processes {
		out = append(out, p.Meta.PID)
	}
	return out
}

func process(t *testing.T, s *Snapshot, pid int) *Process {
	t.Helper()
	for _, p := range s.Processes {
		if p.Meta.PID == pid {
			return p
		}
	}
	t.Fatalf("process %d not in snapshot (have %v)", pid, pidsOf(s))
	return nil
}

func TestDrainValues(t *testing.T) {
	t.Parallel()
	const pid = 100
	meta := Meta{PID: pid, Comm: "python3"}
	type want struct {
		proc   view
		hists  map[HistKey]Hist
		events uint64
		series int
	}
	tests := []struct {
		name   string
		agg    map[bpfobj.ProfiAggKey]bpfobj.ProfiAggVal
		launch map[bpfobj.ProfiLaunchKey]bpfobj.ProfiLaunchVal
		want   want
	}{
		{
			name: "calls by operation and stream",
			agg: map[bpfobj.ProfiAggKey]bpfobj.ProfiAggVal{
				akey(pid, ops.OpCudaGraphLaunch, 0, 0, 0x7f00aa):   aval(3, 3000, 0, 0),
				akey(pid, ops.OpCudaGraphLaunch, 0, 0, 0):          aval(2, 9000, 0, 1),
				akey(pid, ops.OpCudaGraphInstantiate, 0, 0, 0):     aval(1, 2_000_000_000, 0, 13),
				akey(pid, ops.OpCudaGraphLaunch, 0, 0, 0x55d0c2a4): aval(4, 400_000, 0, 4),
			},
			want: want{
				proc: view{
					Meta: meta,
					Calls: map[OpStream]uint64{
						{"cudaGraphLaunch", "0x7f00aa"}:     3,
						{"cudaGraphLaunch", "default"}:      2,
						{"cudaGraphLaunch", "0x55d0c2a4"}:   4,
						{"cudaGraphInstantiate", "default"}: 1,
					},
					Errors: map[OpCode]uint64{}, Memcpy: map[DirStream]uint64{}, Launches: map[Kernel]Launch{},
					HasMemory: false,
				},
				hists: map[HistKey]Hist{
					{Op: "cudaGraphLaunch"}:      hist(412_000, map[int]uint64{0: 3, 1: 2, 4: 4}),
					{Op: "cudaGraphInstantiate"}: hist(2_000_000_000, map[int]uint64{13: 1}),
				},
				events: 10,
				// (no memory series: no allocation) 4 call tuples, 2 histograms
				series: 6,
			},
		},
		{
			name: "errors only for non-zero return values",
			agg: map[bpfobj.ProfiAggKey]bpfobj.ProfiAggVal{
				akey(pid, ops.OpCudaMalloc, 0, 0, 0):   aval(5, 50, 5000, 0),
				akey(pid, ops.OpCudaMalloc, 0, 2, 0):   aval(2, 20, 0, 0),
				akey(pid, ops.OpCudaMalloc, 0, 700, 0): aval(1, 10, 0, 0),
				akey(pid, ops.OpCudaFree, 0, 1, 0):     aval(3, 30, 0, 0),
			},
			want: want{
				proc: view{
					Meta: meta,
					Calls: map[OpStream]uint64{
						{"cudaMalloc", "default"}: 8,
						{"cudaFree", "default"}:   3,
					},
					Errors: map[OpCode]uint64{
						{"cudaMalloc", "2"}:   2,
						{"cudaMalloc", "700"}: 1,
						{"cudaFree", "1"}:     3,
					},
					Memcpy:      map[DirStream]uint64{},
					Launches:    map[Kernel]Launch{},
					MallocBytes: 5000, ActiveBytes: 5000, HasMemory: true,
				},
				hists: map[HistKey]Hist{
					{Op: "cudaMalloc"}: hist(80, map[int]uint64{0: 8}),
					{Op: "cudaFree"}:   hist(30, map[int]uint64{0: 3}),
				},
				events: 11,
				// memory, 2 calls, 3 errors, 2 histograms
				series: 8,
			},
		},
		{
			name: "memcpy bytes by direction",
			agg: map[bpfobj.ProfiAggKey]bpfobj.ProfiAggVal{
				akey(pid, ops.OpCudaMemcpy, 0, 0, 0):          aval(1, 1, 10, 0),
				akey(pid, ops.OpCudaMemcpy, 1, 0, 0):          aval(2, 1, 1000, 0),
				akey(pid, ops.OpCudaMemcpy, 2, 0, 0):          aval(3, 1, 2000, 0),
				akey(pid, ops.OpCudaMemcpy, 3, 0, 0):          aval(4, 1, 3000, 0),
				akey(pid, ops.OpCudaMemcpy, 4, 0, 0):          aval(5, 1, 4000, 0),
				akey(pid, ops.OpCudaMemcpy, 9, 0, 0):          aval(6, 1, 9000, 0),
				akey(pid, ops.OpCudaMemcpyAsync, 1, 0, 0xabc): aval(7, 1, 7000, 0),
				akey(pid, ops.OpCudaMemcpyAsync, 1, 0, 0):     aval(8, 1, 8000, 0),
				// A failed copy carries no bytes (BPF adds bytes on success only): no series.
				akey(pid, ops.OpCudaMemcpy, 2, 11, 0): aval(1, 1, 0, 0),
			},
			want: want{
				proc: view{
					Meta: meta,
					Calls: map[OpStream]uint64{
						{"cudaMemcpy", "default"}:      22,
						{"cudaMemcpyAsync", "0xabc"}:   7,
						{"cudaMemcpyAsync", "default"}: 8,
					},
					Errors: map[OpCode]uint64{{"cudaMemcpy", "11"}: 1},
					Memcpy: map[DirStream]uint64{
						{"h2h", "default"}:     10,
						{"h2d", "default"}:     9000, // cudaMemcpy 1000 + cudaMemcpyAsync 8000
						{"d2h", "default"}:     2000,
						{"d2d", "default"}:     3000,
						{"default", "default"}: 4000,
						{"unknown", "default"}: 9000,
						{"h2d", "0xabc"}:       7000,
					},
					Launches:  map[Kernel]Launch{},
					HasMemory: false,
				},
				hists: map[HistKey]Hist{
					{Op: "cudaMemcpy"}:      hist(7, map[int]uint64{0: 22}),
					{Op: "cudaMemcpyAsync"}: hist(2, map[int]uint64{0: 15}),
				},
				events: 37,
				// (no memory series: no allocation) 3 calls, 1 error, 7 memcpy, 2 histograms
				series: 13,
			},
		},
		{
			name: "allocated, freed and active bytes",
			agg: map[bpfobj.ProfiAggKey]bpfobj.ProfiAggVal{
				akey(pid, ops.OpCudaMalloc, 0, 0, 0):           aval(2, 2, 1<<20, 0),
				akey(pid, ops.OpCudaMallocAsync, 0, 0, 0x30):   aval(1, 1, 4096, 0),
				akey(pid, ops.OpCudaFree, 0, 0, 0):             aval(1, 1, 1<<19, 0),
				akey(pid, ops.OpCudaFreeAsync, 0, 0, 0x30):     aval(1, 1, 1024, 0),
				akey(pid, ops.OpCudaMemcpy, 1, 0, 0):           aval(1, 1, 1<<30, 0), // not memory
				akey(pid, ops.OpCudaGraphInstantiate, 0, 0, 0): aval(1, 1, 0, 0),
			},
			want: want{
				proc: view{
					Meta: meta,
					Calls: map[OpStream]uint64{
						{"cudaMalloc", "default"}:           2,
						{"cudaMallocAsync", "0x30"}:         1,
						{"cudaFree", "default"}:             1,
						{"cudaFreeAsync", "0x30"}:           1,
						{"cudaMemcpy", "default"}:           1,
						{"cudaGraphInstantiate", "default"}: 1,
					},
					Errors:      map[OpCode]uint64{},
					Memcpy:      map[DirStream]uint64{{"h2d", "default"}: 1 << 30},
					Launches:    map[Kernel]Launch{},
					MallocBytes: 1<<20 + 4096, FreedBytes: 1<<19 + 1024, ActiveBytes: 1<<20 + 4096 - 1<<19 - 1024,
					HasMemory: true,
				},
				hists: map[HistKey]Hist{
					{Op: "cudaMalloc"}:           hist(2, map[int]uint64{0: 2}),
					{Op: "cudaMallocAsync"}:      hist(1, map[int]uint64{0: 1}),
					{Op: "cudaFree"}:             hist(1, map[int]uint64{0: 1}),
					{Op: "cudaFreeAsync"}:        hist(1, map[int]uint64{0: 1}),
					{Op: "cudaMemcpy"}:           hist(1, map[int]uint64{0: 1}),
					{Op: "cudaGraphInstantiate"}: hist(1, map[int]uint64{0: 1}),
				},
				events: 7,
				// memory, 6 calls, 1 memcpy, 6 histograms
				series: 14,
			},
		},
		{
			name: "frees of earlier allocations never make active memory negative",
			agg: map[bpfobj.ProfiAggKey]bpfobj.ProfiAggVal{
				akey(pid, ops.OpCudaMalloc, 0, 0, 0): aval(1, 1, 100, 0),
				akey(pid, ops.OpCudaFree, 0, 0, 0):   aval(2, 1, 400, 0),
			},
			want: want{
				proc: view{
					Meta:        meta,
					Calls:       map[OpStream]uint64{{"cudaMalloc", "default"}: 1, {"cudaFree", "default"}: 2},
					Errors:      map[OpCode]uint64{},
					Memcpy:      map[DirStream]uint64{},
					Launches:    map[Kernel]Launch{},
					MallocBytes: 100, FreedBytes: 400, ActiveBytes: 0, HasMemory: true,
				},
				hists: map[HistKey]Hist{
					{Op: "cudaMalloc"}: hist(1, map[int]uint64{0: 1}),
					{Op: "cudaFree"}:   hist(1, map[int]uint64{0: 2}),
				},
				events: 3,
				series: 5,
			},
		},
		{
			name: "launches with grid, threads and shared memory",
			launch: map[bpfobj.ProfiLaunchKey]bpfobj.ProfiLaunchVal{
				lkey(pid, 0x40): {Count: 10, GridBlocks: 1000, BlockThreads: 2560, SharedBytes: 4096},
				lkey(pid, 0):    {Count: 2, GridBlocks: 8, BlockThreads: 64, SharedBytes: 0},
			},
			want: want{
				proc: view{
					Meta: meta,
					Calls: map[OpStream]uint64{
						{"cudaLaunchKernel", "0x40"}:    10,
						{"cudaLaunchKernel", "default"}: 2,
					},
					Errors: map[OpCode]uint64{}, Memcpy: map[DirStream]uint64{},
					Launches:  map[Kernel]Launch{{Name: "anonymous", Class: "other"}: {Count: 12, GridBlocks: 1008, BlockThreads: 2624, SharedBytes: 4096}},
					HasMemory: false,
				},
				// Anonymous launches are counted, never timed.
				hists:  map[HistKey]Hist{},
				events: 12,
				// (no memory series: no allocation) 2 calls, 1 launch
				series: 3,
			},
		},
		{
			name: "launches by NVTX phase",
			launch: map[bpfobj.ProfiLaunchKey]bpfobj.ProfiLaunchVal{
				lkey(pid, 0):                              {Count: 2, GridBlocks: 2, BlockThreads: 64},
				lkeyPhase(pid, 0, bpfobj.PhasePrefill):    {Count: 3, GridBlocks: 3, BlockThreads: 96},
				lkeyPhase(pid, 0x40, bpfobj.PhasePrefill): {Count: 1, GridBlocks: 1, BlockThreads: 32},
				lkeyPhase(pid, 0, bpfobj.PhaseOther):      {Count: 4, GridBlocks: 4, BlockThreads: 128},
				lkeyPhase(pid, 0, 99):                     {Count: 5, GridBlocks: 5, BlockThreads: 160}, // out of range: other
			},
			want: want{
				proc: view{
					Meta: meta,
					Calls: map[OpStream]uint64{
						{"cudaLaunchKernel", "0x40"}:    1,
						{"cudaLaunchKernel", "default"}: 14,
					},
					Errors: map[OpCode]uint64{}, Memcpy: map[DirStream]uint64{},
					Launches: map[Kernel]Launch{
						{Name: "anonymous", Class: "other"}:                   {Count: 2, GridBlocks: 2, BlockThreads: 64},
						{Name: "anonymous", Class: "other", Phase: "prefill"}: {Count: 4, GridBlocks: 4, BlockThreads: 128},
						{Name: "anonymous", Class: "other", Phase: "other"}:   {Count: 9, GridBlocks: 9, BlockThreads: 288},
					},
				},
				hists:  map[HistKey]Hist{},
				events: 15,
				// 2 calls, 3 launch label sets
				series: 5,
			},
		},
		{
			name: "operation ids out of range are unknown",
			agg: map[bpfobj.ProfiAggKey]bpfobj.ProfiAggVal{
				akey(pid, ops.NumOps+5, 0, 0, 0):  aval(1, 5, 0, 0),
				akey(pid, ops.OpUnknown, 0, 0, 0): aval(2, 5, 0, 0),
			},
			want: want{
				proc: view{
					Meta:   meta,
					Calls:  map[OpStream]uint64{{"unknown", "default"}: 3},
					Errors: map[OpCode]uint64{}, Memcpy: map[DirStream]uint64{}, Launches: map[Kernel]Launch{},
					HasMemory: false,
				},
				hists:  map[HistKey]Hist{{Op: "unknown"}: hist(10, map[int]uint64{0: 3})},
				events: 3,
				series: 2,
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			src := newFakeSource()
			maps.Copy(src.agg, tc.agg)
			maps.Copy(src.launch, tc.launch)
			a := New(Options{Source: src, Procs: newFakeProcs(map[int]fakeProc{pid: {"python3", 1}})})
			s := drain(t, a)
			if len(s.Processes) != 1 {
				t.Fatalf("processes = %v, want [%d]", pidsOf(s), pid)
			}
			if got := viewOf(s.Processes[0]); !reflect.DeepEqual(got, tc.want.proc) {
				t.Errorf("process:\n got %+v\nwant %+v", got, tc.want.proc)
			}
			if got := hists(s); !reflect.DeepEqual(got, tc.want.hists) {
				t.Errorf("hists:\n got %+v\nwant %+v", got, tc.want.hists)
			}
			if s.Events != tc.want.events {
				t.Errorf("Events = %d, want %d", s.Events, tc.want.events)
			}
			if s.Series != tc.want.series {
				t.Errorf("Series = %d, want %d", s.Series, tc.want.series)
			}
			if s.CardinalityDrops != 0 {
				t.Errorf("CardinalityDrops = %d, want 0", s.CardinalityDrops)
			}
			if len(src.deleted) != 0 {
				t.Errorf("DeletePIDs called for a live process: %v", src.deleted)
			}
			// A second drain of unchanged maps publishes the same values.
			s2 := drain(t, a)
			if got := viewOf(process(t, s2, pid)); !reflect.DeepEqual(got, tc.want.proc) {
				t.Errorf("second drain process:\n got %+v\nwant %+v", got, tc.want.proc)
			}
			if got := hists(s2); !reflect.DeepEqual(got, tc.want.hists) {
				t.Errorf("second drain hists:\n got %+v\nwant %+v", got, tc.want.hists)
			}
		})
	}
}

func TestDrainCopiesDrops(t *testing.T) {
	t.Parallel()
	src := newFakeSource()
	for i := range src.drops {
		src.drops[i] = uint64(i+1) * 10
	}
	a := New(Options{Source: src, Procs: newFakeProcs(nil)})
	s := drain(t, a)
	if s.Drops != src.drops {
		t.Errorf("Drops = %v, want %v", s.Drops, src.drops)
	}
	if len(s.Processes) != 0 || len(s.Hists) != 0 || s.Events != 0 || s.Series != 0 {
		t.Errorf("empty maps gave %+v", s)
	}
}

func TestProcessMetadataReadOnce(t *testing.T) {
	t.Parallel()
	src := newFakeSource()
	src.add(akey(7, ops.OpCudaMalloc, 0, 0, 0), aval(1, 1, 1, 0))
	procs := newFakeProcs(map[int]fakeProc{7: {"trainer", 99}})
	a := New(Options{Source: src, Procs: procs})
	for range 3 {
		drain(t, a)
	}
	if procs.lookups[7] != 1 {
		t.Errorf("Lookup(7) called %d times, want 1", procs.lookups[7])
	}
	if got := process(t, a.Snapshot(), 7).Meta; got != (Meta{PID: 7, Comm: "trainer"}) {
		t.Errorf("Meta = %+v", got)
	}
}

func TestExitedProcess(t *testing.T) {
	t.Parallel()
	src := newFakeSource()
	procs := newFakeProcs(map[int]fakeProc{100: {"a", 1}, 200: {"b", 2}})
	a := New(Options{Source: src, Procs: procs})

	src.add(akey(100, ops.OpCudaMalloc, 0, 0, 0), aval(2, 20, 64, 1))
	src.add(akey(200, ops.OpCudaMalloc, 0, 0, 0), aval(3, 30, 32, 2))
	src.add(akey(200, ops.OpCudaMalloc, 0, 2, 0), aval(1, 10, 0, 0))
	src.addLaunch(lkey(200, 0), bpfobj.ProfiLaunchVal{Count: 5})

	s1 := drain(t, a)
	if got := pidsOf(s1); !slices.Equal(got, []int{100, 200}) {
		t.Fatalf("processes = %v, want [100 200]", got)
	}
	wantH1 := map[HistKey]Hist{{Op: "cudaMalloc"}: hist(60, map[int]uint64{0: 1, 1: 2, 2: 3})}
	if got := hists(s1); !reflect.DeepEqual(got, wantH1) {
		t.Errorf("drain 1 hists = %+v, want %+v", got, wantH1)
	}
	if s1.Events != 11 {
		t.Errorf("drain 1 Events = %d, want 11", s1.Events)
	}
	// 100: memory, calls; 200: memory, calls, error, launch, launch calls; one histogram.
	if s1.Series != 8 {
		t.Errorf("drain 1 Series = %d, want 8", s1.Series)
	}

	// 200 makes more calls, then exits before the next drain.
	src.add(akey(200, ops.OpCudaMalloc, 0, 0, 0), aval(4, 4000, 16, 5))
	src.addLaunch(lkey(200, 0), bpfobj.ProfiLaunchVal{Count: 1})
	delete(procs.live, 200)

	s2 := drain(t, a)
	if got := pidsOf(s2); !slices.Equal(got, []int{100}) {
		t.Errorf("processes after exit = %v, want [100]", got)
	}
	if want := []map[uint32]bool{{200: true}}; !reflect.DeepEqual(src.deleted, want) {
		t.Errorf("DeletePIDs calls = %v, want %v", src.deleted, want)
	}
	// The exited process's latency data stays, including what it did after drain 1.
	wantH2 := map[HistKey]Hist{{Op: "cudaMalloc"}: hist(4060, map[int]uint64{0: 1, 1: 2, 2: 3, 5: 4})}
	if got := hists(s2); !reflect.DeepEqual(got, wantH2) {
		t.Errorf("drain 2 hists = %+v, want %+v", got, wantH2)
	}
	if s2.Events != 16 {
		t.Errorf("drain 2 Events = %d, want 16", s2.Events)
	}
	// 200's series stay, with its final values, for --gc-interval
	// (exited.go): its tuples too.
	if s2.Series != 8 {
		t.Errorf("drain 2 Series = %d, want 8", s2.Series)
	}
	if len(s2.Exited) != 1 || s2.Exited[0].Meta.PID != 200 || !s2.Exited[0].Exited ||
		s2.Exited[0].Calls[OpStream{"cudaMalloc", "default"}] != 8 || s2.Exited[0].Launches[Kernel{Name: "anonymous", Class: "other"}].Count != 6 {
		t.Errorf("drain 2 exited = %+v, want pid 200 with 8 calls and 6 launches", s2.Exited)
	}

	// Nothing more to delete; nothing goes backwards.
	s3 := drain(t, a)
	if len(src.deleted) != 1 {
		t.Errorf("DeletePIDs called %d times, want 1", len(src.deleted))
	}
	if got := hists(s3); !reflect.DeepEqual(got, wantH2) {
		t.Errorf("drain 3 hists = %+v, want %+v", got, wantH2)
	}
	if s3.Events != 16 || s3.Series != 8 {
		t.Errorf("drain 3 Events, Series = %d, %d; want 16, 8", s3.Events, s3.Series)
	}
}

func TestProcessExitedBeforeFirstDrain(t *testing.T) {
	t.Parallel()
	src := newFakeSource()
	src.add(akey(300, ops.OpCudaFree, 0, 0, 0), aval(2, 2000, 8, 3))
	src.addLaunch(lkey(300, 0x9), bpfobj.ProfiLaunchVal{Count: 4})
	a := New(Options{Source: src, Procs: newFakeProcs(nil)})

	s := drain(t, a)
	if len(s.Processes) != 0 {
		t.Errorf("processes = %v, want none", pidsOf(s))
	}
	if want := []map[uint32]bool{{300: true}}; !reflect.DeepEqual(src.deleted, want) {
		t.Errorf("DeletePIDs calls = %v, want %v", src.deleted, want)
	}
	want := map[HistKey]Hist{{Op: "cudaFree"}: hist(2000, map[int]uint64{3: 2})}
	if got := hists(s); !reflect.DeepEqual(got, want) {
		t.Errorf("hists = %+v, want %+v", got, want)
	}
	if s.Events != 6 || s.Series != 1 {
		t.Errorf("Events, Series = %d, %d; want 6, 1", s.Events, s.Series)
	}
}

func TestPIDReuse(t *testing.T) {
	t.Parallel()
	src := newFakeSource()
	procs := newFakeProcs(map[int]fakeProc{100: {"old", 1000}})
	a := New(Options{Source: src, Procs: procs})

	src.add(akey(100, ops.OpCudaMalloc, 0, 0, 0), aval(5, 50, 500, 0))
	s1 := drain(t, a)
	if got := process(t, s1, 100); got.Meta.Comm != "old" || got.Calls[OpStream{"cudaMalloc", "default"}] != 5 {
		t.Fatalf("drain 1: %+v", viewOf(got))
	}

	// The old process exits and a new one gets its PID: Alive(100, 1000) is false.
	procs.live[100] = fakeProc{"new", 2000}
	s2 := drain(t, a)
	if len(s2.Processes) != 0 {
		t.Errorf("drain 2 processes = %v, want none (old process gone)", pidsOf(s2))
	}
	if want := []map[uint32]bool{{100: true}}; !reflect.DeepEqual(src.deleted, want) {
		t.Errorf("DeletePIDs calls = %v, want %v", src.deleted, want)
	}

	// The new process starts counting from zero under its own comm.
	src.add(akey(100, ops.OpCudaMalloc, 0, 0, 0), aval(2, 20, 64, 0))
	s3 := drain(t, a)
	want := view{
		Meta:   Meta{PID: 100, Comm: "new"},
		Calls:  map[OpStream]uint64{{"cudaMalloc", "default"}: 2},
		Errors: map[OpCode]uint64{}, Memcpy: map[DirStream]uint64{}, Launches: map[Kernel]Launch{},
		MallocBytes: 64, ActiveBytes: 64, HasMemory: true,
	}
	if got := viewOf(process(t, s3, 100)); !reflect.DeepEqual(got, want) {
		t.Errorf("new process:\n got %+v\nwant %+v", got, want)
	}
	wantH := map[HistKey]Hist{{Op: "cudaMalloc"}: hist(70, map[int]uint64{0: 7})}
	if got := hists(s3); !reflect.DeepEqual(got, wantH) {
		t.Errorf("hists = %+v, want %+v", got, wantH)
	}
	if s3.Events != 7 {
		t.Errorf("Events = %d, want 7", s3.Events)
	}
}

func TestMaxStreamsPerPID(t *testing.T) {
	t.Parallel()
	const pid = 100
	src := newFakeSource()
	a := New(Options{Source: src, Procs: newFakeProcs(map[int]fakeProc{pid: {"p", 1}}), MaxStreamsPerPID: 2})

	// Two streams fill the cap; the default stream does not count.
	src.add(akey(pid, ops.OpCudaMemcpyAsync, 1, 0, 0), aval(1, 1, 100, 0))
	src.add(akey(pid, ops.OpCudaMemcpyAsync, 1, 0, 0xa), aval(2, 1, 200, 0))
	src.add(akey(pid, ops.OpCudaMemcpyAsync, 1, 0, 0xb), aval(3, 1, 300, 0))
	s1 := drain(t, a)
	wantCalls := map[OpStream]uint64{
		{"cudaMemcpyAsync", "default"}: 1,
		{"cudaMemcpyAsync", "0xa"}:     2,
		{"cudaMemcpyAsync", "0xb"}:     3,
	}
	if got := process(t, s1, pid).Calls; !reflect.DeepEqual(got, wantCalls) {
		t.Errorf("drain 1 calls = %v, want %v", got, wantCalls)
	}

	// New streams beyond the cap collapse into "other", never "default";
	// admitted streams and the default stream keep their labels.
	src.add(akey(pid, ops.OpCudaMemcpyAsync, 1, 0, 0xc), aval(4, 1, 400, 0))
	src.add(akey(pid, ops.OpCudaMemcpyAsync, 1, 0, 0xd), aval(5, 1, 500, 0))
	src.add(akey(pid, ops.OpCudaMemcpyAsync, 2, 0, 0xd), aval(1, 1, 50, 0))
	src.add(akey(pid, ops.OpCudaMemcpyAsync, 1, 0, 0), aval(6, 1, 600, 0))
	src.add(akey(pid, ops.OpCudaMallocAsync, 0, 0, 0xe), aval(1, 1, 64, 0))
	src.addLaunch(lkey(pid, 0xf), bpfobj.ProfiLaunchVal{Count: 7})
	src.addLaunch(lkey(pid, 0xa), bpfobj.ProfiLaunchVal{Count: 8})
	s2 := drain(t, a)
	p := process(t, s2, pid)
	wantCalls = map[OpStream]uint64{
		{"cudaMemcpyAsync", "default"}: 7,
		{"cudaMemcpyAsync", "0xa"}:     2,
		{"cudaMemcpyAsync", "0xb"}:     3,
		{"cudaMemcpyAsync", "other"}:   10,
		{"cudaMallocAsync", "other"}:   1,
		{"cudaLaunchKernel", "other"}:  7,
		{"cudaLaunchKernel", "0xa"}:    8,
	}
	if !reflect.DeepEqual(p.Calls, wantCalls) {
		t.Errorf("drain 2 calls = %v, want %v", p.Calls, wantCalls)
	}
	wantMemcpy := map[DirStream]uint64{
		{"h2d", "default"}: 700,
		{"h2d", "0xa"}:     200,
		{"h2d", "0xb"}:     300,
		{"h2d", "other"}:   900,
		{"d2h", "other"}:   50,
	}
	if !reflect.DeepEqual(p.Memcpy, wantMemcpy) {
		t.Errorf("drain 2 memcpy = %v, want %v", p.Memcpy, wantMemcpy)
	}
}

// TestStreamOtherFromBPF: keys BPF folded into bpfobj.StreamOther (streams
// beyond the cap it admitted) are labelled "other", together with what
// userspace folds, and take no admitted stream's place: a real stream
// read after them still gets its own label.
func TestStreamOtherFromBPF(t *testing.T) {
	t.Parallel()
	const pid = 100
	src := newFakeSource()
	a := New(Options{Source: src, Procs: newFakeProcs(map[int]fakeProc{pid: {"p", 1}}), MaxStreamsPerPID: 1})
	src.add(akey(pid, ops.OpCudaMemcpyAsync, 1, 0, bpfobj.StreamOther), aval(5, 1, 500, 0))
	src.addLaunch(lkey(pid, bpfobj.StreamOther), bpfobj.ProfiLaunchVal{Count: 7})
	drain(t, a)
	src.add(akey(pid, ops.OpCudaMemcpyAsync, 1, 0, 0xa), aval(2, 1, 200, 0))
	p := process(t, drain(t, a), pid)
	want := map[OpStream]uint64{
		{"cudaMemcpyAsync", "other"}:  5,
		{"cudaMemcpyAsync", "0xa"}:    2,
		{"cudaLaunchKernel", "other"}: 7,
	}
	if !reflect.DeepEqual(p.Calls, want) {
		t.Errorf("calls = %v, want %v", p.Calls, want)
	}
}

func TestMaxStreamsPerPIDIsPerProcess(t *testing.T) {
	t.Parallel()
	src := newFakeSource()
	a := New(Options{Source: src, Procs: newFakeProcs(map[int]fakeProc{1: {"a", 1}, 2: {"b", 1}}), MaxStreamsPerPID: 1})
	src.add(akey(1, ops.OpCudaGraphLaunch, 0, 0, 0x10), aval(1, 1, 0, 0))
	src.add(akey(2, ops.OpCudaGraphLaunch, 0, 0, 0x20), aval(1, 1, 0, 0))
	s := drain(t, a)
	for pid, want := range map[int]map[OpStream]uint64{
		1: {{"cudaGraphLaunch", "0x10"}: 1},
		2: {{"cudaGraphLaunch", "0x20"}: 1},
	} {
		if got := process(t, s, pid).Calls; !reflect.DeepEqual(got, want) {
			t.Errorf("pid %d calls = %v, want %v", pid, got, want)
		}
	}
}

func TestMaxTimeSeries(t *testing.T) {
	t.Parallel()
	src := newFakeSource()
	procs := newFakeProcs(map[int]fakeProc{100: {"a", 1}, 200: {"b", 2}})
	clock := &fakeClock{t: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
	a := New(Options{Source: src, Procs: procs, MaxTimeSeries: 3, Now: clock.now})
	type step struct {
		pids   []int
		calls  map[int]map[OpStream]uint64
		memory map[int]bool
		hist   Hist
		drops  uint64
		series int
	}
	check := func(t *testing.T, s *Snapshot, w step) {
		t.Helper()
		if got := pidsOf(s); !slices.Equal(got, w.pids) {
			t.Fatalf("processes = %v, want %v", got, w.pids)
		}
		for _, p := range s.Processes {
			if !reflect.DeepEqual(p.Calls, w.calls[p.Meta.PID]) {
				t.Errorf("pid %d calls = %v, want %v", p.Meta.PID, p.Calls, w.calls[p.Meta.PID])
			}
			if p.HasMemory() != w.memory[p.Meta.PID] {
				t.Errorf("pid %d HasMemory = %v, want %v", p.Meta.PID, p.HasMemory(), w.memory[p.Meta.PID])
			}
		}
		want := map[HistKey]Hist{{Op: "cudaMalloc"}: w.hist}
		if got := hists(s); !reflect.DeepEqual(got, want) {
			t.Errorf("hists = %+v, want %+v", got, want)
		}
		if s.CardinalityDrops != w.drops {
			t.Errorf("CardinalityDrops = %d, want %d", s.CardinalityDrops, w.drops)
		}
		if s.Series != w.series {
			t.Errorf("Series = %d, want %d", s.Series, w.series)
		}
	}

	// 100: memory, calls{cudaMalloc, default}, histogram{cudaMalloc}: the cap.
	src.add(akey(100, ops.OpCudaMalloc, 0, 0, 0), aval(1, 10, 8, 0))
	check(t, drain(t, a), step{
		pids:   []int{100},
		calls:  map[int]map[OpStream]uint64{100: {{"cudaMalloc", "default"}: 1}},
		memory: map[int]bool{100: true},
		hist:   hist(10, map[int]uint64{0: 1}),
		series: 3,
	})

	// A new stream is a new tuple: refused, and its calls are not added to
	// the default stream. The histogram tuple exists already and keeps counting.
	src.add(akey(100, ops.OpCudaMalloc, 0, 0, 0x10), aval(5, 50, 40, 0))
	check(t, drain(t, a), step{
		pids:   []int{100},
		calls:  map[int]map[OpStream]uint64{100: {{"cudaMalloc", "default"}: 1}},
		memory: map[int]bool{100: true},
		hist:   hist(60, map[int]uint64{0: 6}),
		drops:  1,
		series: 3,
	})

	// The same refused tuple is counted once, however often it shows up.
	src.add(akey(100, ops.OpCudaMalloc, 0, 0, 0x10), aval(2, 20, 16, 0))
	check(t, drain(t, a), step{
		pids:   []int{100},
		calls:  map[int]map[OpStream]uint64{100: {{"cudaMalloc", "default"}: 1}},
		memory: map[int]bool{100: true},
		hist:   hist(80, map[int]uint64{0: 8}),
		drops:  1,
		series: 3,
	})

	// A new process: its memory and calls tuples are refused (two drops).
	src.add(akey(200, ops.OpCudaMalloc, 0, 0, 0), aval(4, 40, 4, 0))
	check(t, drain(t, a), step{
		pids:   []int{100, 200},
		calls:  map[int]map[OpStream]uint64{100: {{"cudaMalloc", "default"}: 1}, 200: {}},
		memory: map[int]bool{100: true},
		hist:   hist(120, map[int]uint64{0: 12}),
		drops:  3,
		series: 3,
	})

	// 100 exits: its series would stay (exited.go), but a live process's
	// take their room: 200's tuples fit, and 100's two dropped tuples
	// count as drops.
	delete(procs.live, 100)
	s := drain(t, a)
	check(t, s, step{
		pids:   []int{200},
		calls:  map[int]map[OpStream]uint64{200: {{"cudaMalloc", "default"}: 4}},
		memory: map[int]bool{200: true},
		hist:   hist(120, map[int]uint64{0: 12}),
		drops:  5,
		series: 3,
	})
	if want := []map[uint32]bool{{100: true}}; !reflect.DeepEqual(src.deleted, want) {
		t.Errorf("DeletePIDs calls = %v, want %v", src.deleted, want)
	}
	if len(s.Exited) != 0 {
		t.Errorf("exited %+v, want none (evicted for the live 200)", s.Exited)
	}

	// Later drains: nothing comes back, nothing more is dropped.
	clock.t = clock.t.Add(time.Minute)
	check(t, drain(t, a), step{
		pids:   []int{200},
		calls:  map[int]map[OpStream]uint64{200: {{"cudaMalloc", "default"}: 4}},
		memory: map[int]bool{200: true},
		hist:   hist(120, map[int]uint64{0: 12}),
		drops:  5,
		series: 3,
	})
}

func TestMaxTimeSeriesRefusesHistograms(t *testing.T) {
	t.Parallel()
	src := newFakeSource()
	// memory + calls{cudaFree, default} fill the cap; the histogram is refused.
	a := New(Options{Source: src, Procs: newFakeProcs(map[int]fakeProc{1: {"a", 1}}), MaxTimeSeries: 2})
	src.add(akey(1, ops.OpCudaFree, 0, 0, 0), aval(1, 10, 0, 0))
	for range 2 {
		s := drain(t, a)
		if len(s.Hists) != 0 {
			t.Errorf("hists = %+v, want none", hists(s))
		}
		if s.CardinalityDrops != 1 || s.Series != 2 {
			t.Errorf("CardinalityDrops, Series = %d, %d; want 1, 2", s.CardinalityDrops, s.Series)
		}
		if got, want := process(t, s, 1).Calls, map[OpStream]uint64{{"cudaFree", "default"}: 1}; !reflect.DeepEqual(got, want) {
			t.Errorf("calls = %v, want %v", got, want)
		}
	}
}

func TestRingDropRate(t *testing.T) {
	t.Parallel()
	src := newFakeSource()
	a := New(Options{Source: src, Procs: newFakeProcs(nil)})
	rate := func(prev, cur *Snapshot) float64 {
		dt := cur.Time.Sub(prev.Time).Seconds()
		if dt <= 0 || cur.Drops[bpfobj.DropEventsRing] < prev.Drops[bpfobj.DropEventsRing] {
			return 0
		}
		return float64(cur.Drops[bpfobj.DropEventsRing]-prev.Drops[bpfobj.DropEventsRing]) / dt
	}
	prev := drain(t, a)
	if prev.RingDropRate != 0 {
		t.Errorf("rate without drops = %v, want 0", prev.RingDropRate)
	}
	for _, tc := range []struct {
		name  string
		ring  uint64
		other uint64 // drops of another counter never count
	}{
		{"ring drops", 10, 0},
		{"no new ring drops", 10, 5},
		{"more ring drops", 250, 5},
		{"counter went backwards", 3, 5},
	} {
		src.drops[bpfobj.DropEventsRing] = tc.ring
		src.drops[bpfobj.DropAggregated] = tc.other
		cur := drain(t, a)
		if want := rate(prev, cur); cur.RingDropRate != want {
			t.Errorf("%s: RingDropRate = %v, want %v", tc.name, cur.RingDropRate, want)
		}
		prev = cur
	}
}

func TestDrainReadError(t *testing.T) {
	t.Parallel()
	src := newFakeSource()
	src.add(akey(1, ops.OpCudaFree, 0, 0, 0), aval(1, 10, 0, 0))
	a := New(Options{Source: src, Procs: newFakeProcs(map[int]fakeProc{1: {"a", 1}})})
	before := drain(t, a)
	src.readErr = errors.New("boom")
	if err := a.Drain(); !errors.Is(err, src.readErr) {
		t.Fatalf("Drain error = %v, want it to wrap %v", err, src.readErr)
	}
	if a.Snapshot() != before {
		t.Error("a failed drain replaced the snapshot")
	}
}

func TestNewPublishesEmptySnapshot(t *testing.T) {
	t.Parallel()
	s := New(Options{Source: newFakeSource(), Procs: newFakeProcs(nil)}).Snapshot()
	if s == nil || s.Hists == nil || len(s.Processes) != 0 || s.Time.IsZero() {
		t.Errorf("initial snapshot = %+v", s)
	}
}

func TestObserve(t *testing.T) {
	t.Parallel()
	var got []time.Duration
	a := New(Options{Source: newFakeSource(), Procs: newFakeProcs(nil), Observe: func(d time.Duration) { got = append(got, d) }})
	s := drain(t, a)
	if len(got) != 1 || got[0] != s.DrainDuration {
		t.Errorf("Observe got %v, want [%v]", got, s.DrainDuration)
	}
}

func TestGC(t *testing.T) {
	t.Parallel()
	src := newFakeSource()
	procs := newFakeProcs(map[int]fakeProc{1: {"a", 10}, 2: {"b", 20}})
	a := New(Options{Source: src, Procs: procs})
	src.add(akey(1, ops.OpCudaMalloc, 0, 0, 0), aval(1, 1, 8, 0))
	drain(t, a) // 1 is known with start time 10; 2 is unknown
	src.gcPIDs = []uint32{1, 2, 3}

	a.GC()
	if want := []bool{true, true, false}; !slices.Equal(src.gcAlive, want) {
		t.Errorf("alive(1, 2, 3) = %v, want %v", src.gcAlive, want)
	}
	// PID 1 reused by another process: the known process is dead.
	procs.live[1] = fakeProc{"c", 11}
	a.GC()
	if want := []bool{false, true, false}; !slices.Equal(src.gcAlive, want) {
		t.Errorf("after PID reuse alive(1, 2, 3) = %v, want %v", src.gcAlive, want)
	}
}

func TestDirection(t *testing.T) {
	t.Parallel()
	tests := []struct {
		kind uint32
		want string
	}{
		{0, "h2h"}, {1, "h2d"}, {2, "d2h"}, {3, "d2d"}, {4, "default"},
		{5, "unknown"}, {9, "unknown"}, {1<<32 - 1, "unknown"},
	}
	for _, tc := range tests {
		if got := Direction(tc.kind); got != tc.want {
			t.Errorf("Direction(%d) = %q, want %q", tc.kind, got, tc.want)
		}
	}
}

// TestDeleteFailureDoesNotRetireTwice: when DeletePIDs fails, the exited
// process's keys are read again at the next drain; they must not be folded
// into the retained histograms (and Events) a second time.
func TestDeleteFailureDoesNotRetireTwice(t *testing.T) {
	t.Parallel()
	src := newFakeSource()
	procs := newFakeProcs(map[int]fakeProc{1: {"a", 1}})
	a := New(Options{Source: src, Procs: procs})
	src.add(akey(1, ops.OpCudaFree, 0, 0, 0), aval(3, 30, 0, 0))
	drain(t, a)
	delete(procs.live, 1)
	src.deleteErr = errors.New("map busy")
	drain(t, a)
	src.deleteErr = nil
	s := drain(t, a)
	want := map[HistKey]Hist{{Op: "cudaFree"}: hist(30, map[int]uint64{0: 3})}
	if got := hists(s); !reflect.DeepEqual(got, want) {
		t.Errorf("hists = %+v, want %+v", got, want)
	}
	if s.Events != 3 {
		t.Errorf("Events = %d, want 3", s.Events)
	}
}

// TestMonotonic drives random workloads (calls, exits, PID reuse) and checks
// that nothing exported without a pid label ever goes backwards and that
// DeletePIDs is asked only for processes that are gone.
func TestMonotonic(t *testing.T) {
	t.Parallel()
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 42))
		src := newFakeSource()
		procs := newFakeProcs(map[int]fakeProc{})
		a := New(Options{Source: src, Procs: procs, MaxStreamsPerPID: 2})
		starts := uint64(1)
		var (
			prevH      = map[HistKey]Hist{}
			prevEvents uint64
			total      uint64 // calls made so far, launches included
			timed      uint64 // calls made so far that reach the histograms
		)
		ops := []ops.Op{ops.OpCudaMalloc, ops.OpCudaFree, ops.OpCudaMemcpy, ops.OpCudaGraphLaunch}
		for step := range 200 {
			for range rng.IntN(4) {
				pid := 1 + rng.IntN(5)
				if _, ok := procs.live[pid]; !ok {
					starts++
					procs.live[pid] = fakeProc{"p", starts}
				}
				n := uint64(1 + rng.IntN(3))
				total += n
				if rng.IntN(4) == 0 {
					src.addLaunch(lkey(uint32(pid), uint64(rng.IntN(4))), bpfobj.ProfiLaunchVal{Count: n})
					continue
				}
				k := akey(uint32(pid), ops[rng.IntN(len(ops))], uint32(rng.IntN(6)), int32(rng.IntN(2)), uint64(rng.IntN(4)))
				timed += n
				src.add(k, aval(n, n*100, n, rng.IntN(14)))
			}
			if rng.IntN(5) == 0 {
				// A process exits; sometimes its PID is reused at once.
				pid := 1 + rng.IntN(5)
				delete(procs.live, pid)
				if rng.IntN(2) == 0 {
					starts++
					procs.live[pid] = fakeProc{"q", starts}
				}
			}
			ndel := len(src.deleted)
			s := drain(t, a)
			for _, d := range src.deleted[ndel:] {
				for pid := range d {
					for _, p := range s.Processes {
						if p.Meta.PID == int(pid) {
							t.Fatalf("seed %d step %d: pid %d deleted but exported", seed, step, pid)
						}
					}
				}
			}
			if s.Events != total || s.Events < prevEvents {
				t.Fatalf("seed %d step %d: Events = %d (previous %d), want %d", seed, step, s.Events, prevEvents, total)
			}
			cur := hists(s)
			var count uint64
			for k, h := range cur {
				p := prevH[k]
				for i := range p.Buckets { // none for a new histogram
					if h.Buckets[i] < p.Buckets[i] {
						t.Fatalf("seed %d step %d: %v bucket %d went from %d to %d", seed, step, k, i, p.Buckets[i], h.Buckets[i])
					}
				}
				if h.SumNs < p.SumNs || h.Count < p.Count {
					t.Fatalf("seed %d step %d: %v went backwards: %+v -> %+v", seed, step, k, p, h)
				}
				count += h.Count
			}
			for k := range prevH {
				if _, ok := cur[k]; !ok {
					t.Fatalf("seed %d step %d: histogram %v disappeared", seed, step, k)
				}
			}
			if count != timed {
				t.Fatalf("seed %d step %d: histogram counts sum to %d, want %d", seed, step, count, timed)
			}
			prevH, prevEvents = cur, s.Events
		}
	}
}

// With a duty-cycled operation, each drain's increase is scaled and the
// estimates add up; unscaled operations stay exact; the retained latency
// data of the exited process continues the estimate (never goes back).
func TestDrainScalesDutyCycledCounts(t *testing.T) {
	src := newFakeSource()
	procs := newFakeProcs(map[int]fakeProc{7: {comm: "w", start: 1}})
	scale := 1.0
	a := New(Options{Source: src, Procs: procs, Scale: func(pid int, op ops.Op) float64 {
		if op == ops.OpCudaMemcpyAsync {
			return scale
		}
		return 1
	}})
	memcpy := akey(7, ops.OpCudaMemcpyAsync, 1, 0, 0)
	malloc := akey(7, ops.OpCudaMalloc, 0, 0, 0)
	calls := func(s *Snapshot, op string) uint64 { return process(t, s, 7).Calls[OpStream{op, "default"}] }

	src.add(memcpy, aval(10, 1000, 100, 2))
	src.add(malloc, aval(3, 30, 300, 1))
	s := drain(t, a)
	if got := calls(s, "cudaMemcpyAsync"); got != 10 {
		t.Fatalf("exact phase: memcpy calls = %d, want 10", got)
	}
	scale = 4 // a sampling ratio of 0.25
	src.add(memcpy, aval(5, 500, 50, 2))
	src.add(malloc, aval(2, 20, 200, 1))
	s = drain(t, a)
	if got := calls(s, "cudaMemcpyAsync"); got != 10+5*4 {
		t.Errorf("scaled: memcpy calls = %d, want 30", got)
	}
	if got := process(t, s, 7).Memcpy[DirStream{"h2d", "default"}]; got != 100+50*4 {
		t.Errorf("scaled: memcpy bytes = %d, want 300", got)
	}
	if got := calls(s, "cudaMalloc"); got != 5 {
		t.Errorf("malloc calls = %d, want the exact 5", got)
	}
	want := hists(s)[HistKey{Op: "cudaMemcpyAsync"}]
	if want.Count != 30 || want.Buckets[2] != 30 || want.SumNs != 1000+500*4 {
		t.Errorf("scaled histogram = %+v, want count 30 in bucket 2, sum 3000", want)
	}
	delete(procs.live, 7)
	s = drain(t, a)
	if got := hists(s)[HistKey{Op: "cudaMemcpyAsync"}]; !reflect.DeepEqual(got, want) {
		t.Errorf("after exit: histogram = %+v, want the estimate %+v kept", got, want)
	}
}
