package ops

import "github.com/profi-dev/profi/internal/discover"

const (
	rt   = discover.LibCudart
	drv  = discover.LibCuda
	nccl = discover.LibNCCL
	nvtx = discover.LibNVTX
	ld   = discover.LibLoader
)

// Table is every probed function, one row each; a row's position + 1 is
// its operation id (0 is "unknown"). Appending keeps existing ids.
//
// Argument layouts: docs/PROBES.md. Which CUDA/NCCL release added a
// function: Since (empty: every release profi supports).
var Table = []Row{
	{Const: "CudaMalloc", Symbol: "cudaMalloc", Lib: rt, Family: FamilyMalloc, Args: ArgsAlloc},
	{Const: "CudaFree", Symbol: "cudaFree", Lib: rt, Family: FamilyFree, Args: ArgsFree},
	{Const: "CudaMemcpy", Symbol: "cudaMemcpy", Lib: rt, Family: FamilyMemcpy, Args: ArgsCopy, Pausable: true},
	{Const: "CudaMemcpyAsync", Symbol: "cudaMemcpyAsync", Lib: rt, Family: FamilyMemcpy, Args: ArgsCopyAsync, Pausable: true},
	{Const: "CudaLaunchKernel", Symbol: "cudaLaunchKernel", Lib: rt, Family: FamilyLaunch, Kind: Launch, Args: ArgsLaunch, Pausable: true},
	{Const: "CudaMallocAsync", Symbol: "cudaMallocAsync", Lib: rt, Family: FamilyMalloc, Args: ArgsAllocAsync},
	{Const: "CudaFreeAsync", Symbol: "cudaFreeAsync", Lib: rt, Family: FamilyFree, Args: ArgsFreeAsync},
	{Const: "CudaGraphLaunch", Symbol: "cudaGraphLaunch", Lib: rt, Args: ArgsGraphLaunch, Pausable: true},
	{Const: "CudaGraphInstantiate", Symbol: "cudaGraphInstantiate", Lib: rt, Args: ArgsGraphInstantiate},
	{Const: "CudaLaunchKernelPtsz", Symbol: "cudaLaunchKernel_ptsz", Lib: rt, Family: FamilyLaunch, Kind: Launch, Args: ArgsLaunch, Optional: true, Pausable: true, Base: "cudaLaunchKernel"},
	{Const: "CudaLaunchKernelExC", Symbol: "cudaLaunchKernelExC", Lib: rt, Family: FamilyLaunch, Kind: Launch, Args: ArgsLaunchExC, Optional: true, Pausable: true},
	{Const: "CudaLaunchCooperative", Symbol: "cudaLaunchCooperativeKernel", Lib: rt, Family: FamilyLaunch, Kind: Launch, Args: ArgsLaunch, Optional: true, Pausable: true},
	{Const: "CudaMemcpyAsyncPtsz", Symbol: "cudaMemcpyAsync_ptsz", Lib: rt, Family: FamilyMemcpy, Args: ArgsCopyAsync, Optional: true, Pausable: true, Base: "cudaMemcpyAsync"},
	{Const: "CudaMemcpyPeer", Symbol: "cudaMemcpyPeer", Lib: rt, Family: FamilyMemcpy, Args: ArgsCopyPeer, Optional: true, Pausable: true},
	{Const: "CudaMemcpyPeerAsync", Symbol: "cudaMemcpyPeerAsync", Lib: rt, Family: FamilyMemcpy, Args: ArgsCopyPeerAsync, Optional: true, Pausable: true},
	{Const: "CudaMemcpy2D", Symbol: "cudaMemcpy2D", Lib: rt, Family: FamilyMemcpy, Args: ArgsCopy2D, Optional: true, Pausable: true},
	{Const: "CudaMemcpy2DAsync", Symbol: "cudaMemcpy2DAsync", Lib: rt, Family: FamilyMemcpy, Args: ArgsCopy2DAsync, Optional: true, Pausable: true},
	{Const: "CudaMallocManaged", Symbol: "cudaMallocManaged", Lib: rt, Family: FamilyMalloc, Args: ArgsAlloc, Optional: true},
	{Const: "CudaMallocHost", Symbol: "cudaMallocHost", Lib: rt, Family: FamilyMallocHost, Args: ArgsAllocHost, Diagnostic: true},
	{Const: "CudaFreeHost", Symbol: "cudaFreeHost", Lib: rt, Diagnostic: true},
	{Const: "CudaMemset", Symbol: "cudaMemset", Lib: rt, Family: FamilyMemset, Args: ArgsSet, Diagnostic: true, Pausable: true},
	{Const: "CudaMemsetAsync", Symbol: "cudaMemsetAsync", Lib: rt, Family: FamilyMemset, Args: ArgsSetAsync, Diagnostic: true, Pausable: true},
	{Const: "CudaStreamSync", Symbol: "cudaStreamSynchronize", Label: "cudaStreamSync", Lib: rt, Args: ArgsStream, Diagnostic: true, Pausable: true},
	{Const: "CudaEventSync", Symbol: "cudaEventSynchronize", Label: "cudaEventSync", Lib: rt, Diagnostic: true, Pausable: true},
	{Const: "CudaDeviceSync", Symbol: "cudaDeviceSynchronize", Lib: rt, Diagnostic: true, Optional: true, Pausable: true},
	{Const: "CudaSetDevice", Symbol: "cudaSetDevice", Lib: rt, Args: ArgsSetDevice, Optional: true},
	{Const: "CuLaunchKernel", Symbol: "cuLaunchKernel", Lib: drv, Family: FamilyLaunch, Kind: Launch, Args: ArgsCuLaunch, Pausable: true},
	{Const: "CuLaunchKernelPtsz", Symbol: "cuLaunchKernel_ptsz", Lib: drv, Family: FamilyLaunch, Kind: Launch, Args: ArgsCuLaunch, Optional: true, Pausable: true, Base: "cuLaunchKernel"},
	{Const: "CuLaunchKernelEx", Symbol: "cuLaunchKernelEx", Lib: drv, Family: FamilyLaunch, Kind: Launch, Args: ArgsCuLaunchEx, Optional: true, Pausable: true},
	{Const: "CuLaunchCooperative", Symbol: "cuLaunchCooperativeKernel", Lib: drv, Family: FamilyLaunch, Kind: Launch, Args: ArgsCuLaunch, Optional: true, Pausable: true},
	{Const: "CuGraphLaunch", Symbol: "cuGraphLaunch", Lib: drv, Args: ArgsGraphLaunch, Pausable: true},
	{Const: "CuModuleLoadData", Symbol: "cuModuleLoadData", Lib: drv},
	{Const: "CuModuleGetFunction", Symbol: "cuModuleGetFunction", Lib: drv, Kind: NameSource, Args: ArgsGetFunction},
	{Const: "CuLibraryGetKernel", Symbol: "cuLibraryGetKernel", Lib: drv, Kind: NameSource, Args: ArgsGetKernel, Optional: true, Since: "CUDA 12.0"},
	{Const: "CuKernelGetFunction", Symbol: "cuKernelGetFunction", Lib: drv, Kind: NameSource, Args: ArgsKernelFunction, Optional: true, Since: "CUDA 12.0"},
	{Const: "CudaRegisterFunction", Symbol: "__cudaRegisterFunction", Lib: rt, Kind: Registration, Args: ArgsRegisterFunction, Optional: true},
	// Per-thread default stream variants (nvcc --default-stream per-thread).
	{Const: "CudaMemcpyPtds", Symbol: "cudaMemcpy_ptds", Lib: rt, Family: FamilyMemcpy, Args: ArgsCopy, Optional: true, Pausable: true, Base: "cudaMemcpy"},
	{Const: "CudaMemcpy2DPtds", Symbol: "cudaMemcpy2D_ptds", Lib: rt, Family: FamilyMemcpy, Args: ArgsCopy2D, Optional: true, Pausable: true, Base: "cudaMemcpy2D"},
	{Const: "CudaMemcpy2DAsyncPtsz", Symbol: "cudaMemcpy2DAsync_ptsz", Lib: rt, Family: FamilyMemcpy, Args: ArgsCopy2DAsync, Optional: true, Pausable: true, Base: "cudaMemcpy2DAsync"},
	{Const: "CudaMemsetPtds", Symbol: "cudaMemset_ptds", Lib: rt, Family: FamilyMemset, Args: ArgsSet, Diagnostic: true, Optional: true, Pausable: true, Base: "cudaMemset"},
	{Const: "CudaMemsetAsyncPtsz", Symbol: "cudaMemsetAsync_ptsz", Lib: rt, Family: FamilyMemset, Args: ArgsSetAsync, Diagnostic: true, Optional: true, Pausable: true, Base: "cudaMemsetAsync"},
	{Const: "CudaStreamSyncPtsz", Symbol: "cudaStreamSynchronize_ptsz", Lib: rt, Args: ArgsStream, Diagnostic: true, Optional: true, Pausable: true, Base: "cudaStreamSynchronize"},
	{Const: "CudaGraphLaunchPtsz", Symbol: "cudaGraphLaunch_ptsz", Lib: rt, Args: ArgsGraphLaunch, Optional: true, Pausable: true, Base: "cudaGraphLaunch"},
	{Const: "CudaMallocAsyncPtsz", Symbol: "cudaMallocAsync_ptsz", Lib: rt, Family: FamilyMalloc, Args: ArgsAllocAsync, Optional: true, Base: "cudaMallocAsync"},
	{Const: "CudaFreeAsyncPtsz", Symbol: "cudaFreeAsync_ptsz", Lib: rt, Family: FamilyFree, Args: ArgsFreeAsync, Optional: true, Base: "cudaFreeAsync"},
	{Const: "CudaLaunchKernelExCPtsz", Symbol: "cudaLaunchKernelExC_ptsz", Lib: rt, Family: FamilyLaunch, Kind: Launch, Args: ArgsLaunchExC, Optional: true, Pausable: true, Base: "cudaLaunchKernelExC"},
	{Const: "CudaLaunchCooperativePtsz", Symbol: "cudaLaunchCooperativeKernel_ptsz", Lib: rt, Family: FamilyLaunch, Kind: Launch, Args: ArgsLaunch, Optional: true, Pausable: true, Base: "cudaLaunchCooperativeKernel"},
	// NCCL (libnccl.so.2), counted in nccl_agg.
	{Const: "NcclAllReduce", Symbol: "ncclAllReduce", Lib: nccl, Family: FamilyNCCL, Kind: NCCL, Args: ArgsNCCLColl},
	{Const: "NcclAllGather", Symbol: "ncclAllGather", Lib: nccl, Family: FamilyNCCL, Kind: NCCL, Args: ArgsNCCLGather},
	{Const: "NcclReduceScatter", Symbol: "ncclReduceScatter", Lib: nccl, Family: FamilyNCCL, Kind: NCCL, Args: ArgsNCCLColl},
	{Const: "NcclBroadcast", Symbol: "ncclBroadcast", Lib: nccl, Family: FamilyNCCL, Kind: NCCL, Args: ArgsNCCLColl},
	{Const: "NcclReduce", Symbol: "ncclReduce", Lib: nccl, Family: FamilyNCCL, Kind: NCCL, Args: ArgsNCCLReduce},
	{Const: "NcclSend", Symbol: "ncclSend", Lib: nccl, Family: FamilyNCCL, Kind: NCCL, Args: ArgsNCCLP2P},
	{Const: "NcclRecv", Symbol: "ncclRecv", Lib: nccl, Family: FamilyNCCL, Kind: NCCL, Args: ArgsNCCLP2P},
	{Const: "NcclAllToAll", Symbol: "ncclAlltoAll", Lib: nccl, Family: FamilyNCCL, Kind: NCCL, Args: ArgsNCCLGather, Optional: true, Since: "NCCL 2.28"},
	{Const: "NcclGroupStart", Symbol: "ncclGroupStart", Lib: nccl, Family: FamilyNCCL, Kind: NCCLCount},
	{Const: "NcclGroupEnd", Symbol: "ncclGroupEnd", Lib: nccl, Family: FamilyNCCL, Kind: NCCL},
	{Const: "NcclCommInitRank", Symbol: "ncclCommInitRank", Lib: nccl, Family: FamilyNCCL, Kind: NCCL, Args: ArgsNCCLInitRank},
	{Const: "NcclCommInitRankConfig", Symbol: "ncclCommInitRankConfig", Lib: nccl, Family: FamilyNCCL, Kind: NCCL, Args: ArgsNCCLInitRank, Optional: true, Since: "NCCL 2.14"},
	{Const: "NcclCommInitAll", Symbol: "ncclCommInitAll", Lib: nccl, Family: FamilyNCCL, Kind: NCCL, Args: ArgsNCCLInitAll, Optional: true},
	{Const: "NcclCommDestroy", Symbol: "ncclCommDestroy", Lib: nccl, Family: FamilyNCCL, Kind: NCCL, Args: ArgsNCCLComm},
	{Const: "NcclCommAbort", Symbol: "ncclCommAbort", Lib: nccl, Family: FamilyNCCL, Kind: NCCL, Args: ArgsNCCLComm},
	// NVTX (--enable-nvtx-tracing): range push/pop, kept per thread in nvtx_stack.
	{Const: "NvtxRangePushA", Symbol: "nvtxRangePushA", Lib: nvtx, Family: FamilyNVTX, Kind: NVTXPush, Args: ArgsNVTXA},
	{Const: "NvtxRangePushW", Symbol: "nvtxRangePushW", Lib: nvtx, Family: FamilyNVTX, Kind: NVTXPush, Args: ArgsNVTXW, Optional: true},
	{Const: "NvtxRangePushEx", Symbol: "nvtxRangePushEx", Lib: nvtx, Family: FamilyNVTX, Kind: NVTXPush, Args: ArgsNVTXEx, Optional: true},
	{Const: "NvtxDomainRangePushEx", Symbol: "nvtxDomainRangePushEx", Lib: nvtx, Family: FamilyNVTX, Kind: NVTXPush, Args: ArgsNVTXDomainEx, Optional: true},
	{Const: "NvtxRangePop", Symbol: "nvtxRangePop", Lib: nvtx, Family: FamilyNVTX, Kind: NVTXPop},
	{Const: "NvtxDomainRangePop", Symbol: "nvtxDomainRangePop", Lib: nvtx, Family: FamilyNVTX, Kind: NVTXPop, Optional: true},
	// CUDA 13's lowering of kernel<<<...>>> (some 12.x builds too): a
	// cudaKernel_t handle from __cudaGetKernel, the rest as cudaLaunchKernel.
	{Const: "CudaLaunchKernelHandle", Symbol: "__cudaLaunchKernel", Lib: rt, Family: FamilyLaunch, Kind: Launch, Args: ArgsLaunch, Optional: true, Pausable: true, Since: "CUDA 13.0", KernelHandle: true},
	{Const: "CudaGetKernel", Symbol: "__cudaGetKernel", Lib: rt, Kind: NameSource, Args: ArgsGetKernelHandle, Optional: true, Since: "CUDA 13.0"},
	{Const: "CudaLaunchKernelHandlePtsz", Symbol: "__cudaLaunchKernel_ptsz", Lib: rt, Family: FamilyLaunch, Kind: Launch, Args: ArgsLaunch, Optional: true, Pausable: true, Base: "__cudaLaunchKernel", Since: "CUDA 13.0", KernelHandle: true},
	// Driver memory API (the _v2 entry points cuda.h and cuGetProcAddress
	// resolve to): Triton, NCCL and static runtimes allocate and copy
	// here. A runtime call that reaches them is counted once, as the
	// runtime call (the driver call is nested in its timed probes).
	{Const: "CuMemAlloc", Symbol: "cuMemAlloc_v2", Lib: drv, Family: FamilyMalloc, Args: ArgsAlloc, Optional: true},
	{Const: "CuMemFree", Symbol: "cuMemFree_v2", Lib: drv, Family: FamilyFree, Args: ArgsFree, Optional: true},
	{Const: "CuMemAllocAsync", Symbol: "cuMemAllocAsync", Lib: drv, Family: FamilyMalloc, Args: ArgsAllocAsync, Optional: true},
	{Const: "CuMemFreeAsync", Symbol: "cuMemFreeAsync", Lib: drv, Family: FamilyFree, Args: ArgsFreeAsync, Optional: true},
	{Const: "CuMemAllocAsyncPtsz", Symbol: "cuMemAllocAsync_ptsz", Lib: drv, Family: FamilyMalloc, Args: ArgsAllocAsync, Optional: true, Base: "cuMemAllocAsync"},
	{Const: "CuMemFreeAsyncPtsz", Symbol: "cuMemFreeAsync_ptsz", Lib: drv, Family: FamilyFree, Args: ArgsFreeAsync, Optional: true, Base: "cuMemFreeAsync"},
	{Const: "CuMemAllocManaged", Symbol: "cuMemAllocManaged", Lib: drv, Family: FamilyMalloc, Args: ArgsAlloc, Optional: true},
	{Const: "CuMemcpy", Symbol: "cuMemcpy", Lib: drv, Family: FamilyMemcpy, Args: ArgsCuCopy, Optional: true, Direction: DirDefault, Pausable: true},
	{Const: "CuMemcpyAsync", Symbol: "cuMemcpyAsync", Lib: drv, Family: FamilyMemcpy, Args: ArgsCuCopyAsync, Optional: true, Direction: DirDefault, Pausable: true},
	{Const: "CuMemcpyHostToDevice", Symbol: "cuMemcpyHtoD_v2", Lib: drv, Family: FamilyMemcpy, Args: ArgsCuCopy, Optional: true, Direction: H2D, Pausable: true},
	{Const: "CuMemcpyDeviceToHost", Symbol: "cuMemcpyDtoH_v2", Lib: drv, Family: FamilyMemcpy, Args: ArgsCuCopy, Optional: true, Direction: D2H, Pausable: true},
	{Const: "CuMemcpyDeviceToDevice", Symbol: "cuMemcpyDtoD_v2", Lib: drv, Family: FamilyMemcpy, Args: ArgsCuCopy, Optional: true, Direction: D2D, Pausable: true},
	{Const: "CuMemcpyHostToDeviceAsync", Symbol: "cuMemcpyHtoDAsync_v2", Lib: drv, Family: FamilyMemcpy, Args: ArgsCuCopyAsync, Optional: true, Direction: H2D, Pausable: true},
	{Const: "CuMemcpyDeviceToHostAsync", Symbol: "cuMemcpyDtoHAsync_v2", Lib: drv, Family: FamilyMemcpy, Args: ArgsCuCopyAsync, Optional: true, Direction: D2H, Pausable: true},
	{Const: "CuMemcpyDeviceToDeviceAsync", Symbol: "cuMemcpyDtoDAsync_v2", Lib: drv, Family: FamilyMemcpy, Args: ArgsCuCopyAsync, Optional: true, Direction: D2D, Pausable: true},
	{Const: "CuMemcpyPeer", Symbol: "cuMemcpyPeer", Lib: drv, Family: FamilyMemcpy, Args: ArgsCopyPeer, Optional: true, Pausable: true},
	{Const: "CuMemcpyPeerAsync", Symbol: "cuMemcpyPeerAsync", Lib: drv, Family: FamilyMemcpy, Args: ArgsCopyPeerAsync, Optional: true, Pausable: true},
	{Const: "CuMemcpyPtds", Symbol: "cuMemcpy_ptds", Lib: drv, Family: FamilyMemcpy, Args: ArgsCuCopy, Optional: true, Direction: DirDefault, Pausable: true, Base: "cuMemcpy"},
	{Const: "CuMemcpyAsyncPtsz", Symbol: "cuMemcpyAsync_ptsz", Lib: drv, Family: FamilyMemcpy, Args: ArgsCuCopyAsync, Optional: true, Direction: DirDefault, Pausable: true, Base: "cuMemcpyAsync"},
	{Const: "CuMemcpyHostToDevicePtds", Symbol: "cuMemcpyHtoD_v2_ptds", Lib: drv, Family: FamilyMemcpy, Args: ArgsCuCopy, Optional: true, Direction: H2D, Pausable: true, Base: "cuMemcpyHtoD_v2"},
	{Const: "CuMemcpyDeviceToHostPtds", Symbol: "cuMemcpyDtoH_v2_ptds", Lib: drv, Family: FamilyMemcpy, Args: ArgsCuCopy, Optional: true, Direction: D2H, Pausable: true, Base: "cuMemcpyDtoH_v2"},
	{Const: "CuMemcpyDeviceToDevicePtds", Symbol: "cuMemcpyDtoD_v2_ptds", Lib: drv, Family: FamilyMemcpy, Args: ArgsCuCopy, Optional: true, Direction: D2D, Pausable: true, Base: "cuMemcpyDtoD_v2"},
	{Const: "CuMemcpyHostToDeviceAsyncPtsz", Symbol: "cuMemcpyHtoDAsync_v2_ptsz", Lib: drv, Family: FamilyMemcpy, Args: ArgsCuCopyAsync, Optional: true, Direction: H2D, Pausable: true, Base: "cuMemcpyHtoDAsync_v2"},
	{Const: "CuMemcpyDeviceToHostAsyncPtsz", Symbol: "cuMemcpyDtoHAsync_v2_ptsz", Lib: drv, Family: FamilyMemcpy, Args: ArgsCuCopyAsync, Optional: true, Direction: D2H, Pausable: true, Base: "cuMemcpyDtoHAsync_v2"},
	{Const: "CuMemcpyDeviceToDeviceAsyncPtsz", Symbol: "cuMemcpyDtoDAsync_v2_ptsz", Lib: drv, Family: FamilyMemcpy, Args: ArgsCuCopyAsync, Optional: true, Direction: D2D, Pausable: true, Base: "cuMemcpyDtoDAsync_v2"},
	{Const: "CuMemsetD8", Symbol: "cuMemsetD8_v2", Lib: drv, Family: FamilyMemset, Args: ArgsSet, Optional: true, Diagnostic: true, Pausable: true},
	{Const: "CuMemsetD16", Symbol: "cuMemsetD16_v2", Lib: drv, Family: FamilyMemset, Args: ArgsSet, Optional: true, Unit: 2, Diagnostic: true, Pausable: true},
	{Const: "CuMemsetD32", Symbol: "cuMemsetD32_v2", Lib: drv, Family: FamilyMemset, Args: ArgsSet, Optional: true, Unit: 4, Diagnostic: true, Pausable: true},
	{Const: "CuMemsetD8Async", Symbol: "cuMemsetD8Async", Lib: drv, Family: FamilyMemset, Args: ArgsSetAsync, Optional: true, Diagnostic: true, Pausable: true},
	{Const: "CuMemsetD16Async", Symbol: "cuMemsetD16Async", Lib: drv, Family: FamilyMemset, Args: ArgsSetAsync, Optional: true, Unit: 2, Diagnostic: true, Pausable: true},
	{Const: "CuMemsetD32Async", Symbol: "cuMemsetD32Async", Lib: drv, Family: FamilyMemset, Args: ArgsSetAsync, Optional: true, Unit: 4, Diagnostic: true, Pausable: true},
	{Const: "CuMemsetD8Ptds", Symbol: "cuMemsetD8_v2_ptds", Lib: drv, Family: FamilyMemset, Args: ArgsSet, Optional: true, Diagnostic: true, Pausable: true, Base: "cuMemsetD8_v2"},
	{Const: "CuMemsetD16Ptds", Symbol: "cuMemsetD16_v2_ptds", Lib: drv, Family: FamilyMemset, Args: ArgsSet, Optional: true, Unit: 2, Diagnostic: true, Pausable: true, Base: "cuMemsetD16_v2"},
	{Const: "CuMemsetD32Ptds", Symbol: "cuMemsetD32_v2_ptds", Lib: drv, Family: FamilyMemset, Args: ArgsSet, Optional: true, Unit: 4, Diagnostic: true, Pausable: true, Base: "cuMemsetD32_v2"},
	{Const: "CuMemsetD8AsyncPtsz", Symbol: "cuMemsetD8Async_ptsz", Lib: drv, Family: FamilyMemset, Args: ArgsSetAsync, Optional: true, Diagnostic: true, Pausable: true, Base: "cuMemsetD8Async"},
	{Const: "CuMemsetD16AsyncPtsz", Symbol: "cuMemsetD16Async_ptsz", Lib: drv, Family: FamilyMemset, Args: ArgsSetAsync, Optional: true, Unit: 2, Diagnostic: true, Pausable: true, Base: "cuMemsetD16Async"},
	{Const: "CuMemsetD32AsyncPtsz", Symbol: "cuMemsetD32Async_ptsz", Lib: drv, Family: FamilyMemset, Args: ArgsSetAsync, Optional: true, Unit: 4, Diagnostic: true, Pausable: true, Base: "cuMemsetD32Async"},
	// Virtual memory management: physical allocations (cuMemCreate/cuMemRelease,
	// with their size) count as device memory; mapping and address ranges
	// are counted calls (PyTorch expandable segments, vLLM sleep mode, NCCL).
	{Const: "CuMemCreate", Symbol: "cuMemCreate", Lib: drv, Family: FamilyMalloc, Args: ArgsAlloc, Optional: true, Since: "CUDA 10.2"},
	{Const: "CuMemRelease", Symbol: "cuMemRelease", Lib: drv, Family: FamilyFree, Args: ArgsFree, Optional: true, Since: "CUDA 10.2"},
	{Const: "CuMemMap", Symbol: "cuMemMap", Lib: drv, Optional: true, Since: "CUDA 10.2"},
	{Const: "CuMemUnmap", Symbol: "cuMemUnmap", Lib: drv, Optional: true, Since: "CUDA 10.2"},
	{Const: "CuMemAddressReserve", Symbol: "cuMemAddressReserve", Lib: drv, Optional: true, Since: "CUDA 10.2"},
	{Const: "CuMemAddressFree", Symbol: "cuMemAddressFree", Lib: drv, Optional: true, Since: "CUDA 10.2"},
	// The loader hook: a library load, not a profiled call. Optional: a
	// loader without it (some musl builds) only loses the speed-up.
	{Const: "DlDebugState", Symbol: "_dl_debug_state", Lib: ld, Kind: LoadHook, Optional: true},
	// Per-thread-default-stream driver launches, what cuGetProcAddress hands
	// out under CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM (Triton,
	// static runtimes built with --default-stream per-thread).
	{Const: "CuLaunchKernelExPtsz", Symbol: "cuLaunchKernelEx_ptsz", Lib: drv, Family: FamilyLaunch, Kind: Launch, Args: ArgsCuLaunchEx, Optional: true, Pausable: true, Base: "cuLaunchKernelEx", Since: "CUDA 11.8"},
	{Const: "CuLaunchCooperativePtsz", Symbol: "cuLaunchCooperativeKernel_ptsz", Lib: drv, Family: FamilyLaunch, Kind: Launch, Args: ArgsCuLaunch, Optional: true, Pausable: true, Base: "cuLaunchCooperativeKernel"},
	{Const: "CuGraphLaunchPtsz", Symbol: "cuGraphLaunch_ptsz", Lib: drv, Args: ArgsGraphLaunch, Optional: true, Pausable: true, Base: "cuGraphLaunch"},
	// CUDA graphs (docs/METRICS.md, "CUDA graphs"): stream capture, the
	// streams that join a capture through an event (PyTorch's fork/join of
	// side streams), graphs built node by node, instantiation and update
	// (which bind an executable graph to its graph's kernels, copies and
	// sets), and destruction. Timed, never paused: later calls depend on
	// the state they leave in BPF. cudaGraph_t, cudaGraphExec_t,
	// cudaStream_t and cudaEvent_t are the driver's handles (CUgraph, ...),
	// so both API levels share one state; a runtime call's driver call is
	// nested in it and counted once.
	{Const: "CudaStreamBeginCapture", Symbol: "cudaStreamBeginCapture", Lib: rt, Args: ArgsCaptureBegin, Optional: true},
	{Const: "CudaStreamBeginCapturePtsz", Symbol: "cudaStreamBeginCapture_ptsz", Lib: rt, Args: ArgsCaptureBegin, Optional: true, Base: "cudaStreamBeginCapture"},
	{Const: "CudaStreamBeginCaptureToGraph", Symbol: "cudaStreamBeginCaptureToGraph", Lib: rt, Args: ArgsCaptureToGraph, Optional: true, Since: "CUDA 12.3"},
	{Const: "CudaStreamEndCapture", Symbol: "cudaStreamEndCapture", Lib: rt, Args: ArgsCaptureEnd, Optional: true},
	{Const: "CudaStreamEndCapturePtsz", Symbol: "cudaStreamEndCapture_ptsz", Lib: rt, Args: ArgsCaptureEnd, Optional: true, Base: "cudaStreamEndCapture"},
	{Const: "CudaEventRecord", Symbol: "cudaEventRecord", Lib: rt, Args: ArgsEventRecord, Optional: true},
	{Const: "CudaEventRecordPtsz", Symbol: "cudaEventRecord_ptsz", Lib: rt, Args: ArgsEventRecord, Optional: true, Base: "cudaEventRecord"},
	{Const: "CudaEventRecordWithFlags", Symbol: "cudaEventRecordWithFlags", Lib: rt, Args: ArgsEventRecord, Optional: true, Since: "CUDA 11.1"},
	{Const: "CudaEventRecordWithFlagsPtsz", Symbol: "cudaEventRecordWithFlags_ptsz", Lib: rt, Args: ArgsEventRecord, Optional: true, Base: "cudaEventRecordWithFlags", Since: "CUDA 11.1"},
	{Const: "CudaStreamWaitEvent", Symbol: "cudaStreamWaitEvent", Lib: rt, Args: ArgsStreamWaitEvent, Optional: true},
	{Const: "CudaStreamWaitEventPtsz", Symbol: "cudaStreamWaitEvent_ptsz", Lib: rt, Args: ArgsStreamWaitEvent, Optional: true, Base: "cudaStreamWaitEvent"},
	{Const: "CudaGraphInstantiateWithFlags", Symbol: "cudaGraphInstantiateWithFlags", Lib: rt, Args: ArgsGraphInstantiate, Optional: true, Since: "CUDA 11.4"},
	{Const: "CudaGraphInstantiateWithParams", Symbol: "cudaGraphInstantiateWithParams", Lib: rt, Args: ArgsGraphInstantiate, Optional: true, Since: "CUDA 12.0"},
	{Const: "CudaGraphExecUpdate", Symbol: "cudaGraphExecUpdate", Lib: rt, Args: ArgsGraphExecUpdate, Optional: true},
	{Const: "CudaGraphExecDestroy", Symbol: "cudaGraphExecDestroy", Lib: rt, Args: ArgsGraphExecDestroy, Optional: true},
	{Const: "CudaGraphDestroy", Symbol: "cudaGraphDestroy", Lib: rt, Args: ArgsGraphDestroy, Optional: true},
	{Const: "CudaGraphAddKernelNode", Symbol: "cudaGraphAddKernelNode", Lib: rt, Args: ArgsGraphKernelNode, Optional: true},
	{Const: "CudaGraphAddMemcpyNode", Symbol: "cudaGraphAddMemcpyNode", Lib: rt, Args: ArgsGraphMemcpyNode, Optional: true},
	{Const: "CudaGraphAddMemcpyNode1D", Symbol: "cudaGraphAddMemcpyNode1D", Lib: rt, Args: ArgsGraphMemcpyNode1D, Optional: true, Since: "CUDA 11.1"},
	{Const: "CudaGraphAddMemsetNode", Symbol: "cudaGraphAddMemsetNode", Lib: rt, Args: ArgsGraphMemsetNode, Optional: true},
	{Const: "CudaGraphAddChildGraphNode", Symbol: "cudaGraphAddChildGraphNode", Lib: rt, Args: ArgsGraphChildNode, Optional: true},
	{Const: "CuStreamBeginCapture", Symbol: "cuStreamBeginCapture", Lib: drv, Args: ArgsCaptureBegin, Optional: true},
	{Const: "CuStreamBeginCapturePtsz", Symbol: "cuStreamBeginCapture_ptsz", Lib: drv, Args: ArgsCaptureBegin, Optional: true, Base: "cuStreamBeginCapture"},
	{Const: "CuStreamBeginCaptureV2", Symbol: "cuStreamBeginCapture_v2", Lib: drv, Args: ArgsCaptureBegin, Optional: true, Since: "CUDA 10.1"},
	{Const: "CuStreamBeginCaptureV2Ptsz", Symbol: "cuStreamBeginCapture_v2_ptsz", Lib: drv, Args: ArgsCaptureBegin, Optional: true, Base: "cuStreamBeginCapture_v2", Since: "CUDA 10.1"},
	{Const: "CuStreamBeginCaptureToGraph", Symbol: "cuStreamBeginCaptureToGraph", Lib: drv, Args: ArgsCaptureToGraph, Optional: true, Since: "CUDA 12.3"},
	{Const: "CuStreamEndCapture", Symbol: "cuStreamEndCapture", Lib: drv, Args: ArgsCaptureEnd, Optional: true},
	{Const: "CuStreamEndCapturePtsz", Symbol: "cuStreamEndCapture_ptsz", Lib: drv, Args: ArgsCaptureEnd, Optional: true, Base: "cuStreamEndCapture"},
	{Const: "CuEventRecord", Symbol: "cuEventRecord", Lib: drv, Args: ArgsEventRecord, Optional: true},
	{Const: "CuEventRecordPtsz", Symbol: "cuEventRecord_ptsz", Lib: drv, Args: ArgsEventRecord, Optional: true, Base: "cuEventRecord"},
	{Const: "CuEventRecordWithFlags", Symbol: "cuEventRecordWithFlags", Lib: drv, Args: ArgsEventRecord, Optional: true, Since: "CUDA 11.1"},
	{Const: "CuEventRecordWithFlagsPtsz", Symbol: "cuEventRecordWithFlags_ptsz", Lib: drv, Args: ArgsEventRecord, Optional: true, Base: "cuEventRecordWithFlags", Since: "CUDA 11.1"},
	{Const: "CuStreamWaitEvent", Symbol: "cuStreamWaitEvent", Lib: drv, Args: ArgsStreamWaitEvent, Optional: true},
	{Const: "CuStreamWaitEventPtsz", Symbol: "cuStreamWaitEvent_ptsz", Lib: drv, Args: ArgsStreamWaitEvent, Optional: true, Base: "cuStreamWaitEvent"},
	{Const: "CuGraphInstantiate", Symbol: "cuGraphInstantiate", Lib: drv, Args: ArgsGraphInstantiate, Optional: true},
	{Const: "CuGraphInstantiateV2", Symbol: "cuGraphInstantiate_v2", Lib: drv, Args: ArgsGraphInstantiate, Optional: true, Since: "CUDA 11.0"},
	{Const: "CuGraphInstantiateWithFlags", Symbol: "cuGraphInstantiateWithFlags", Lib: drv, Args: ArgsGraphInstantiate, Optional: true, Since: "CUDA 11.4"},
	{Const: "CuGraphInstantiateWithParams", Symbol: "cuGraphInstantiateWithParams", Lib: drv, Args: ArgsGraphInstantiate, Optional: true, Since: "CUDA 12.0"},
	{Const: "CuGraphInstantiateWithParamsPtsz", Symbol: "cuGraphInstantiateWithParams_ptsz", Lib: drv, Args: ArgsGraphInstantiate, Optional: true, Base: "cuGraphInstantiateWithParams", Since: "CUDA 12.0"},
	{Const: "CuGraphExecUpdate", Symbol: "cuGraphExecUpdate", Lib: drv, Args: ArgsGraphExecUpdate, Optional: true},
	{Const: "CuGraphExecUpdateV2", Symbol: "cuGraphExecUpdate_v2", Lib: drv, Args: ArgsGraphExecUpdate, Optional: true, Since: "CUDA 12.0"},
	{Const: "CuGraphExecDestroy", Symbol: "cuGraphExecDestroy", Lib: drv, Args: ArgsGraphExecDestroy, Optional: true},
	{Const: "CuGraphDestroy", Symbol: "cuGraphDestroy", Lib: drv, Args: ArgsGraphDestroy, Optional: true},
	{Const: "CuGraphAddKernelNode", Symbol: "cuGraphAddKernelNode", Lib: drv, Args: ArgsGraphKernelNode, Optional: true},
	{Const: "CuGraphAddKernelNodeV2", Symbol: "cuGraphAddKernelNode_v2", Lib: drv, Args: ArgsGraphKernelNode, Optional: true, Since: "CUDA 12.0"},
	{Const: "CuGraphAddMemsetNode", Symbol: "cuGraphAddMemsetNode", Lib: drv, Args: ArgsGraphMemsetNode, Optional: true},
	{Const: "CuGraphAddChildGraphNode", Symbol: "cuGraphAddChildGraphNode", Lib: drv, Args: ArgsGraphChildNode, Optional: true},
	// 3D copies: the bytes are the extent's width (bytes, for linear
	// memory) x height x depth, read from the parameter struct at entry
	// (bpf/args.h); peer copies count as "p2p".
	{Const: "CudaMemcpy3D", Symbol: "cudaMemcpy3D", Lib: rt, Family: FamilyMemcpy, Args: ArgsCopy3D, Optional: true, Pausable: true},
	{Const: "CudaMemcpy3DAsync", Symbol: "cudaMemcpy3DAsync", Lib: rt, Family: FamilyMemcpy, Args: ArgsCopy3DAsync, Optional: true, Pausable: true},
	{Const: "CudaMemcpy3DPtds", Symbol: "cudaMemcpy3D_ptds", Lib: rt, Family: FamilyMemcpy, Args: ArgsCopy3D, Optional: true, Pausable: true, Base: "cudaMemcpy3D"},
	{Const: "CudaMemcpy3DAsyncPtsz", Symbol: "cudaMemcpy3DAsync_ptsz", Lib: rt, Family: FamilyMemcpy, Args: ArgsCopy3DAsync, Optional: true, Pausable: true, Base: "cudaMemcpy3DAsync"},
	{Const: "CudaMemcpy3DPeer", Symbol: "cudaMemcpy3DPeer", Lib: rt, Family: FamilyMemcpy, Args: ArgsCopy3DPeer, Optional: true, Pausable: true},
	{Const: "CudaMemcpy3DPeerAsync", Symbol: "cudaMemcpy3DPeerAsync", Lib: rt, Family: FamilyMemcpy, Args: ArgsCopy3DPeerAsync, Optional: true, Pausable: true},
	{Const: "CudaMemcpy3DPeerPtds", Symbol: "cudaMemcpy3DPeer_ptds", Lib: rt, Family: FamilyMemcpy, Args: ArgsCopy3DPeer, Optional: true, Pausable: true, Base: "cudaMemcpy3DPeer"},
	{Const: "CudaMemcpy3DPeerAsyncPtsz", Symbol: "cudaMemcpy3DPeerAsync_ptsz", Lib: rt, Family: FamilyMemcpy, Args: ArgsCopy3DPeerAsync, Optional: true, Pausable: true, Base: "cudaMemcpy3DPeerAsync"},
	// Copies to and from a __device__ variable (its host-side symbol): the
	// count argument's bytes, in the kind's direction.
	{Const: "CudaMemcpyToSymbol", Symbol: "cudaMemcpyToSymbol", Lib: rt, Family: FamilyMemcpy, Args: ArgsCopySymbol, Optional: true, Pausable: true},
	{Const: "CudaMemcpyFromSymbol", Symbol: "cudaMemcpyFromSymbol", Lib: rt, Family: FamilyMemcpy, Args: ArgsCopySymbol, Optional: true, Pausable: true},
	{Const: "CudaMemcpyToSymbolAsync", Symbol: "cudaMemcpyToSymbolAsync", Lib: rt, Family: FamilyMemcpy, Args: ArgsCopySymbolAsync, Optional: true, Pausable: true},
	{Const: "CudaMemcpyFromSymbolAsync", Symbol: "cudaMemcpyFromSymbolAsync", Lib: rt, Family: FamilyMemcpy, Args: ArgsCopySymbolAsync, Optional: true, Pausable: true},
	{Const: "CudaMemcpyToSymbolPtds", Symbol: "cudaMemcpyToSymbol_ptds", Lib: rt, Family: FamilyMemcpy, Args: ArgsCopySymbol, Optional: true, Pausable: true, Base: "cudaMemcpyToSymbol"},
	{Const: "CudaMemcpyFromSymbolPtds", Symbol: "cudaMemcpyFromSymbol_ptds", Lib: rt, Family: FamilyMemcpy, Args: ArgsCopySymbol, Optional: true, Pausable: true, Base: "cudaMemcpyFromSymbol"},
	{Const: "CudaMemcpyToSymbolAsyncPtsz", Symbol: "cudaMemcpyToSymbolAsync_ptsz", Lib: rt, Family: FamilyMemcpy, Args: ArgsCopySymbolAsync, Optional: true, Pausable: true, Base: "cudaMemcpyToSymbolAsync"},
	{Const: "CudaMemcpyFromSymbolAsyncPtsz", Symbol: "cudaMemcpyFromSymbolAsync_ptsz", Lib: rt, Family: FamilyMemcpy, Args: ArgsCopySymbolAsync, Optional: true, Pausable: true, Base: "cudaMemcpyFromSymbolAsync"},
	// Pitched sets: width bytes in each of height rows.
	{Const: "CudaMemset2D", Symbol: "cudaMemset2D", Lib: rt, Family: FamilyMemset, Args: ArgsSet2D, Diagnostic: true, Optional: true, Pausable: true},
	{Const: "CudaMemset2DAsync", Symbol: "cudaMemset2DAsync", Lib: rt, Family: FamilyMemset, Args: ArgsSet2DAsync, Diagnostic: true, Optional: true, Pausable: true},
	{Const: "CudaMemset2DPtds", Symbol: "cudaMemset2D_ptds", Lib: rt, Family: FamilyMemset, Args: ArgsSet2D, Diagnostic: true, Optional: true, Pausable: true, Base: "cudaMemset2D"},
	{Const: "CudaMemset2DAsyncPtsz", Symbol: "cudaMemset2DAsync_ptsz", Lib: rt, Family: FamilyMemset, Args: ArgsSet2DAsync, Diagnostic: true, Optional: true, Pausable: true, Base: "cudaMemset2DAsync"},
}
