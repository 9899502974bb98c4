package aggregate

import (
	"reflect"
	"strconv"
	"testing"
	"time"

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

// hostileGraphs is a process's graph maps built for TestGraphExpansionBounds.
type hostileGraphs struct {
	src *fakeSource
	pid uint32
}

// kernel adds n kernel nodes of function fn (grid 3 blocks each) and a
// 10-byte host-to-device copy to graph g.
func (h hostileGraphs) kernel(g, fn, n uint64) {
	h.src.nodes[bpfobj.ProfiGraphNodeKey{Pid: h.pid, Op: uint32(ops.OpCudaLaunchKernel), Graph: g, Func: fn, Type: uint32(bpfobj.GraphNodeKernel)}] = bpfobj.ProfiGraphNodeVal{Count: n, GridBlocks: 3 * n}
	h.src.nodes[bpfobj.ProfiGraphNodeKey{Pid: h.pid, Op: uint32(ops.OpCudaMemcpyAsync), Graph: g, Kind: 1, Type: uint32(bpfobj.GraphNodeMemcpy)}] = bpfobj.ProfiGraphNodeVal{Count: 1, Bytes: 10}
}

// child embeds graph c in graph g n times.
func (h hostileGraphs) child(g, c, n uint64) {
	h.src.nodes[bpfobj.ProfiGraphNodeKey{Pid: h.pid, Op: uint32(ops.OpCudaGraphAddChildGraphNode), Graph: g, Func: c, Type: uint32(bpfobj.GraphNodeChild)}] = bpfobj.ProfiGraphNodeVal{Count: n}
}

// replay replays graph g n times on stream.
func (h hostileGraphs) replay(g, stream, n uint64) {
	h.src.replays[bpfobj.ProfiReplayKey{Pid: h.pid, Dev: bpfobj.DevNone, Graph: g, Stream: stream}] += n
	h.src.agg[bpfobj.ProfiAggKey{Pid: h.pid, Op: uint32(ops.OpCudaGraphLaunch), Dev: bpfobj.DevNone, Stream: stream}] = bpfobj.ProfiAggVal{Count: 1}
}

// TestGraphExpansionBounds: a process writes its own graph maps (issue 30
// item 1). Child graphs that multiply (8 graphs that each embed every
// other one expanded to 6,725,601 kernels per replay and a 17 s drain),
// cycles, nesting past the depth bound and more work than a drain may do
// are refused, counted per graph and reason, with their replays in
// RefusedReplays; a victim process's graphs in the same drain, and
// legitimate graphs as deep and as multiplied as the bounds allow, are
// expanded exactly. Expectations from the shapes, by hand.
func TestGraphExpansionBounds(t *testing.T) {
	const victim = 9
	for _, tc := range []struct {
		name  string
		build func(h hostileGraphs)
		// kernels and bytes of the hostile process's replays, replays refused,
		// refusals by reason.
		kernels, bytes, refused uint64
		reasons                 map[string]uint64
	}{{
		name: "complete graph of 8: each embeds every other one",
		build: func(h hostileGraphs) {
			for g := uint64(1); g <= 8; g++ {
				h.kernel(g, 0x100, 1)
				for c := uint64(1); c <= 8; c++ {
					if c != g {
						h.child(g, c, 1)
					}
				}
			}
			h.replay(1, 0x60, 1)
		},
		refused: 1, reasons: map[string]uint64{GraphRefusedCycle: 1},
	}, {
		name: "self-embedding graph and a two-graph cycle",
		build: func(h hostileGraphs) {
			h.kernel(1, 0x100, 1)
			h.child(1, 1, 1)
			h.child(2, 3, 1)
			h.child(3, 2, 1)
			h.replay(1, 0x60, 2)
			h.replay(2, 0x60, 3)
		},
		refused: 5, reasons: map[string]uint64{GraphRefusedCycle: 2},
	}, {
		// Graph i embeds every graph j > i 1000 times: 1001^7 nodes per
		// replay of graph 1, past 2^64 (the old expansion wrapped).
		name: "dense DAG of 8, 1000 times each",
		build: func(h hostileGraphs) {
			for g := uint64(1); g <= 8; g++ {
				h.kernel(g, 0x100, 1)
				for c := g + 1; c <= 8; c++ {
					h.child(g, c, 1000)
				}
			}
			h.replay(1, 0x60, 1)
		},
		refused: 1, reasons: map[string]uint64{GraphRefusedNodes: 1},
	}, {
		// The same DAG twice each: graph i runs 3^(8-i) kernels (1 + 2 x the
		// sum of its successors'), so graph 1: 2187 kernels and copies.
		name: "dense DAG of 8, twice each (legitimate)",
		build: func(h hostileGraphs) {
			for g := uint64(1); g <= 8; g++ {
				h.kernel(g, 0x100, 1)
				for c := g + 1; c <= 8; c++ {
					h.child(g, c, 2)
				}
			}
			h.replay(1, 0x60, 5)
		},
		kernels: 5 * 2187, bytes: 5 * 2187 * 10, reasons: map[string]uint64{},
	}, {
		// A chain of 9 graphs: 8 levels of child graphs, the bound.
		name: "chain at the depth bound",
		build: func(h hostileGraphs) {
			for g := uint64(1); g <= 9; g++ {
				h.kernel(g, 0x100, 1)
				if g < 9 {
					h.child(g, g+1, 1)
				}
			}
			h.replay(1, 0x60, 4)
		},
		kernels: 4 * 9, bytes: 4 * 9 * 10, reasons: map[string]uint64{},
	}, {
		name: "chain past the depth bound",
		build: func(h hostileGraphs) {
			for g := uint64(1); g <= 10; g++ {
				h.kernel(g, 0x100, 1)
				if g < 10 {
					h.child(g, g+1, 1)
				}
			}
			h.replay(1, 0x60, 4)
			h.replay(2, 0x60, 3) // 8 levels below it: expanded
		},
		kernels: 3 * 9, bytes: 3 * 9 * 10, refused: 4, reasons: map[string]uint64{GraphRefusedDepth: 1},
	}, {
		// One graph of 1023 kernel functions and a copy (1024 node keys)
		// replayed once on each of 300 streams: the expansion itself costs
		// 1024, each replay key 1024, so 255 streams (the lowest handles)
		// are expanded and 45 refused.
		name: "work bound",
		build: func(h hostileGraphs) {
			for fn := uint64(1); fn <= 1023; fn++ {
				h.kernel(1, fn, 1)
			}
			for s := uint64(1); s <= 300; s++ {
				h.replay(1, 0x1000+s, 1)
			}
		},
		kernels: 255 * 1023, bytes: 255 * 10, refused: 45, reasons: map[string]uint64{GraphRefusedWork: 1},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			src := newFakeSource()
			tc.build(hostileGraphs{src, 7})
			// The victim: graph 1 runs 2 kernels and its child graph 2 (3
			// kernels) twice, replayed 10 times.
			v := hostileGraphs{src, victim}
			v.kernel(1, 0x200, 2)
			v.kernel(2, 0x200, 3)
			v.child(1, 2, 2)
			v.replay(1, 0x70, 10)
			a := New(Options{Source: src, Procs: newFakeProcs(map[int]fakeProc{7: {"hostile", 1}, victim: {"victim", 1}})})
			began := time.Now()
			if err := a.Drain(); err != nil {
				t.Fatal(err)
			}
			t.Logf("drain: %v", time.Since(began))
			got := map[int]*Process{}
			for _, p := range a.Snapshot().Processes {
				got[p.Meta.PID] = p
			}
			if p := got[victim]; p == nil || p.Graphs == nil || p.Graphs.Kernels != 80 || p.Memcpy[DirStream{"h2d", "0x70"}] != 10*(10+2*10) {
				t.Errorf("victim: %+v", p)
			}
			h := got[7]
			if h == nil || h.Graphs == nil {
				t.Fatalf("hostile process: %+v", h)
			}
			if h.Graphs.Kernels != tc.kernels || h.Graphs.RefusedReplays != tc.refused {
				t.Errorf("hostile: kernels %d, refused replays %d; want %d, %d", h.Graphs.Kernels, h.Graphs.RefusedReplays, tc.kernels, tc.refused)
			}
			var bytes uint64
			for _, b := range h.Memcpy {
				bytes += b
			}
			if bytes != tc.bytes {
				t.Errorf("hostile: %d bytes, want %d", bytes, tc.bytes)
			}
			if !reflect.DeepEqual(a.Snapshot().GraphRefusals, tc.reasons) {
				t.Errorf("refusals %v, want %v", a.Snapshot().GraphRefusals, tc.reasons)
			}
			// A graph is counted once, not once per drain.
			if err := a.Drain(); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(a.Snapshot().GraphRefusals, tc.reasons) {
				t.Errorf("second drain: refusals %v, want %v", a.Snapshot().GraphRefusals, tc.reasons)
			}
		})
	}
}

