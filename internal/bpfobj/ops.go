package bpfobj

import "strconv"

// Op is an operation id: the BPF cookie of a probe and part of every map key.
type Op = ProfiOp

// Operations, named for Go. Values come from the C enum via bpf2go.
const (
	OpUnknown              Op = ProfiOpOP_UNKNOWN
	OpCudaMalloc           Op = ProfiOpOP_CUDA_MALLOC
	OpCudaFree             Op = ProfiOpOP_CUDA_FREE
	OpCudaMemcpy           Op = ProfiOpOP_CUDA_MEMCPY
	OpCudaMemcpyAsync      Op = ProfiOpOP_CUDA_MEMCPY_ASYNC
	OpCudaLaunchKernel     Op = ProfiOpOP_CUDA_LAUNCH_KERNEL
	OpCudaMallocAsync      Op = ProfiOpOP_CUDA_MALLOC_ASYNC
	OpCudaFreeAsync        Op = ProfiOpOP_CUDA_FREE_ASYNC
	OpCudaGraphLaunch      Op = ProfiOpOP_CUDA_GRAPH_LAUNCH
	OpCudaGraphInstantiate Op = ProfiOpOP_CUDA_GRAPH_INSTANTIATE
	NumOps                 Op = ProfiOpOP_MAX
)

// opNames are the `operation` label values (interface.md 5.2). For every
// operation probed so far the label is the C function's name.
var opNames = [NumOps]string{
	OpUnknown:              "unknown",
	OpCudaMalloc:           "cudaMalloc",
	OpCudaFree:             "cudaFree",
	OpCudaMemcpy:           "cudaMemcpy",
	OpCudaMemcpyAsync:      "cudaMemcpyAsync",
	OpCudaLaunchKernel:     "cudaLaunchKernel",
	OpCudaMallocAsync:      "cudaMallocAsync",
	OpCudaFreeAsync:        "cudaFreeAsync",
	OpCudaGraphLaunch:      "cudaGraphLaunch",
	OpCudaGraphInstantiate: "cudaGraphInstantiate",
}

// OpName returns the operation label of op, "unknown" for ids out of range.
func OpName(op uint32) string {
	if op < uint32(NumOps) && opNames[op] != "" {
		return opNames[op]
	}
	return opNames[OpUnknown]
}

// Drop indexes the per-CPU drops array.
type Drop = ProfiDrop

// Drop counters, named for Go.
const (
	DropAggregated   Drop = ProfiDropDROP_AGGREGATED
	DropLaunchAgg    Drop = ProfiDropDROP_LAUNCH_AGG
	DropInflight     Drop = ProfiDropDROP_INFLIGHT
	DropMallocSizes  Drop = ProfiDropDROP_MALLOC_SIZES
	DropOrphanReturn Drop = ProfiDropDROP_ORPHAN_RETURN
	DropNested       Drop = ProfiDropDROP_NESTED
	DropEventsRing   Drop = ProfiDropDROP_EVENTS_RING
	DropPIDClaim     Drop = ProfiDropDROP_PID_CLAIM
	NumDrops         Drop = ProfiDropDROP_MAX
)

// LatencyBoundsNs are the inclusive upper bounds of the CUDA API latency
// buckets in BPF (lat_bounds_ns in profi.bpf.c); the last bucket is +Inf.
var LatencyBoundsNs = [...]uint64{
	1e3, 5e3, 1e4, 5e4, 1e5, 5e5, 1e6, 5e6, 1e7, 5e7, 1e8, 5e8, 1e9,
}

// Cookie is the BPF cookie of a probe: the operation in the low 32 bits,
// the attached file's id in the high 32 bits (COOKIE_OP/COOKIE_FILE in
// types.h).
func Cookie(op Op, file uint32) uint64 { return uint64(op) | uint64(file)<<32 }

// StreamLabel formats a cudaStream_t handle as the `stream` label value.
func StreamLabel(stream uint64) string {
	if stream == 0 {
		return "default"
	}
	return "0x" + strconv.FormatUint(stream, 16)
}
