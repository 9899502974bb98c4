package aggregate

import (
	"encoding/hex"
	"math"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/ops"
	"github.com/profi-dev/profi/internal/testutil"
)

func TestNCCLQuantileInterpolates(t *testing.T) {
	h := Hist{Buckets: make([]uint64, len(bpfobj.NCCLLatencyBoundsNs)+1)}
	h.Buckets[0] = 50 // (0, 10us]
	h.Buckets[2] = 50 // (50us, 100us]
	h.Count = 100
	// rank 95 is the 45th of 50 in (50us, 100us]: 50 + 50*45/50 = 95 us.
	if got := h.Quantile(0.95, bpfobj.NCCLLatencyBoundsNs[:]); math.Abs(got-95e-6) > 1e-12 {
		t.Errorf("p95 = %v, want 95e-6", got)
	}
	if got := h.Quantile(0.5, bpfobj.NCCLLatencyBoundsNs[:]); math.Abs(got-10e-6) > 1e-12 {
		t.Errorf("p50 = %v, want 10e-6 (the end of the first bucket)", got)
	}
	inf := Hist{Buckets: make([]uint64, len(bpfobj.NCCLLatencyBoundsNs)+1)}
	inf.Buckets[len(inf.Buckets)-1] = 3
	inf.Count = 3
	if got := inf.Quantile(0.95, bpfobj.NCCLLatencyBoundsNs[:]); got != 1 {
		t.Errorf("p95 in +Inf = %v, want the last finite bound 1", got)
	}
	if got := (&Hist{}).Quantile(0.95, bpfobj.NCCLLatencyBoundsNs[:]); !math.IsNaN(got) {
		t.Errorf("empty p95 = %v, want NaN", got)
	}
}

func TestCommHashIsNCCLs(t *testing.T) {
	id := make([]byte, 128)
	for i := range id {
		id[i] = byte(i * 37) // high bytes exercise the signed-char extension
	}
	want, err := testutil.NCCLCommHash(hex.EncodeToString(id))
	if err != nil {
		t.Fatal(err)
	}
	if got := CommHash(id); got != want {
		t.Errorf("CommHash = %#x, want %#x", got, want)
	}
}

// A hung call is counted once however many drains see it; a new hang of
// the same thread (another start time) counts again; exited processes'
// entries count nothing.
func TestNCCLHangCountedOncePerCall(t *testing.T) {
	src := newFakeSource()
	procs := newFakeProcs(map[int]fakeProc{7: {comm: "rank", start: 1}})
	now := uint64(100 * time.Second)
	a := New(Options{Source: src, Procs: procs, NCCLHangTimeout: time.Second, Monotonic: func() uint64 { return now }})
	src.nccl[bpfobj.ProfiNcclKey{Pid: 7, Op: uint32(ops.OpNcclAllReduce)}] = bpfobj.ProfiNcclVal{Count: 1}
	tid := uint64(7)<<32 | 8
	src.inflight[tid] = bpfobj.ProfiNcclCall{StartNs: now - uint64(500*time.Millisecond), Op: uint32(ops.OpNcclAllReduce)}
	src.inflight[uint64(9)<<32|9] = bpfobj.ProfiNcclCall{StartNs: 1, Op: uint32(ops.OpNcclAllReduce)} // pid 9 is gone
	nccl := func() *NCCL { return process(t, drain(t, a), 7).NCCL }
	if n := nccl(); n.Hangs["ncclAllReduce"] != 0 || n.Oldest["ncclAllReduce"] != 500*time.Millisecond {
		t.Fatalf("before the timeout: %+v", n)
	}
	for range 3 {
		now += uint64(time.Second)
		if n := nccl(); n.Hangs["ncclAllReduce"] != 1 {
			t.Fatalf("drain at +%v: hangs %v, want 1", time.Duration(now), n.Hangs)
		}
		if s := a.Snapshot().NCCLStale; s != 1 {
			t.Fatalf("stale = %d, want 1 (the exited process's entry is not counted)", s)
		}
	}
	src.inflight[tid] = bpfobj.ProfiNcclCall{StartNs: now - uint64(2*time.Second), Op: uint32(ops.OpNcclAllReduce)}
	if n := nccl(); n.Hangs["ncclAllReduce"] != 2 {
		t.Errorf("a second hung call: hangs %v, want 2", n.Hangs)
	}
	delete(src.inflight, tid)
	if n := nccl(); n.Hangs["ncclAllReduce"] != 2 || len(n.Oldest) != 0 || a.Snapshot().NCCLStale != 0 {
		t.Errorf("after return: %+v, stale %d; want hangs kept, no oldest, stale 0", n, a.Snapshot().NCCLStale)
	}
}