// The node's bound (issue 47 item 3): the work-bound graph of
// TestGraphExpansionBounds (1,024 node keys, replayed on 300 streams) in
// each of procs processes. With four, each gets maxGraphWork: 255 streams
// expanded, as alone. With eight, each gets an eighth of
// maxNodeGraphWork, 131,072: 1,024 for the expansion and 1,024 per
// replay key, so 127 streams each, 173 refused, each graph counted once
// as node_work. Worked out by hand.
func TestGraphExpansionNodeBound(t *testing.T) {
	for _, tc := range []struct {
		procs, streams int
		reason         string
	}{{4, 255, GraphRefusedWork}, {8, 127, GraphRefusedNodeWork}} {
		t.Run(strconv.Itoa(tc.procs), func(t *testing.T) {
			src := newFakeSource()
			live := map[int]fakeProc{}
			for p := range tc.procs {
				h := hostileGraphs{src, uint32(100 + p)}
				for fn := uint64(1); fn <= 1023; fn++ {
					h.kernel(1, fn, 1)
				}
				for s := uint64(1); s <= 300; s++ {
					h.replay(1, 0x1000+s, 1)
				}
				live[100+p] = fakeProc{"graphs", 1}
			}
			a := New(Options{Source: src, Procs: newFakeProcs(live)})
			if err := a.Drain(); err != nil {
				t.Fatal(err)
			}
			for _, p := range a.Snapshot().Processes {
				if g := p.Graphs; g == nil || g.Kernels != uint64(tc.streams*1023) || g.RefusedReplays != uint64(300-tc.streams) {
					t.Errorf("pid %d: %+v, want %d kernels, %d refused replays", p.Meta.PID, g, tc.streams*1023, 300-tc.streams)
				}
			}
			if got := a.Snapshot().GraphRefusals; !reflect.DeepEqual(got, map[string]uint64{tc.reason: uint64(tc.procs)}) {
				t.Errorf("refusals %v, want %s: %d", got, tc.reason, tc.procs)
			}
		})
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
