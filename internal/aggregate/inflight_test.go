package aggregate

import (
	"maps"
	"testing"
	"time"

	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/ops"
)

// The oldest timed CUDA call in progress per operation, for the Xid blast
// radius: the older of two threads' calls wins; an unsampled call is in
// progress with no age unless a sampled one of that operation has one; a
// call that entered after the drain began and an exited process's entries
// are not listed; nothing in progress leaves the map nil.
func TestCUDAInflightOldestPerOperation(t *testing.T) {
	src := newFakeSource()
	procs := newFakeProcs(map[int]fakeProc{7: {comm: "w", start: 1}})
	now := uint64(100 * time.Second)
	a := New(Options{Source: src, Procs: procs, Monotonic: func() uint64 { return now }})
	src.agg[bpfobj.ProfiAggKey{Pid: 7, Op: uint32(ops.OpCudaStreamSync)}] = bpfobj.ProfiAggVal{Count: 1}
	sync, memcpy, malloc := uint32(ops.OpCudaStreamSync), uint32(ops.OpCudaMemcpy), uint32(ops.OpCudaMalloc)
	src.cudaInflight[7<<32|7] = bpfobj.ProfiInflightCall{StartNs: now - uint64(time.Second), Op: sync, Sampled: 1}
	src.cudaInflight[7<<32|8] = bpfobj.ProfiInflightCall{StartNs: now - uint64(3*time.Second), Op: sync, Sampled: 1}
	src.cudaInflight[7<<32|9] = bpfobj.ProfiInflightCall{Op: memcpy}                                // not sampled
	src.cudaInflight[7<<32|10] = bpfobj.ProfiInflightCall{StartNs: now + 1, Op: malloc, Sampled: 1} // after the drain began
	src.cudaInflight[9<<32|9] = bpfobj.ProfiInflightCall{StartNs: 1, Op: sync, Sampled: 1}          // pid 9 is gone
	got := process(t, drain(t, a), 7).CUDAInFlight
	want := map[string]time.Duration{"cudaStreamSync": 3 * time.Second, "cudaMemcpy": UnsampledAge}
	if !maps.Equal(got, want) {
		t.Errorf("in flight %v, want %v", got, want)
	}
	clear(src.cudaInflight)
	if got := process(t, drain(t, a), 7).CUDAInFlight; got != nil {
		t.Errorf("after return: %v, want nil", got)
	}
}
