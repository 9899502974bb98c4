package bpfobj

import (
	"strconv"
	"strings"
)

// Op is an operation id: the BPF cookie of a probe and part of every map key.
type Op = ProfiOp

// Operations, named for Go. Values come from the C enum via bpf2go.
const (
	OpUnknown                   Op = ProfiOpOP_UNKNOWN
	OpCudaMalloc                Op = ProfiOpOP_CUDA_MALLOC
	OpCudaFree                  Op = ProfiOpOP_CUDA_FREE
	OpCudaMemcpy                Op = ProfiOpOP_CUDA_MEMCPY
	OpCudaMemcpyAsync           Op = ProfiOpOP_CUDA_MEMCPY_ASYNC
	OpCudaLaunchKernel          Op = ProfiOpOP_CUDA_LAUNCH_KERNEL
	OpCudaMallocAsync           Op = ProfiOpOP_CUDA_MALLOC_ASYNC
	OpCudaFreeAsync             Op = ProfiOpOP_CUDA_FREE_ASYNC
	OpCudaGraphLaunch           Op = ProfiOpOP_CUDA_GRAPH_LAUNCH
	OpCudaGraphInstantiate      Op = ProfiOpOP_CUDA_GRAPH_INSTANTIATE
	OpCudaLaunchKernelPtsz      Op = ProfiOpOP_CUDA_LAUNCH_KERNEL_PTSZ
	OpCudaLaunchKernelExC       Op = ProfiOpOP_CUDA_LAUNCH_KERNEL_EXC
	OpCudaLaunchCooperative     Op = ProfiOpOP_CUDA_LAUNCH_COOPERATIVE_KERNEL
	OpCudaMemcpyAsyncPtsz       Op = ProfiOpOP_CUDA_MEMCPY_ASYNC_PTSZ
	OpCudaMemcpyPeer            Op = ProfiOpOP_CUDA_MEMCPY_PEER
	OpCudaMemcpyPeerAsync       Op = ProfiOpOP_CUDA_MEMCPY_PEER_ASYNC
	OpCudaMemcpy2D              Op = ProfiOpOP_CUDA_MEMCPY_2D
	OpCudaMemcpy2DAsync         Op = ProfiOpOP_CUDA_MEMCPY_2D_ASYNC
	OpCudaMallocManaged         Op = ProfiOpOP_CUDA_MALLOC_MANAGED
	OpCudaMallocHost            Op = ProfiOpOP_CUDA_MALLOC_HOST
	OpCudaFreeHost              Op = ProfiOpOP_CUDA_FREE_HOST
	OpCudaMemset                Op = ProfiOpOP_CUDA_MEMSET
	OpCudaMemsetAsync           Op = ProfiOpOP_CUDA_MEMSET_ASYNC
	OpCudaStreamSync            Op = ProfiOpOP_CUDA_STREAM_SYNC
	OpCudaEventSync             Op = ProfiOpOP_CUDA_EVENT_SYNC
	OpCudaDeviceSync            Op = ProfiOpOP_CUDA_DEVICE_SYNC
	OpCudaSetDevice             Op = ProfiOpOP_CUDA_SET_DEVICE
	OpCuLaunchKernel            Op = ProfiOpOP_CU_LAUNCH_KERNEL
	OpCuLaunchKernelPtsz        Op = ProfiOpOP_CU_LAUNCH_KERNEL_PTSZ
	OpCuLaunchKernelEx          Op = ProfiOpOP_CU_LAUNCH_KERNEL_EX
	OpCuLaunchCooperative       Op = ProfiOpOP_CU_LAUNCH_COOPERATIVE_KERNEL
	OpCuGraphLaunch             Op = ProfiOpOP_CU_GRAPH_LAUNCH
	OpCuModuleLoadData          Op = ProfiOpOP_CU_MODULE_LOAD_DATA
	OpCuModuleGetFunction       Op = ProfiOpOP_CU_MODULE_GET_FUNCTION
	OpCuLibraryGetKernel        Op = ProfiOpOP_CU_LIBRARY_GET_KERNEL
	OpCuKernelGetFunction       Op = ProfiOpOP_CU_KERNEL_GET_FUNCTION
	OpCudaRegisterFunction      Op = ProfiOpOP_CUDA_REGISTER_FUNCTION
	OpCudaMemcpyPtds            Op = ProfiOpOP_CUDA_MEMCPY_PTDS
	OpCudaMemcpy2DPtds          Op = ProfiOpOP_CUDA_MEMCPY_2D_PTDS
	OpCudaMemcpy2DAsyncPtsz     Op = ProfiOpOP_CUDA_MEMCPY_2D_ASYNC_PTSZ
	OpCudaMemsetPtds            Op = ProfiOpOP_CUDA_MEMSET_PTDS
	OpCudaMemsetAsyncPtsz       Op = ProfiOpOP_CUDA_MEMSET_ASYNC_PTSZ
	OpCudaStreamSyncPtsz        Op = ProfiOpOP_CUDA_STREAM_SYNC_PTSZ
	OpCudaGraphLaunchPtsz       Op = ProfiOpOP_CUDA_GRAPH_LAUNCH_PTSZ
	OpCudaMallocAsyncPtsz       Op = ProfiOpOP_CUDA_MALLOC_ASYNC_PTSZ
	OpCudaFreeAsyncPtsz         Op = ProfiOpOP_CUDA_FREE_ASYNC_PTSZ
	OpCudaLaunchKernelExCPtsz   Op = ProfiOpOP_CUDA_LAUNCH_KERNEL_EXC_PTSZ
	OpCudaLaunchCooperativePtsz Op = ProfiOpOP_CUDA_LAUNCH_COOPERATIVE_KERNEL_PTSZ
	OpNcclAllReduce             Op = ProfiOpOP_NCCL_ALL_REDUCE
	OpNcclAllGather             Op = ProfiOpOP_NCCL_ALL_GATHER
	OpNcclReduceScatter         Op = ProfiOpOP_NCCL_REDUCE_SCATTER
	OpNcclBroadcast             Op = ProfiOpOP_NCCL_BROADCAST
	OpNcclReduce                Op = ProfiOpOP_NCCL_REDUCE
	OpNcclSend                  Op = ProfiOpOP_NCCL_SEND
	OpNcclRecv                  Op = ProfiOpOP_NCCL_RECV
	OpNcclAllToAll              Op = ProfiOpOP_NCCL_ALL_TO_ALL
	OpNcclGroupStart            Op = ProfiOpOP_NCCL_GROUP_START
	OpNcclGroupEnd              Op = ProfiOpOP_NCCL_GROUP_END
	OpNcclCommInitRank          Op = ProfiOpOP_NCCL_COMM_INIT_RANK
	OpNcclCommInitRankConfig    Op = ProfiOpOP_NCCL_COMM_INIT_RANK_CONFIG
	OpNcclCommInitAll           Op = ProfiOpOP_NCCL_COMM_INIT_ALL
	OpNcclCommDestroy           Op = ProfiOpOP_NCCL_COMM_DESTROY
	OpNcclCommAbort             Op = ProfiOpOP_NCCL_COMM_ABORT
	OpNvtxRangePushA            Op = ProfiOpOP_NVTX_RANGE_PUSH_A
	OpNvtxRangePushW            Op = ProfiOpOP_NVTX_RANGE_PUSH_W
	OpNvtxRangePushEx           Op = ProfiOpOP_NVTX_RANGE_PUSH_EX
	OpNvtxDomainRangePushEx     Op = ProfiOpOP_NVTX_DOMAIN_RANGE_PUSH_EX
	OpNvtxRangePop              Op = ProfiOpOP_NVTX_RANGE_POP
	OpNvtxDomainRangePop        Op = ProfiOpOP_NVTX_DOMAIN_RANGE_POP
	NumOps                      Op = ProfiOpOP_MAX
)

