package aggregate

import (
	"reflect"
	"testing"

	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/ops"
)

// Replays times what their graph runs, child graphs included, on the
// replay's stream, device and phase; captured launches are apart; replays
// of an unknown graph count no kernel. Expectations by hand from the keys.
func TestGraphExpansion(t *testing.T) {
	const pid = 7
	src := newFakeSource()
	launch := uint32(ops.OpCudaLaunchKernel)
	copyOp, setOp := uint32(ops.OpCudaMemcpyAsync), uint32(ops.OpCudaMemsetAsync)
	child := uint32(ops.OpCudaGraphAddChildGraphNode)
	// Eager: 5 launches; captured: 3 launch calls.
	src.launch[bpfobj.ProfiLaunchKey{Pid: pid, Op: launch, Dev: bpfobj.DevNone}] = bpfobj.ProfiLaunchVal{Count: 5}
	src.launch[bpfobj.ProfiLaunchKey{Pid: pid, Op: launch, Stream: 0x50, Dev: bpfobj.DevNone, Captured: 1}] = bpfobj.ProfiLaunchVal{Count: 3}
	src.agg[bpfobj.ProfiAggKey{Pid: pid, Op: uint32(ops.OpCudaGraphLaunch), Dev: bpfobj.DevNone, Stream: 0x60}] = bpfobj.ProfiAggVal{Count: 14}
	node := func(graph uint64, op, typ uint32, fn uint64, kind uint32, count, bytes uint64) {
		src.nodes[bpfobj.ProfiGraphNodeKey{Pid: pid, Op: op, Graph: graph, Func: fn, Kind: kind, Type: typ}] = bpfobj.ProfiGraphNodeVal{Count: count, Bytes: bytes, GridBlocks: 2 * count}
	}
	// Graph 1: 3 kernels, a 100-byte h2d copy, a 10-byte set, child graph 2 twice.
	node(1, launch, uint32(bpfobj.GraphNodeKernel), 0, 0, 3, 0)
	node(1, copyOp, uint32(bpfobj.GraphNodeMemcpy), 0, 1, 1, 100)
	node(1, setOp, uint32(bpfobj.GraphNodeMemset), 0, 0, 1, 10)
	node(1, child, uint32(bpfobj.GraphNodeChild), 2, 0, 2, 0)
	// Graph 2: 4 kernels and a 7-byte d2h copy.
	node(2, launch, uint32(bpfobj.GraphNodeKernel), 0, 0, 4, 0)
	node(2, copyOp, uint32(bpfobj.GraphNodeMemcpy), 0, 2, 1, 7)
	src.replays[bpfobj.ProfiReplayKey{Pid: pid, Dev: bpfobj.DevNone, Graph: 1, Stream: 0x60, Phase: uint32(bpfobj.PhaseDecode)}] = 10
	src.replays[bpfobj.ProfiReplayKey{Pid: pid, Dev: bpfobj.DevNone, Graph: 0, Stream: 0x60}] = 4
	src.quotas[pid] = bpfobj.ProfiPidQuota{Graphs: 2, Execs: 1}
	a := New(Options{Source: src, Procs: newFakeProcs(map[int]fakeProc{pid: {"python3", 1}})})
	if err := a.Drain(); err != nil {
		t.Fatal(err)
	}
	p := a.Snapshot().Processes[0]
	anon := Kernel{Name: "anonymous", Class: "other"}
	if want := map[Kernel]Launch{anon: {Count: 5}}; !reflect.DeepEqual(p.Launches, want) {
		t.Errorf("Launches = %v, want %v", p.Launches, want)
	}
	if want := map[Kernel]Launch{anon: {Count: 3}}; !reflect.DeepEqual(p.Captured, want) {
		t.Errorf("Captured = %v, want %v", p.Captured, want)
	}
	// 10 replays x (3 + 2 x 4) kernels; geometry likewise.
	decode := Kernel{Name: "anonymous", Class: "other", Phase: "decode"}
	if want := map[Kernel]Launch{decode: {Count: 110, GridBlocks: 220}}; !reflect.DeepEqual(p.Graph, want) {
		t.Errorf("Graph = %v, want %v", p.Graph, want)
	}
	if want := map[DirStream]uint64{{"h2d", "0x60"}: 1000, {"d2h", "0x60"}: 140}; !reflect.DeepEqual(p.Memcpy, want) {
		t.Errorf("Memcpy = %v, want %v", p.Memcpy, want)
	}
	if want := map[OpStream]uint64{{"cudaMemsetAsync", "0x60"}: 100}; !reflect.DeepEqual(p.Memset, want) {
		t.Errorf("Memset = %v, want %v", p.Memset, want)
	}
	if want := (GraphStats{Graphs: 2, Execs: 1, Replays: 14, UnknownReplays: 4, Kernels: 110}); p.Graphs == nil || *p.Graphs != want {
		t.Errorf("Graphs = %+v, want %+v", p.Graphs, want)
	}
	// Launch calls: 5 eager + 3 captured on their streams; graph kernels are no calls.
	if want := map[OpStream]uint64{{"cudaLaunchKernel", "default"}: 5, {"cudaLaunchKernel", "0x50"}: 3, {"cudaGraphLaunch", "0x60"}: 14}; !reflect.DeepEqual(p.Calls, want) {
		t.Errorf("Calls = %v, want %v", p.Calls, want)
	}
}