// NCCL hashes the id as C chars: a byte above 0x7f is sign-extended on
// x86-64 and not on arm64, so the two architectures' NCCL log different
// commHashes for one id (hand-computed: 5381·33 = 0x2b5a5).
func TestCommHashCharSignedness(t *testing.T) {
	id := []byte{0x80}
	if got := commHash(id, true); got != 0xfffffffffffd4a25 {
		t.Errorf("signed char (x86-64): %#x, want 0xfffffffffffd4a25", got)
	}
	if got := commHash(id, false); got != 0x2b525 {
		t.Errorf("unsigned char (arm64): %#x, want 0x2b525", got)
	}
}

// A process that creates communicators with fresh handles (issue 30 item
// 4: 44 → 118 MiB in 150 s) grew the communicator table without limit:
// every handle ever read from nccl_comms (an LRU map, so older entries
// leave it) was kept until the process exited. The table now keeps what
// the map holds and what the process's NCCL call keys name, so it is
// bounded by the two maps; communicators its calls name keep their labels.
func TestCommTableBounded(t *testing.T) {
	src := newFakeSource()
	const pid = 7
	procs := newFakeProcs(map[int]fakeProc{pid: {"rank", 1}})
	a := New(Options{Source: src, Procs: procs})
	// The communicator its calls use, created first.
	used := bpfobj.ProfiNcclCommKey{Pid: pid, Comm: 0x1}
	src.comms[used] = bpfobj.ProfiNcclComm{Rank: 1, Nranks: 2}
	src.nccl[bpfobj.ProfiNcclKey{Pid: pid, Op: uint32(ops.OpNcclAllReduce), Comm: 0x1, Dev: bpfobj.DevNone}] = bpfobj.ProfiNcclVal{Count: 3}
	drain(t, a)
	// 100 drains, each finding 64 new handles in the map; the LRU map has
	// lost the older ones, the first one included.
	delete(src.comms, used)
	for d := range 100 {
		clear(src.comms)
		for i := range 64 {
			src.comms[bpfobj.ProfiNcclCommKey{Pid: pid, Comm: uint64(0x1000 + d*64 + i)}] = bpfobj.ProfiNcclComm{Rank: 0, Nranks: 2}
		}
		drain(t, a)
	}
	if n := len(a.nccl.comms[pid]); n != 64+1 {
		t.Errorf("communicator table: %d entries, want 65 (the map's 64 and the one its calls name)", n)
	}
	p := a.Snapshot().Processes[0]
	if p.NCCL == nil || len(p.NCCL.CommCalls) != 1 {
		t.Fatalf("NCCL = %+v", p.NCCL)
	}
	for co, n := range p.NCCL.CommCalls {
		if co.Comm.Rank != 1 || co.Comm.NRanks != 2 || n != 3 {
			t.Errorf("communicator calls %+v = %d, want rank 1 of 2, 3 calls", co, n)
		}
	}
}

// A walk of nccl_comms aborted by concurrent deletions ("iteration
// aborted": 30 of about 160 drains failed in issue 30) failed the whole
// drain. It is retried a bounded number of times; if every try fails the
// drain goes on with the table it had, every other map drained, and the
// failure counted.
func TestCommReadFailureDoesNotAbortDrain(t *testing.T) {
	src := newFakeSource()
	const pid = 7
	a := New(Options{Source: src, Procs: newFakeProcs(map[int]fakeProc{pid: {"rank", 1}})})
	src.comms[bpfobj.ProfiNcclCommKey{Pid: pid, Comm: 0x1}] = bpfobj.ProfiNcclComm{Rank: 1, Nranks: 2}
	src.nccl[bpfobj.ProfiNcclKey{Pid: pid, Op: uint32(ops.OpNcclAllReduce), Comm: 0x1, Dev: bpfobj.DevNone}] = bpfobj.ProfiNcclVal{Count: 3}
	src.add(akey(pid, ops.OpCudaMalloc, 0, 0, 0), aval(1, 10, 4096, 0))
	aborted := ebpf.ErrIterationAborted
	// One failed try: retried, nothing lost or counted.
	src.commsErrs = []error{aborted}
	drain(t, a)
	if got := a.Snapshot().ReadFailures["nccl_comms"]; got != 0 {
		t.Errorf("after one retried failure: %d read failures counted, want 0", got)
	}
	// Every try fails: the drain still publishes, with the calls.
	src.commsErrs = []error{aborted, aborted, aborted}
	src.add(akey(pid, ops.OpCudaMalloc, 0, 0, 0), aval(2, 10, 8192, 0))
	if err := a.Drain(); err != nil {
		t.Fatalf("drain with nccl_comms unreadable: %v", err)
	}
	s := a.Snapshot()
	if got := s.ReadFailures["nccl_comms"]; got != 1 {
		t.Errorf("read failures = %d, want 1", got)
	}
	p := s.Processes[0]
	if p.Calls[OpStream{"cudaMalloc", "default"}] != 3 {
		t.Errorf("cudaMalloc calls = %v, want 3 (the other maps drained)", p.Calls)
	}
	for co, n := range p.NCCL.CommCalls {
		if co.Comm.Rank != 1 || n != 3 {
			t.Errorf("communicator calls %+v = %d, want rank 1, 3 calls (the table kept)", co, n)
		}
	}
}