// Family groups operations by what their bytes mean.
type Family uint8

// Families.
const (
	FamilyOther      Family = iota
	FamilyLaunch            // kernel launches (launch_agg)
	FamilyMemcpy            // bytes copied, by direction
	FamilyMalloc            // device (or managed) bytes allocated
	FamilyFree              // tracked device bytes freed
	FamilyMallocHost        // pinned host bytes allocated
	FamilyMemset            // bytes set
	FamilyNCCL              // NCCL calls (nccl_agg): payload bytes
	FamilyNVTX              // NVTX range push/pop (--enable-nvtx-tracing): counted nowhere, they set the phase
)

// OpInfo describes an operation.
type OpInfo struct {
	// Name is the `operation` label (interface.md 5.2): the C function's
	// name, except the historical cudaStreamSync and cudaEventSync.
	Name   string
	Family Family
}

var ops = [NumOps]OpInfo{
	OpUnknown:               {"unknown", FamilyOther},
	OpCudaMalloc:            {"cudaMalloc", FamilyMalloc},
	OpCudaFree:              {"cudaFree", FamilyFree},
	OpCudaMemcpy:            {"cudaMemcpy", FamilyMemcpy},
	OpCudaMemcpyAsync:       {"cudaMemcpyAsync", FamilyMemcpy},
	OpCudaLaunchKernel:      {"cudaLaunchKernel", FamilyLaunch},
	OpCudaMallocAsync:       {"cudaMallocAsync", FamilyMalloc},
	OpCudaFreeAsync:         {"cudaFreeAsync", FamilyFree},
	OpCudaGraphLaunch:       {"cudaGraphLaunch", FamilyOther},
	OpCudaGraphInstantiate:  {"cudaGraphInstantiate", FamilyOther},
	OpCudaLaunchKernelPtsz:  {"cudaLaunchKernel_ptsz", FamilyLaunch},
	OpCudaLaunchKernelExC:   {"cudaLaunchKernelExC", FamilyLaunch},
	OpCudaLaunchCooperative: {"cudaLaunchCooperativeKernel", FamilyLaunch},
	OpCudaMemcpyAsyncPtsz:   {"cudaMemcpyAsync_ptsz", FamilyMemcpy},
	OpCudaMemcpyPeer:        {"cudaMemcpyPeer", FamilyMemcpy},
	OpCudaMemcpyPeerAsync:   {"cudaMemcpyPeerAsync", FamilyMemcpy},
	OpCudaMemcpy2D:          {"cudaMemcpy2D", FamilyMemcpy},
	OpCudaMemcpy2DAsync:     {"cudaMemcpy2DAsync", FamilyMemcpy},
	OpCudaMallocManaged:     {"cudaMallocManaged", FamilyMalloc},
	OpCudaMallocHost:        {"cudaMallocHost", FamilyMallocHost},
	OpCudaFreeHost:          {"cudaFreeHost", FamilyOther},
	OpCudaMemset:            {"cudaMemset", FamilyMemset},
	OpCudaMemsetAsync:       {"cudaMemsetAsync", FamilyMemset},
	OpCudaStreamSync:        {"cudaStreamSync", FamilyOther},
	OpCudaEventSync:         {"cudaEventSync", FamilyOther},
	OpCudaDeviceSync:        {"cudaDeviceSynchronize", FamilyOther},
	OpCudaSetDevice:         {"cudaSetDevice", FamilyOther},
	OpCuLaunchKernel:        {"cuLaunchKernel", FamilyLaunch},
	OpCuLaunchKernelPtsz:    {"cuLaunchKernel_ptsz", FamilyLaunch},
	OpCuLaunchKernelEx:      {"cuLaunchKernelEx", FamilyLaunch},
	OpCuLaunchCooperative:   {"cuLaunchCooperativeKernel", FamilyLaunch},
	OpCuGraphLaunch:         {"cuGraphLaunch", FamilyOther},
	OpCuModuleLoadData:      {"cuModuleLoadData", FamilyOther},
	OpCuModuleGetFunction:   {"cuModuleGetFunction", FamilyOther},
	OpCuLibraryGetKernel:    {"cuLibraryGetKernel", FamilyOther},
	OpCuKernelGetFunction:   {"cuKernelGetFunction", FamilyOther},
	OpCudaRegisterFunction:  {"__cudaRegisterFunction", FamilyOther},

	OpCudaMemcpyPtds:            {"cudaMemcpy_ptds", FamilyMemcpy},
	OpCudaMemcpy2DPtds:          {"cudaMemcpy2D_ptds", FamilyMemcpy},
	OpCudaMemcpy2DAsyncPtsz:     {"cudaMemcpy2DAsync_ptsz", FamilyMemcpy},
	OpCudaMemsetPtds:            {"cudaMemset_ptds", FamilyMemset},
	OpCudaMemsetAsyncPtsz:       {"cudaMemsetAsync_ptsz", FamilyMemset},
	OpCudaStreamSyncPtsz:        {"cudaStreamSynchronize_ptsz", FamilyOther},
	OpCudaGraphLaunchPtsz:       {"cudaGraphLaunch_ptsz", FamilyOther},
	OpCudaMallocAsyncPtsz:       {"cudaMallocAsync_ptsz", FamilyMalloc},
	OpCudaFreeAsyncPtsz:         {"cudaFreeAsync_ptsz", FamilyFree},
	OpCudaLaunchKernelExCPtsz:   {"cudaLaunchKernelExC_ptsz", FamilyLaunch},
	OpCudaLaunchCooperativePtsz: {"cudaLaunchCooperativeKernel_ptsz", FamilyLaunch},

	OpNcclAllReduce:          {"ncclAllReduce", FamilyNCCL},
	OpNcclAllGather:          {"ncclAllGather", FamilyNCCL},
	OpNcclReduceScatter:      {"ncclReduceScatter", FamilyNCCL},
	OpNcclBroadcast:          {"ncclBroadcast", FamilyNCCL},
	OpNcclReduce:             {"ncclReduce", FamilyNCCL},
	OpNcclSend:               {"ncclSend", FamilyNCCL},
	OpNcclRecv:               {"ncclRecv", FamilyNCCL},
	OpNcclAllToAll:           {"ncclAlltoAll", FamilyNCCL},
	OpNcclGroupStart:         {"ncclGroupStart", FamilyNCCL},
	OpNcclGroupEnd:           {"ncclGroupEnd", FamilyNCCL},
	OpNcclCommInitRank:       {"ncclCommInitRank", FamilyNCCL},
	OpNcclCommInitRankConfig: {"ncclCommInitRankConfig", FamilyNCCL},
	OpNcclCommInitAll:        {"ncclCommInitAll", FamilyNCCL},
	OpNcclCommDestroy:        {"ncclCommDestroy", FamilyNCCL},
	OpNcclCommAbort:          {"ncclCommAbort", FamilyNCCL},

	OpNvtxRangePushA:        {"nvtxRangePushA", FamilyNVTX},
	OpNvtxRangePushW:        {"nvtxRangePushW", FamilyNVTX},
	OpNvtxRangePushEx:       {"nvtxRangePushEx", FamilyNVTX},
	OpNvtxDomainRangePushEx: {"nvtxDomainRangePushEx", FamilyNVTX},
	OpNvtxRangePop:          {"nvtxRangePop", FamilyNVTX},
	OpNvtxDomainRangePop:    {"nvtxDomainRangePop", FamilyNVTX},
}

