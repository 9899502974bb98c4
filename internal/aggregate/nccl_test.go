package aggregate

import (
	"encoding/hex"
	"math"
	"testing"
	"time"

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
