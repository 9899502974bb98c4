package aggregate

import (
	"math"
	"math/bits"
	"sort"

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
	// RefusedReplays are replays of graphs whose expansion profi refused
	// (a cycle, nesting, size or work past its bounds): their kernels,
	// copies and sets are not counted.
	RefusedReplays uint64
	// Kernels are the kernels replays ran (profi_cuda_graph_kernel_launches_total).
	Kernels uint64
}

// Expansion bounds (issue 30, docs/SECURITY.md): a process writes its own
// graph maps, and child graphs multiply, so an unbounded expansion is
// exponential (8 graphs that each embed every other one: 6.7 million
// kernels per replay, 17 s per drain). Each graph is expanded once per
// drain (memoised: nodes merged by key, counts multiplied with saturating
// arithmetic); a graph whose expansion passes a bound is refused, its
// replays counted as refused (GraphStats.RefusedReplays) and the graph
// once in profi_system_graph_expansions_refused_total{reason}.
const (
	// maxGraphDepth bounds the nesting of child graphs (levels below the
	// replayed graph).
	maxGraphDepth = 8
	// maxGraphNodes bounds the kernel, copy and set nodes one replay of
	// a graph runs, child graphs expanded (real graphs: thousands).
	maxGraphNodes = 1 << 20
	// maxGraphWork bounds a process's expansion work per drain: node keys
	// merged into their parents' plus keys added for its replays (each
	// of those is an entry of the drain's graph tables).
	maxGraphWork = 1 << 18
	// maxNodeGraphWork bounds the expansion work of all processes per
	// drain (issue 47 item 3: many processes with moderate graphs add up):
	// four processes at maxGraphWork. Past four processes with graphs,
	// each gets an equal share of it (graphWorkShare).
	maxNodeGraphWork = 1 << 20
)

// graphWorkShare is each process's expansion work bound for a drain in
// which procs processes have graphs: maxGraphWork, or an equal share of
// maxNodeGraphWork when that is less.
func graphWorkShare(procs int) int {
	if procs <= 0 || procs*maxGraphWork <= maxNodeGraphWork {
		return maxGraphWork
	}
	return max(maxNodeGraphWork/procs, 1)
}

// Reasons a graph's expansion is refused (the reason label).
const (
	GraphRefusedCycle = "cycle" // a graph that embeds itself, directly or not (only a process's own forged calls make one)
	GraphRefusedDepth = "depth" // child graphs nested deeper than maxGraphDepth
	GraphRefusedNodes = "nodes" // more than maxGraphNodes nodes per replay
	GraphRefusedWork  = "work"  // the process's expansion work for this drain used up
	// GraphRefusedNodeWork: the process's share of the node's expansion
	// work for this drain used up (more than four processes with graphs).
	GraphRefusedNodeWork = "node_work"
)

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
// to d.graphBytes. Replays of a graph whose expansion is refused add
// nothing; refused (if not nil) is told each such graph and why.
func (a *Aggregator) expandGraphs(d *pidData, refused func(graph uint64, reason string)) *GraphStats {
	s := d.graph
	clear(d.graphLaunch)
	clear(d.graphBytes)
	if s == nil {
		return nil
	}
	st := &GraphStats{Graphs: len(s.nodes), Execs: int(s.quota.Execs)}
	// Replay keys in a fixed order: which replays the work bound refuses
	// must not change from drain to drain.
	keys := make([]bpfobj.ProfiReplayKey, 0, len(s.replays))
	for rk := range s.replays {
		keys = append(keys, rk)
	}
	sort.Slice(keys, func(i, j int) bool { return replayLess(keys[i], keys[j]) })
	e := newExpander(s, a.graphWork)
	told := map[uint64]bool{}
	for _, rk := range keys {
		n := s.replays[rk]
		st.Replays = satAdd(st.Replays, n)
		if rk.Graph == 0 {
			st.UnknownReplays = satAdd(st.UnknownReplays, n)
			continue
		}
		f := e.flat(rk.Graph)
		if f.refused == "" && !e.spend(len(f.leaves)) {
			f = &flatGraph{refused: e.refusal()}
		}
		if f.refused != "" {
			st.RefusedReplays = satAdd(st.RefusedReplays, n)
			if refused != nil && !told[rk.Graph] {
				told[rk.Graph] = true
				refused(rk.Graph, f.refused)
			}
			continue
		}
		for lk, v := range f.leaves {
			switch lk.typ {
			case uint32(bpfobj.GraphNodeKernel):
				if a.opts.NoKernels {
					continue
				}
				k := bpfobj.ProfiLaunchKey{Pid: rk.Pid, Op: lk.op, Stream: rk.Stream, Func: lk.fn, Phase: rk.Phase, Dev: rk.Dev}
				l := d.graphLaunch[k]
				l.Count = satAdd(l.Count, satMul(n, v.Count))
				l.GridBlocks = satAdd(l.GridBlocks, satMul(n, v.GridBlocks))
				l.BlockThreads = satAdd(l.BlockThreads, satMul(n, v.BlockThreads))
				l.SharedBytes = satAdd(l.SharedBytes, satMul(n, v.SharedBytes))
				d.graphLaunch[k] = l
				st.Kernels = satAdd(st.Kernels, satMul(n, v.Count))
			case uint32(bpfobj.GraphNodeMemcpy), uint32(bpfobj.GraphNodeMemset):
				bk := graphBytesKey{op: lk.op, kind: lk.kind, set: lk.typ == uint32(bpfobj.GraphNodeMemset), stream: rk.Stream, dev: rk.Dev}
				d.graphBytes[bk] = satAdd(d.graphBytes[bk], satMul(n, v.Bytes))
			}
		}
	}
	return st
}