// Info describes op; ids out of range are "unknown".
func Info(op uint32) OpInfo {
	if op < uint32(NumOps) && ops[op].Name != "" {
		return ops[op]
	}
	return ops[OpUnknown]
}

// IsDriver reports whether op is a Driver API (libcuda) function.
func IsDriver(op Op) bool {
	name := OpName(uint32(op))
	return strings.HasPrefix(name, "cu") && !strings.HasPrefix(name, "cuda")
}

// OpName returns the operation label of op, "unknown" for ids out of range.
func OpName(op uint32) string { return Info(op).Name }

// KindP2P is the memcpy kind BPF records for peer copies (KIND_P2P).
const KindP2P = 0x100

// Direction returns the `direction` label of a memcpy kind.
func Direction(kind uint32) string {
	switch {
	case kind < uint32(len(directions)):
		return directions[kind]
	case kind == KindP2P:
		return "p2p"
	default:
		return "unknown"
	}
}

// directions are the labels of cudaMemcpyKind 0..4.
var directions = [...]string{"h2h", "h2d", "d2h", "d2d", "default"}

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
	DropKernelRegs   Drop = ProfiDropDROP_KERNEL_REGS
	DropRuntimeToDrv Drop = ProfiDropDROP_RT_TO_DRV
	DropLibLoads     Drop = ProfiDropDROP_LIB_LOADS
	DropNCCLAgg      Drop = ProfiDropDROP_NCCL_AGG
	DropNCCLInflight Drop = ProfiDropDROP_NCCL_INFLIGHT
	DropNVTXStack    Drop = ProfiDropDROP_NVTX_STACK
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

