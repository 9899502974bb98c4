package aggregate

import (
	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/ops"
)

// CUDA graphs (docs/METRICS.md, "CUDA graphs"). BPF keeps what each graph
// runs (graph_nodes, by graph id) and how often each was replayed
// (graph_replays, by graph id, stream, device and phase); a drain
// multiplies the two here, so a replay costs one map update in BPF
// whatever the size of its graph. Both maps are cumulative and a graph's
// nodes do not change once it is replayed, so the products are
// cumulative counters too.

// GraphStats are a process's CUDA graphs, for /status, explain and top.
type GraphStats struct {
	// Graphs are the graphs profi saw built (captured or node by node)
	// and knows the content of.
	Graphs int
	// Execs are the executable graphs alive, instantiated while attached.
	Execs int
	// Replays are successful graph launches; UnknownReplays those of
	// executable graphs profi did not see built (instantiated before it
	// attached, or from a graph beyond the cap): their kernels are not
	// counted.
	Replays, UnknownReplays uint64
	// Kernels are the kernels replays ran (profi_cuda_graph_kernel_launches_total).
	Kernels uint64
}

// maxGraphDepth bounds the nesting of child graphs followed when a graph
// is expanded (a child can only be embedded once built, so real graphs
// have no cycles; a forged map could).
const maxGraphDepth = 8

// graphNode is one node key of a graph and its value.
type graphNode struct {
	key bpfobj.ProfiGraphNodeKey
	val bpfobj.ProfiGraphNodeVal
}

// graphState is one process's graph maps as read by one drain.
type graphState struct {
	nodes   map[uint64][]graphNode // by graph id
	replays map[bpfobj.ProfiReplayKey]uint64
	quota   bpfobj.ProfiPidQuota
}

// graphBytesKey are the labels of the bytes a replayed copy or set moves.
type graphBytesKey struct {
	op, kind uint32
	set      bool
	stream   uint64
	dev      uint32
}

// readGraphs reads the graph maps into each process's pidData (get
// creates it; known only looks it up).
func (a *Aggregator) readGraphs(get, known func(pid uint32) *pidData) error {
	g := func(pid uint32) *graphState {
		d := get(pid)
		if d.graph == nil {
			d.graph = &graphState{nodes: map[uint64][]graphNode{}, replays: map[bpfobj.ProfiReplayKey]uint64{}}
		}
		return d.graph
	}
	if err := a.opts.Source.GraphNodes(func(k bpfobj.ProfiGraphNodeKey, v *bpfobj.ProfiGraphNodeVal) {
		s := g(k.Pid)
		s.nodes[k.Graph] = append(s.nodes[k.Graph], graphNode{k, *v})
	}); err != nil {
		return err
	}
	if err := a.opts.Source.GraphReplays(func(k bpfobj.ProfiReplayKey, n uint64) { g(k.Pid).replays[k] += n }); err != nil {
		return err
	}
	return a.opts.Source.Quotas(func(pid uint32, q bpfobj.ProfiPidQuota) {
		// Only for processes with graph data: a quota alone makes no
		// process (every process that made a key has one, also when all
		// its keys were refused).
		if d := known(pid); d != nil && d.graph != nil {
			d.graph.quota = q
		}
	})
}

// expandGraphs turns a process's replays into the launches and bytes they
// ran: each replay key times each kernel, copy and set of its graph (child
// graphs included), on the replay's stream, device and phase. Kernels go
// to d.graphLaunch under launch keys (op and function of the node), bytes
// to d.graphBytes.
func (a *Aggregator) expandGraphs(d *pidData) *GraphStats {
	s := d.graph
	clear(d.graphLaunch)
	clear(d.graphBytes)
	if s == nil {
		return nil
	}
	st := &GraphStats{Graphs: len(s.nodes), Execs: int(s.quota.Execs)}
	flat := map[uint64][]graphNode{}
	for rk, n := range s.replays {
		st.Replays += n
		if rk.Graph == 0 {
			st.UnknownReplays += n
			continue
		}
		nodes, ok := flat[rk.Graph]
		if !ok {
			nodes = s.flatten(rk.Graph, 1, 0)
			flat[rk.Graph] = nodes
		}
		for _, nd := range nodes {
			switch nd.key.Type {
			case uint32(bpfobj.GraphNodeKernel):
				if a.opts.NoKernels {
					continue
				}
				lk := bpfobj.ProfiLaunchKey{Pid: rk.Pid, Op: nd.key.Op, Stream: rk.Stream, Func: nd.key.Func, Phase: rk.Phase, Dev: rk.Dev}
				l := d.graphLaunch[lk]
				l.Count += n * nd.val.Count
				l.GridBlocks += n * nd.val.GridBlocks
				l.BlockThreads += n * nd.val.BlockThreads
				l.SharedBytes += n * nd.val.SharedBytes
				d.graphLaunch[lk] = l
				st.Kernels += n * nd.val.Count
			case uint32(bpfobj.GraphNodeMemcpy), uint32(bpfobj.GraphNodeMemset):
				bk := graphBytesKey{op: nd.key.Op, kind: nd.key.Kind, set: nd.key.Type == uint32(bpfobj.GraphNodeMemset), stream: rk.Stream, dev: rk.Dev}
				d.graphBytes[bk] += n * nd.val.Bytes
			}
		}
	}
	return st
}

// flatten is graph's kernel, copy and set nodes with child graphs
// expanded, each count multiplied by mult (how often graph is embedded).
func (s *graphState) flatten(graph, mult uint64, depth int) []graphNode {
	var out []graphNode
	for _, nd := range s.nodes[graph] {
		if nd.key.Type != uint32(bpfobj.GraphNodeChild) {
			nd.val.Count *= mult
			nd.val.GridBlocks *= mult
			nd.val.BlockThreads *= mult
			nd.val.SharedBytes *= mult
			nd.val.Bytes *= mult
			out = append(out, nd)
			continue
		}
		if depth < maxGraphDepth && nd.key.Func != graph {
			out = append(out, s.flatten(nd.key.Func, mult*nd.val.Count, depth+1)...)
		}
	}
	return out
}

// graphBytes adds the bytes replayed copies and sets moved to p.
func (a *Aggregator) addGraphBytes(ps *procState, p *Process, d *pidData, g string) {
	for k, v := range d.graphBytes {
		if v == 0 {
			continue
		}
		stream := a.stream(ps, k.stream)
		if k.set {
			if cs := (OpStream{ops.Name(k.op), stream}); a.admit(tuple{fam: famMemset, pid: ps.meta.PID, gpu: g, a: cs.Op, b: cs.Stream}) {
				p.Memset[cs] += v
			}
			continue
		}
		if ds := (DirStream{Direction(k.kind), stream}); a.admit(tuple{fam: famMemcpy, pid: ps.meta.PID, gpu: g, a: ds.Direction, b: ds.Stream}) {
			p.Memcpy[ds] += v
		}
	}
}