func replayLess(a, b bpfobj.ProfiReplayKey) bool {
	switch {
	case a.Graph != b.Graph:
		return a.Graph < b.Graph
	case a.Stream != b.Stream:
		return a.Stream < b.Stream
	case a.Dev != b.Dev:
		return a.Dev < b.Dev
	}
	return a.Phase < b.Phase
}

// leafKey is a kernel, copy or set node of a graph, without its graph:
// nodes of child graphs with the same key merge.
type leafKey struct {
	typ, op, kind uint32
	fn            uint64
}

// flatGraph is one graph expanded: its nodes and its child graphs' (each
// multiplied by how often it is embedded), merged by key.
type flatGraph struct {
	leaves  map[leafKey]bpfobj.ProfiGraphNodeVal
	nodes   uint64 // nodes one replay runs (saturating)
	height  int    // levels of child graphs below it
	refused string // why it is not expanded ("" when it is)
}

// expander expands a process's graphs, each once (memoised).
type expander struct {
	s      *graphState
	memo   map[uint64]*flatGraph
	active map[uint64]bool // graphs being expanded: one met again is a cycle
	work   int
	limit  int // the work bound (graphWorkShare; 0: maxGraphWork)
}

func newExpander(s *graphState, limit int) *expander {
	if limit <= 0 {
		limit = maxGraphWork
	}
	return &expander{s: s, memo: map[uint64]*flatGraph{}, active: map[uint64]bool{}, limit: limit}
}

// spend takes n units of the work bound; false once it is used up.
func (e *expander) spend(n int) bool {
	if e.work+n > e.limit {
		e.work = e.limit
		return false
	}
	e.work += n
	return true
}

// refusal is the reason of a refusal for work: the node's share when the
// bound was less than a process's own.
func (e *expander) refusal() string {
	if e.limit < maxGraphWork {
		return GraphRefusedNodeWork
	}
	return GraphRefusedWork
}

// flat is graph expanded, or refused with the reason. Every graph is
// expanded at most once; a graph embedding a refused one is refused for
// the same reason. The recursion is as deep as the longest chain of
// child graphs, which the per-process graph_nodes quota bounds.
func (e *expander) flat(graph uint64) *flatGraph {
	if f, ok := e.memo[graph]; ok {
		return f
	}
	if e.active[graph] {
		return &flatGraph{refused: GraphRefusedCycle}
	}
	e.active[graph] = true
	defer delete(e.active, graph)
	f := &flatGraph{}
	type child struct {
		f     *flatGraph
		times uint64
	}
	var children []child
	for _, nd := range e.s.nodes[graph] {
		if nd.key.Type != uint32(bpfobj.GraphNodeChild) {
			f.nodes = satAdd(f.nodes, nd.val.Count)
			continue
		}
		c := e.flat(nd.key.Func)
		if c.refused != "" {
			f.refused = c.refused
			break
		}
		f.height = max(f.height, c.height+1)
		f.nodes = satAdd(f.nodes, satMul(nd.val.Count, c.nodes))
		children = append(children, child{c, nd.val.Count})
	}
	switch {
	case f.refused != "":
	case f.height > maxGraphDepth:
		f.refused = GraphRefusedDepth
	case f.nodes > maxGraphNodes:
		f.refused = GraphRefusedNodes
	}
	if f.refused == "" {
		size := len(e.s.nodes[graph]) - len(children)
		for _, c := range children {
			size += len(c.f.leaves)
		}
		if !e.spend(size) {
			f.refused = e.refusal()
		}
	}
	if f.refused != "" {
		e.memo[graph] = f
		return f
	}
	f.leaves = map[leafKey]bpfobj.ProfiGraphNodeVal{}
	for _, nd := range e.s.nodes[graph] {
		if nd.key.Type != uint32(bpfobj.GraphNodeChild) {
			f.add(leafKey{nd.key.Type, nd.key.Op, nd.key.Kind, nd.key.Func}, nd.val, 1)
		}
	}
	for _, c := range children {
		for k, v := range c.f.leaves {
			f.add(k, v, c.times)
		}
	}
	e.memo[graph] = f
	return f
}

// add adds times × v to the node key k.
func (f *flatGraph) add(k leafKey, v bpfobj.ProfiGraphNodeVal, times uint64) {
	o := f.leaves[k]
	o.Count = satAdd(o.Count, satMul(times, v.Count))
	o.GridBlocks = satAdd(o.GridBlocks, satMul(times, v.GridBlocks))
	o.BlockThreads = satAdd(o.BlockThreads, satMul(times, v.BlockThreads))
	o.SharedBytes = satAdd(o.SharedBytes, satMul(times, v.SharedBytes))
	o.Bytes = satAdd(o.Bytes, satMul(times, v.Bytes))
	f.leaves[k] = o
}

// satAdd and satMul saturate at the largest uint64 instead of wrapping.
func satAdd(a, b uint64) uint64 {
	s, carry := bits.Add64(a, b, 0)
	if carry != 0 {
		return math.MaxUint64
	}
	return s
}

func satMul(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	if hi != 0 {
		return math.MaxUint64
	}
	return lo
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
