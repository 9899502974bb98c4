package aggregate

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/ops"
)

// fakeGPUs maps (pid, device) to labels: ordinal n is GPU perm[n]; no
// cudaSetDevice is GPU perm[0] (the default device).
type fakeGPUs struct {
	perm    []int
	forgot  []int
	answers int
}

func (f *fakeGPUs) GPU(pid int, _ uint64, dev uint32) (string, string, string) {
	f.answers++
	src := "cudaSetDevice"
	if dev == bpfobj.DevNone {
		dev, src = 0, "default"
	}
	g := f.perm[dev]
	return fmt.Sprint(g), fmt.Sprintf("GPU-%d", g), src
}

func (f *fakeGPUs) Forget(pid int) { f.forgot = append(f.forgot, pid) }

// TestGPUSplit: a process's calls become one entry per GPU, devices with
// the same GPU share it, histograms carry the gpu label, frees count on
// their allocation's device (the key BPF wrote), and per-communicator
// NCCL series are exported once.
func TestGPUSplit(t *testing.T) {
	src := newFakeSource()
	gpus := &fakeGPUs{perm: []int{2, 0, 1}}
	a := New(Options{Source: src, Procs: newFakeProcs(map[int]fakeProc{7: {"train", 1}}), GPUs: gpus})
	k := func(op ops.Op, dev uint32) bpfobj.ProfiAggKey {
		key := akey(7, op, 0, 0, 0)
		key.Dev = dev
		return key
	}
	src.add(k(ops.OpCudaMemset, bpfobj.DevNone), aval(3, 30, 0, 0)) // default device: GPU 2
	src.add(k(ops.OpCudaMemset, 0), aval(4, 40, 0, 0))              // ordinal 0: GPU 2 too
	src.add(k(ops.OpCudaMemset, 1), aval(5, 50, 0, 1))              // GPU 0
	src.add(k(ops.OpCudaMalloc, 2), aval(1, 10, 4096, 0))           // GPU 1
	src.add(k(ops.OpCudaFree, 2), aval(1, 10, 1024, 0))
	lk := lkey(7, 0)
	lk.Dev = 1
	src.addLaunch(lk, bpfobj.ProfiLaunchVal{Count: 6})
	for dev, comm := range map[uint32]uint64{1: 0xc1, 2: 0xc2} {
		src.nccl[bpfobj.ProfiNcclKey{Pid: 7, Op: uint32(ops.OpNcclAllReduce), Comm: comm, Dev: dev}] = bpfobj.ProfiNcclVal{Count: 2, Bytes: 8}
	}
	if err := a.Drain(); err != nil {
		t.Fatal(err)
	}
	s := a.Snapshot()
	type entry struct {
		GPU, UUID string
		GPUs      []GPUAttribution
		Calls     map[OpStream]uint64
		Malloc    uint64
		Launches  uint64
		NCCLCalls map[string]uint64
		CommCalls int
	}
	var got []entry
	for _, p := range s.Processes {
		e := entry{GPU: p.Meta.GPU, UUID: p.Meta.GPUUUID, GPUs: p.GPUs, Calls: p.Calls, Malloc: p.ActiveBytes()}
		for _, l := range p.Launches {
			e.Launches += l.Count
		}
		if p.NCCL != nil {
			e.NCCLCalls, e.CommCalls = p.NCCL.Calls, len(p.NCCL.CommCalls)
		}
		got = append(got, e)
	}
	want := []entry{
		{GPU: "0", UUID: "GPU-0", GPUs: []GPUAttribution{{1, "cudaSetDevice"}},
			Calls: map[OpStream]uint64{{"cudaMemset", "default"}: 5, {"cudaLaunchKernel", "default"}: 6}, Launches: 6,
			NCCLCalls: map[string]uint64{"ncclAllReduce": 2}, CommCalls: 1}, // both communicators unknown: one series
		{GPU: "1", UUID: "GPU-1", GPUs: []GPUAttribution{{2, "cudaSetDevice"}},
			Calls: map[OpStream]uint64{{"cudaMalloc", "default"}: 1, {"cudaFree", "default"}: 1}, Malloc: 3072,
			NCCLCalls: map[string]uint64{"ncclAllReduce": 2}, CommCalls: 0},
		{GPU: "2", UUID: "GPU-2", GPUs: []GPUAttribution{{0, "cudaSetDevice"}, {-1, "default"}},
			Calls: map[OpStream]uint64{{"cudaMemset", "default"}: 7}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("entries:\n got %+v\nwant %+v", got, want)
	}
	if n := s.Processes[0].NCCL.CommCalls[CommOp{unknownComm, "ncclAllReduce"}]; n != 4 {
		t.Errorf("per-communicator calls on the first entry = %d, want 4 (both GPUs)", n)
	}
	if h := s.Hists[HistKey{Op: "cudaMemset", GPU: "2"}]; h == nil || h.Count != 7 {
		t.Errorf("cudaMemset histogram on gpu 2 = %+v, want 7 calls", h)
	}

	// The process exits: its histograms are retained under their GPUs.
	delete(a.opts.Procs.(*fakeProcs).live, 7)
	if err := a.Drain(); err != nil {
		t.Fatal(err)
	}
	s = a.Snapshot()
	if len(s.Processes) != 0 {
		t.Errorf("exited process still exported: %d entries", len(s.Processes))
	}
	if h := s.Hists[HistKey{Op: "cudaMemset", GPU: "0"}]; h == nil || h.Count != 5 {
		t.Errorf("retained cudaMemset histogram on gpu 0 = %+v, want 5 calls", h)
	}
	if !reflect.DeepEqual(gpus.forgot, []int{7}) {
		t.Errorf("Forget calls = %v, want [7]", gpus.forgot)
	}
}

// Without a GPULabeler, every device of a process is one entry with empty
// GPU labels, as before GPU attribution.
func TestGPUNoLabeler(t *testing.T) {
	src := newFakeSource()
	a := New(Options{Source: src, Procs: newFakeProcs(map[int]fakeProc{7: {"train", 1}})})
	for _, dev := range []uint32{0, 1, bpfobj.DevNone} {
		key := akey(7, ops.OpCudaMemset, 0, 0, 0)
		key.Dev = dev
		src.add(key, aval(2, 20, 0, 0))
	}
	if err := a.Drain(); err != nil {
		t.Fatal(err)
	}
	s := a.Snapshot()
	if len(s.Processes) != 1 || s.Processes[0].Calls[OpStream{"cudaMemset", "default"}] != 6 || s.Processes[0].GPUs != nil {
		t.Errorf("processes = %+v", s.Processes)
	}
}