// A graph that embeds itself (only a forged map can) is cut at the depth bound, not followed forever.
func TestGraphExpansionCycle(t *testing.T) {
	s := &graphState{nodes: map[uint64][]graphNode{
		1: {{key: bpfobj.ProfiGraphNodeKey{Type: uint32(bpfobj.GraphNodeKernel)}, val: bpfobj.ProfiGraphNodeVal{Count: 1}},
			{key: bpfobj.ProfiGraphNodeKey{Type: uint32(bpfobj.GraphNodeChild), Func: 2}, val: bpfobj.ProfiGraphNodeVal{Count: 1}}},
		2: {{key: bpfobj.ProfiGraphNodeKey{Type: uint32(bpfobj.GraphNodeChild), Func: 1}, val: bpfobj.ProfiGraphNodeVal{Count: 1}}},
	}}
	if n := len(s.flatten(1, 1, 0)); n != maxGraphDepth/2+1 {
		t.Errorf("flatten of a cycle: %d nodes, want %d", n, maxGraphDepth/2+1)
	}
}

// TestGraphStateWithoutKeys: a process whose every key was refused (a full
// map, or its quota) may still have a quota and graph nodes. It exports
// nothing, and the drain goes on (it panicked here with a GPU labeler:
// issue 17's hostile-tenant test found it on the agent before quotas).
func TestGraphStateWithoutKeys(t *testing.T) {
	src := newFakeSource()
	src.quotas[7] = bpfobj.ProfiPidQuota{Graphs: 1}
	src.nodes[bpfobj.ProfiGraphNodeKey{Pid: 7, Op: uint32(ops.OpCudaLaunchKernel), Graph: 1}] = bpfobj.ProfiGraphNodeVal{Count: 1}
	src.quotas[8] = bpfobj.ProfiPidQuota{Streams: 3}
	src.add(akey(9, ops.OpCudaMalloc, 0, 0, 0), aval(1, 10, 4096, 0))
	procs := newFakeProcs(map[int]fakeProc{7: {"a", 1}, 8: {"b", 1}, 9: {"c", 1}})
	for _, gpus := range []GPULabeler{nil, &fakeGPUs{perm: []int{0}}} {
		a := New(Options{Source: src, Procs: procs, GPUs: gpus})
		if err := a.Drain(); err != nil {
			t.Fatal(err)
		}
		var pids []int
		for _, p := range a.Snapshot().Processes {
			pids = append(pids, p.Meta.PID)
		}
		// 7 (graph nodes only) is a process without GPU labels, none with
		// them (no key names a device); 8 (a quota alone) never is.
		want := []int{7, 9}
		if gpus != nil {
			want = []int{9}
		}
		if !reflect.DeepEqual(pids, want) {
			t.Errorf("GPUs %v: processes %v, want %v", gpus, pids, want)
		}
	}
}
