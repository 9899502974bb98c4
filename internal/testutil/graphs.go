package testutil

// GraphsTruth is the ground truth test/workloads/graphs.c prints: what it
// did after "go", with CUDA graphs used as PyTorch and vLLM use them.
type GraphsTruth struct {
	// Calls by exported function name (functions in profi's operation
	// table and the capture and graph functions; driver calls the stub
	// runtime makes inside runtime calls are never in it), CallsByStream
	// the same by the call's stream argument ("default": 0 or none), and
	// Errors by function and return code (a decimal string).
	Calls         map[string]uint64            `json:"calls"`
	CallsByStream map[string]map[string]uint64 `json:"calls_by_stream"`
	Errors        map[string]map[string]uint64 `json:"errors"`
	// By kernel symbol (mangled for the runtime's kernels, Triton's plain
	// names for the driver's): Launches that ran (eager); Captured: launch
	// calls made on capturing streams (those of failed captures too);
	// GraphKernels: kernels run by replays of graphs built after "go".
	Launches     map[string]uint64 `json:"launches"`
	Captured     map[string]uint64 `json:"captured"`
	GraphKernels map[string]uint64 `json:"graph_kernels"`
	// Replays of the executable graph built before "go" (graphs ... early)
	// and the kernels they ran.
	UnknownGraphReplays uint64 `json:"unknown_graph_replays"`
	UnknownGraphKernels uint64 `json:"unknown_graph_kernels"`
	// Bytes that moved (eager copies and sets, graph replays' on the replay
	// stream): Memcpy by "DIRECTION|STREAM", Memset by "STREAM", streams
	// labelled as profi labels them.
	Memcpy       map[string]uint64 `json:"memcpy"`
	Memset       map[string]uint64 `json:"memset"`
	MallocBytes  uint64            `json:"malloc_bytes"`
	ActiveBytes  uint64            `json:"active_bytes"`
	GridBlocks   uint64            `json:"grid_blocks"` // of the eager launches
	BlockThreads uint64            `json:"block_threads"`
	SharedBytes  uint64            `json:"shared_bytes"`
	// Streams: "capture", "fork", "replay", "driver" -> label.
	Streams map[string]string `json:"streams"`
}

// Sum adds up a by-kernel (or by-anything) map.
func Sum(m map[string]uint64) uint64 {
	var n uint64
	for _, v := range m {
		n += v
	}
	return n
}