// KernelLatencyBoundsNs are the bounds of the kernel launch latency
// buckets (klat_bounds_ns); the last bucket is +Inf.
var KernelLatencyBoundsNs = [...]uint64{1e3, 5e3, 1e4, 5e4, 1e5, 5e5, 1e6, 1e7}

// NCCLLatencyBoundsNs are the bounds of the NCCL latency buckets
// (nlat_bounds_ns in profi.bpf.c, interface.md 5.5); the last bucket is +Inf.
var NCCLLatencyBoundsNs = [...]uint64{1e4, 5e4, 1e5, 5e5, 1e6, 5e6, 1e7, 5e7, 1e8, 5e8, 1e9}

// StreamLabel formats a cudaStream_t handle as the `stream` label value.
func StreamLabel(stream uint64) string {
	if stream == 0 {
		return "default"
	}
	return "0x" + strconv.FormatUint(stream, 16)
}

// Phase is the NVTX phase id BPF records in launch_key.phase (enum phase).
type Phase = ProfiPhase

// Phase ids, named for Go.
const (
	PhaseNone      Phase = ProfiPhasePHASE_NONE
	PhasePrefill   Phase = ProfiPhasePHASE_PREFILL
	PhaseDecode    Phase = ProfiPhasePHASE_DECODE
	PhaseAttention Phase = ProfiPhasePHASE_ATTENTION
	PhaseMLP       Phase = ProfiPhasePHASE_MLP
	PhaseNorm      Phase = ProfiPhasePHASE_NORM
	PhaseOther     Phase = ProfiPhasePHASE_OTHER
	NumPhases      Phase = ProfiPhasePHASE_MAX
)

// phases are the `phase` labels of the phase ids (interface.md 5.2).
var phases = [NumPhases]string{
	PhaseNone:      "",
	PhasePrefill:   "prefill",
	PhaseDecode:    "decode",
	PhaseAttention: "attention",
	PhaseMLP:       "mlp",
	PhaseNorm:      "norm",
	PhaseOther:     "other",
}

// PhaseName returns the `phase` label of a phase id: "" for none (no NVTX
// range open, or NVTX tracing off), "other" for ids out of range.
func PhaseName(p uint32) string {
	if p < uint32(NumPhases) {
		return phases[p]
	}
	return phases[PhaseOther]
}

// DevNone is the device of a call made on a thread that never set one with
// cudaSetDevice (DEV_NONE in bpf/types.h): CUDA's default device then, which
// userspace resolves (internal/gpu).
const DevNone uint32 = 0xffffffff