// A rank's collective sequence (issue 43 item 3): collectives that
// returned from nccl_agg (failed ones and every collective operation,
// point-to-point and group calls not), plus those in progress from
// nccl_inflight; a call returning between the two reads is in neither,
// and the export does not go down for it. A communicator whose init was
// not seen has no position.
func TestRankSequence(t *testing.T) {
	src := newFakeSource()
	const pid = 7
	procs := newFakeProcs(map[int]fakeProc{pid: {"rank", 1}})
	now := uint64(100 * time.Second)
	a := New(Options{Source: src, Procs: procs, Monotonic: func() uint64 { return now }})
	src.comms[bpfobj.ProfiNcclCommKey{Pid: pid, Comm: 0x1}] = bpfobj.ProfiNcclComm{Rank: 1, Nranks: 2}
	key := func(op ops.Op, comm uint64, err int32) bpfobj.ProfiNcclKey {
		return bpfobj.ProfiNcclKey{Pid: pid, Op: uint32(op), Comm: comm, Err: err, Dev: bpfobj.DevNone}
	}
	src.nccl[key(ops.OpNcclAllReduce, 0x1, 0)] = bpfobj.ProfiNcclVal{Count: 5}
	src.nccl[key(ops.OpNcclAllReduce, 0x1, 2)] = bpfobj.ProfiNcclVal{Count: 1}
	src.nccl[key(ops.OpNcclBroadcast, 0x1, 0)] = bpfobj.ProfiNcclVal{Count: 2}
	src.nccl[key(ops.OpNcclSend, 0x1, 0)] = bpfobj.ProfiNcclVal{Count: 3}
	src.nccl[key(ops.OpNcclGroupStart, 0, 0)] = bpfobj.ProfiNcclVal{Count: 4}
	src.nccl[key(ops.OpNcclAllReduce, 0x2, 0)] = bpfobj.ProfiNcclVal{Count: 9} // init not seen
	tid := uint64(pid)<<32 | 8
	src.inflight[tid] = bpfobj.ProfiNcclCall{StartNs: now - 1, Op: uint32(ops.OpNcclAllGather), Comm: 0x1}
	src.inflight[uint64(pid)<<32|9] = bpfobj.ProfiNcclCall{StartNs: now - 1, Op: uint32(ops.OpNcclRecv), Comm: 0x1}
	// The one communicator whose init was seen: rank 1 of 2.
	rank := func() Sequence {
		t.Helper()
		r := process(t, drain(t, a), pid).NCCL.Ranks
		for c, s := range r {
			if len(r) != 1 || c.Rank != 1 || c.NRanks != 2 || c.ID == unknownComm.ID {
				t.Fatalf("ranks %+v, want rank 1 of 2 of one known communicator", r)
			}
			return s
		}
		t.Fatal("no rank sequence")
		return Sequence{}
	}
	if got, want := rank(), (Sequence{Entered: 9, Returned: 8}); got != want {
		t.Fatalf("with an allgather in progress: %+v, want %+v", got, want)
	}
	// The allgather returned after nccl_agg was read: in neither map.
	delete(src.inflight, tid)
	if got, want := rank(), (Sequence{Entered: 9, Returned: 8}); got != want {
		t.Errorf("between the reads: %+v, want %+v (entered kept)", got, want)
	}
	src.nccl[key(ops.OpNcclAllGather, 0x1, 0)] = bpfobj.ProfiNcclVal{Count: 1}
	if got, want := rank(), (Sequence{Entered: 9, Returned: 9}); got != want {
		t.Errorf("after it returned: %+v, want %+v", got, want)
	}
}
