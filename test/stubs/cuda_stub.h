/* Minimal CUDA Runtime 12 types and prototypes shared by the stub library
 * (cudart.c) and the workloads (workload.c, launch13.c, graphs.c). Only what the project probes or
 * the workload needs; the layouts and calling conventions match the real
 * cuda_runtime_api.h on x86-64 SysV so uprobes read the same registers. */
#ifndef PROFI_CUDA_STUB_H
#define PROFI_CUDA_STUB_H

#include <stddef.h>

typedef int cudaError_t;
typedef struct CUstream_st *cudaStream_t;
typedef struct CUmemPoolHandle_st *cudaMemPool_t;
typedef struct CUkern_st *cudaKernel_t; /* CUDA 12+: an opaque kernel handle */
typedef struct CUgraph_st *cudaGraph_t;
typedef struct CUgraphExec_st *cudaGraphExec_t;
typedef struct CUevent_st *cudaEvent_t;
typedef struct CUgraphNode_st *cudaGraphNode_t;
typedef struct cudaArray *cudaArray_t;
typedef struct {
	unsigned x, y, z;
} dim3;

typedef struct {
	dim3 gridDim;
	dim3 blockDim;
	size_t dynamicSmemBytes;
	cudaStream_t stream;
	void *attrs; /* cudaLaunchAttribute *: never read by the stub */
	unsigned numAttrs;
} cudaLaunchConfig_t;

/* Probes read cudaLaunchKernelExC's config at these offsets. */
_Static_assert(offsetof(cudaLaunchConfig_t, dynamicSmemBytes) == 24, "cudaLaunchConfig_t.dynamicSmemBytes offset");
_Static_assert(offsetof(cudaLaunchConfig_t, stream) == 32, "cudaLaunchConfig_t.stream offset");

enum cudaMemcpyKind {
	cudaMemcpyHostToHost = 0,
	cudaMemcpyHostToDevice = 1,
	cudaMemcpyDeviceToHost = 2,
	cudaMemcpyDeviceToDevice = 3,
	cudaMemcpyDefault = 4,
};

/* Error codes the stub returns (values from driver_types.h). */
enum {
	cudaSuccess = 0,
	cudaErrorInvalidValue = 1,
	cudaErrorMemoryAllocation = 2,
	cudaErrorInvalidSymbol = 13,
	cudaErrorInvalidMemcpyDirection = 21,
	cudaErrorInvalidDeviceFunction = 98,
	cudaErrorInvalidDevice = 101,
	cudaErrorInvalidResourceHandle = 400,
	cudaErrorIllegalState = 401,
	cudaErrorStreamCaptureUnsupported = 900,
	cudaErrorStreamCaptureInvalidated = 901,
	cudaErrorStreamCaptureMerge = 902,
	cudaErrorStreamCaptureUnmatched = 903,
	cudaErrorStreamCaptureUnjoined = 904,
	cudaErrorStreamCaptureIsolation = 905,
	cudaErrorCapturedEvent = 907,
	cudaErrorGraphExecUpdateFailure = 910,
};

/* Stream capture and graphs (driver_types.h, CUDA 12.4 and 13.0). */
enum cudaStreamCaptureMode {
	cudaStreamCaptureModeGlobal = 0,
	cudaStreamCaptureModeThreadLocal = 1,
	cudaStreamCaptureModeRelaxed = 2,
};
enum cudaStreamCaptureStatus {
	cudaStreamCaptureStatusNone = 0,
	cudaStreamCaptureStatusActive = 1,
	cudaStreamCaptureStatusInvalidated = 2,
};
enum cudaGraphExecUpdateResult {
	cudaGraphExecUpdateSuccess = 0,
	cudaGraphExecUpdateError = 1,
	cudaGraphExecUpdateErrorTopologyChanged = 2,
	cudaGraphExecUpdateErrorNodeTypeChanged = 3,
	cudaGraphExecUpdateErrorParametersChanged = 5,
};
typedef enum {
	cudaGraphInstantiateSuccess = 0,
	cudaGraphInstantiateError = 1,
} cudaGraphInstantiateResult;
enum { cudaGraphInstantiateFlagAutoFreeOnLaunch = 1, cudaGraphInstantiateFlagUpload = 2 };
enum { cudaEventDefault = 0, cudaEventDisableTiming = 2 };
typedef struct cudaGraphEdgeData_st cudaGraphEdgeData; /* only passed along */

struct cudaKernelNodeParams {
	void *func; /* the kernel's host stub */
	dim3 gridDim;
	dim3 blockDim;
	unsigned sharedMemBytes;
	void **kernelParams;
	void **extra;
};
_Static_assert(offsetof(struct cudaKernelNodeParams, gridDim) == 8, "cudaKernelNodeParams.gridDim offset");
_Static_assert(offsetof(struct cudaKernelNodeParams, sharedMemBytes) == 32, "cudaKernelNodeParams.sharedMemBytes offset");

struct cudaMemsetParams {
	void *dst;
	size_t pitch;
	unsigned value;
	unsigned elementSize; /* 1, 2 or 4 */
	size_t width;	      /* elements */
	size_t height;
};
_Static_assert(offsetof(struct cudaMemsetParams, elementSize) == 20, "cudaMemsetParams.elementSize offset");
_Static_assert(offsetof(struct cudaMemsetParams, height) == 32, "cudaMemsetParams.height offset");

struct cudaPos {
	size_t x, y, z;
};
struct cudaPitchedPtr {
	void *ptr;
	size_t pitch, xsize, ysize;
};
struct cudaExtent {
	size_t width, height, depth; /* width in bytes for linear memory */
};
struct cudaMemcpy3DParms {
	cudaArray_t srcArray;
	struct cudaPos srcPos;
	struct cudaPitchedPtr srcPtr;
	cudaArray_t dstArray;
	struct cudaPos dstPos;
	struct cudaPitchedPtr dstPtr;
	struct cudaExtent extent;
	enum cudaMemcpyKind kind;
};
_Static_assert(offsetof(struct cudaMemcpy3DParms, extent) == 128, "cudaMemcpy3DParms.extent offset");
_Static_assert(offsetof(struct cudaMemcpy3DParms, kind) == 152, "cudaMemcpy3DParms.kind offset");
struct cudaMemcpy3DPeerParms {
	cudaArray_t srcArray;
	struct cudaPos srcPos;
	struct cudaPitchedPtr srcPtr;
	int srcDevice;
	cudaArray_t dstArray;
	struct cudaPos dstPos;
	struct cudaPitchedPtr dstPtr;
	int dstDevice;
	struct cudaExtent extent;
};
/* bpf/args.h reads the extent (and the kind) at these offsets. */
_Static_assert(offsetof(struct cudaMemcpy3DPeerParms, dstDevice) == 136, "cudaMemcpy3DPeerParms.dstDevice offset");
_Static_assert(offsetof(struct cudaMemcpy3DPeerParms, extent) == 144, "cudaMemcpy3DPeerParms.extent offset");
_Static_assert(sizeof(struct cudaMemcpy3DPeerParms) == 168, "cudaMemcpy3DPeerParms size");

typedef struct {
	unsigned long long flags;
	cudaStream_t uploadStream;
	cudaGraphNode_t errNode_out;
	cudaGraphInstantiateResult result_out;
} cudaGraphInstantiateParams;

typedef struct {
	enum cudaGraphExecUpdateResult result;
	cudaGraphNode_t errorNode;
	cudaGraphNode_t errorFromNode;
} cudaGraphExecUpdateResultInfo;

/* cudaMallocManaged flags. */
enum { cudaMemAttachGlobal = 1, cudaMemAttachHost = 2 };

/* X-macros over the exported cudaError_t functions: name, parameter list.
 * The workload uses them to declare dlsym'd pointers. */
#define PROFI_CUDA_CORE_FUNCS(X)                                              \
	X(cudaMalloc, (void **devPtr, size_t size))                           \
	X(cudaFree, (void *devPtr))                                           \
	X(cudaMemcpy, (void *dst, const void *src, size_t count,              \
		       enum cudaMemcpyKind kind))                             \
	X(cudaMemcpyAsync, (void *dst, const void *src, size_t count,         \
			    enum cudaMemcpyKind kind, cudaStream_t stream))   \
	X(cudaLaunchKernel, (const void *func, dim3 gridDim, dim3 blockDim,   \
			     void **args, size_t sharedMem,                   \
			     cudaStream_t stream))                            \
	X(cudaMallocAsync, (void **devPtr, size_t size, cudaStream_t stream)) \
	X(cudaFreeAsync, (void *devPtr, cudaStream_t stream))                 \
	X(cudaStreamCreate, (cudaStream_t * pStream))                         \
	X(cudaGetLastError, (void))                                           \
	X(cudaGetDeviceCount, (int *count))

/* Beyond the default workload's set: the dlopen build resolves them only
 * for --extra. */
#define PROFI_CUDA_EXTRA_FUNCS(X)                                             \
	X(cudaLaunchKernel_ptsz, (const void *func, dim3 gridDim,             \
				  dim3 blockDim, void **args,                 \
				  size_t sharedMem, cudaStream_t stream))     \
	X(cudaLaunchKernelExC, (const cudaLaunchConfig_t *config,             \
				const void *func, void **args))               \
	X(cudaLaunchCooperativeKernel, (const void *func, dim3 gridDim,       \
					dim3 blockDim, void **args,           \
					size_t sharedMem,                     \
					cudaStream_t stream))                 \
	X(cudaMemcpyAsync_ptsz, (void *dst, const void *src, size_t count,    \
				 enum cudaMemcpyKind kind,                    \
				 cudaStream_t stream))                        \
	X(cudaMemcpyPeer, (void *dst, int dstDevice, const void *src,         \
			   int srcDevice, size_t count))                      \
	X(cudaMemcpyPeerAsync, (void *dst, int dstDevice, const void *src,    \
				int srcDevice, size_t count,                  \
				cudaStream_t stream))                         \
	X(cudaMemcpy2D, (void *dst, size_t dpitch, const void *src,           \
			 size_t spitch, size_t width, size_t height,          \
			 enum cudaMemcpyKind kind))                           \
	X(cudaMemcpy2DAsync, (void *dst, size_t dpitch, const void *src,      \
			      size_t spitch, size_t width, size_t height,     \
			      enum cudaMemcpyKind kind, cudaStream_t stream)) \
	X(cudaMemcpy3D, (const struct cudaMemcpy3DParms *p))                  \
	X(cudaMemcpy3DAsync, (const struct cudaMemcpy3DParms *p,              \
			      cudaStream_t stream))                           \
	X(cudaMemcpy3DPeer, (const struct cudaMemcpy3DPeerParms *p))          \
	X(cudaMemcpy3DPeerAsync, (const struct cudaMemcpy3DPeerParms *p,      \
				  cudaStream_t stream))                       \
	X(cudaMemcpyToSymbol, (const void *symbol, const void *src,           \
			       size_t count, size_t offset,                   \
			       enum cudaMemcpyKind kind))                     \
	X(cudaMemcpyFromSymbol, (void *dst, const void *symbol, size_t count, \
				 size_t offset, enum cudaMemcpyKind kind))    \
	X(cudaMemcpyToSymbolAsync, (const void *symbol, const void *src,      \
				    size_t count, size_t offset,              \
				    enum cudaMemcpyKind kind,                 \
				    cudaStream_t stream))                     \
	X(cudaMemcpyFromSymbolAsync, (void *dst, const void *symbol,          \
				      size_t count, size_t offset,            \
				      enum cudaMemcpyKind kind,               \
				      cudaStream_t stream))                   \
	X(cudaMemset2D, (void *devPtr, size_t pitch, int value, size_t width, \
			 size_t height))                                      \
	X(cudaMemset2DAsync, (void *devPtr, size_t pitch, int value,          \
			      size_t width, size_t height,                    \
			      cudaStream_t stream))                           \
	X(cudaMemset3D, (struct cudaPitchedPtr pitchedDevPtr, int value,      \
			 struct cudaExtent extent))                           \
	X(cudaMemset3DAsync, (struct cudaPitchedPtr pitchedDevPtr, int value, \
			      struct cudaExtent extent, cudaStream_t stream)) \
	X(cudaMallocPitch, (void **devPtr, size_t *pitch, size_t width,       \
			    size_t height))                                   \
	X(cudaMalloc3D, (struct cudaPitchedPtr *pitchedDevPtr,                \
			 struct cudaExtent extent))                           \
	X(cudaMallocFromPoolAsync, (void **ptr, size_t size,                  \
				    cudaMemPool_t memPool,                    \
				    cudaStream_t stream))                     \
	X(cudaMallocManaged, (void **devPtr, size_t size, unsigned flags))    \
	X(cudaMallocHost, (void **ptr, size_t size))                          \
	X(cudaFreeHost, (void *ptr))                                          \
	X(cudaMemset, (void *devPtr, int value, size_t count))                \
	X(cudaMemsetAsync, (void *devPtr, int value, size_t count,            \
			    cudaStream_t stream))                             \
	X(cudaStreamSynchronize, (cudaStream_t stream))                       \
	X(cudaEventSynchronize, (cudaEvent_t event))                          \
	X(cudaDeviceSynchronize, (void))                                      \
	X(cudaSetDevice, (int device))                                        \
	X(cudaGetDevice, (int *device))

/* Per-thread default stream variants (_ptds: no stream argument, _ptsz:
 * with one), same prototypes as their base functions; the dlopen build
 * resolves them only for --ptsz. cudaGraphLaunch_ptsz is a graph function
 * (below). */
#define PROFI_CUDA_PTSZ_FUNCS(X)                                              \
	X(cudaMemcpy_ptds, (void *dst, const void *src, size_t count,         \
			    enum cudaMemcpyKind kind))                        \
	X(cudaMemcpy2D_ptds, (void *dst, size_t dpitch, const void *src,      \
			      size_t spitch, size_t width, size_t height,     \
			      enum cudaMemcpyKind kind))                      \
	X(cudaMemcpy2DAsync_ptsz, (void *dst, size_t dpitch, const void *src, \
				   size_t spitch, size_t width,               \
				   size_t height, enum cudaMemcpyKind kind,   \
				   cudaStream_t stream))                      \
	X(cudaMemcpy3D_ptds, (const struct cudaMemcpy3DParms *p))             \
	X(cudaMemcpy3DAsync_ptsz, (const struct cudaMemcpy3DParms *p,         \
				   cudaStream_t stream))                      \
	X(cudaMemcpy3DPeer_ptds, (const struct cudaMemcpy3DPeerParms *p))     \
	X(cudaMemcpy3DPeerAsync_ptsz, (const struct cudaMemcpy3DPeerParms *p, \
				       cudaStream_t stream))                  \
	X(cudaMemcpyToSymbol_ptds, (const void *symbol, const void *src,      \
				    size_t count, size_t offset,              \
				    enum cudaMemcpyKind kind))                \
	X(cudaMemcpyFromSymbol_ptds, (void *dst, const void *symbol,          \
				      size_t count, size_t offset,            \
				      enum cudaMemcpyKind kind))              \
	X(cudaMemcpyToSymbolAsync_ptsz, (const void *symbol, const void *src, \
					 size_t count, size_t offset,         \
					 enum cudaMemcpyKind kind,            \
					 cudaStream_t stream))                \
	X(cudaMemcpyFromSymbolAsync_ptsz, (void *dst, const void *symbol,     \
					   size_t count, size_t offset,       \
					   enum cudaMemcpyKind kind,          \
					   cudaStream_t stream))              \
	X(cudaMemset2D_ptds, (void *devPtr, size_t pitch, int value,          \
			      size_t width, size_t height))                   \
	X(cudaMemset2DAsync_ptsz, (void *devPtr, size_t pitch, int value,     \
				   size_t width, size_t height,               \
				   cudaStream_t stream))                      \
	X(cudaMallocFromPoolAsync_ptsz, (void **ptr, size_t size,             \
					 cudaMemPool_t memPool,               \
					 cudaStream_t stream))                \
	X(cudaMemset3D_ptds, (struct cudaPitchedPtr pitchedDevPtr, int value, \
			      struct cudaExtent extent))                      \
	X(cudaMemset3DAsync_ptsz, (struct cudaPitchedPtr pitchedDevPtr,       \
				   int value, struct cudaExtent extent,       \
				   cudaStream_t stream))                      \
	X(cudaMemset_ptds, (void *devPtr, int value, size_t count))           \
	X(cudaMemsetAsync_ptsz, (void *devPtr, int value, size_t count,       \
				 cudaStream_t stream))                        \
	X(cudaStreamSynchronize_ptsz, (cudaStream_t stream))                  \
	X(cudaMallocAsync_ptsz, (void **devPtr, size_t size,                  \
				 cudaStream_t hStream))                       \
	X(cudaFreeAsync_ptsz, (void *devPtr, cudaStream_t hStream))           \
	X(cudaLaunchKernelExC_ptsz, (const cudaLaunchConfig_t *config,        \
				     const void *func, void **args))          \
	X(cudaLaunchCooperativeKernel_ptsz, (const void *func, dim3 gridDim,  \
					     dim3 blockDim, void **args,      \
					     size_t sharedMem,                \
					     cudaStream_t stream))

/* Omitted from the PROFI_STUB_OMIT_GRAPH build ("library missing symbols"). */
#define PROFI_CUDA_GRAPH_FUNCS(X)                                             \
	X(cudaGraphLaunch, (cudaGraphExec_t exec, cudaStream_t stream))       \
	X(cudaGraphInstantiate, (cudaGraphExec_t * pGraphExec,                \
				 cudaGraph_t graph, unsigned long long flags)) \
	X(cudaGraphLaunch_ptsz, (cudaGraphExec_t exec, cudaStream_t stream))

/* Stream capture, events and graph construction (CUDA 12.4+ and 13.0
 * prototypes: cudaGraphExecUpdate with a cudaGraphExecUpdateResultInfo,
 * CUDA 12.0's cudaGraphInstantiateWithParams, CUDA 12.3's
 * cudaStreamBeginCaptureToGraph). In every build, PROFI_STUB_OMIT_GRAPH's
 * too. */
#define PROFI_CUDA_CAPTURE_FUNCS(X)                                                        \
	X(cudaStreamBeginCapture, (cudaStream_t stream, enum cudaStreamCaptureMode mode))  \
	X(cudaStreamBeginCapture_ptsz, (cudaStream_t stream, enum cudaStreamCaptureMode mode)) \
	X(cudaStreamBeginCaptureToGraph, (cudaStream_t stream, cudaGraph_t graph,          \
					  const cudaGraphNode_t *dependencies,             \
					  const cudaGraphEdgeData *dependencyData,         \
					  size_t numDependencies,                          \
					  enum cudaStreamCaptureMode mode))                \
	X(cudaStreamBeginCaptureToGraph_ptsz, (cudaStream_t stream, cudaGraph_t graph,     \
					       const cudaGraphNode_t *dependencies,        \
					       const cudaGraphEdgeData *dependencyData,    \
					       size_t numDependencies,                     \
					       enum cudaStreamCaptureMode mode))           \
	X(cudaStreamEndCapture, (cudaStream_t stream, cudaGraph_t * pGraph))               \
	X(cudaStreamEndCapture_ptsz, (cudaStream_t stream, cudaGraph_t * pGraph))          \
	X(cudaStreamIsCapturing, (cudaStream_t stream,                                     \
				  enum cudaStreamCaptureStatus * pCaptureStatus))          \
	X(cudaEventCreate, (cudaEvent_t * event))                                          \
	X(cudaEventCreateWithFlags, (cudaEvent_t * event, unsigned flags))                 \
	X(cudaEventDestroy, (cudaEvent_t event))                                           \
	X(cudaEventRecord, (cudaEvent_t event, cudaStream_t stream))                       \
	X(cudaEventRecord_ptsz, (cudaEvent_t event, cudaStream_t stream))                  \
	X(cudaEventRecordWithFlags, (cudaEvent_t event, cudaStream_t stream, unsigned flags)) \
	X(cudaEventRecordWithFlags_ptsz, (cudaEvent_t event, cudaStream_t stream,          \
					  unsigned flags))                                 \
	X(cudaStreamWaitEvent, (cudaStream_t stream, cudaEvent_t event, unsigned flags))   \
	X(cudaStreamWaitEvent_ptsz, (cudaStream_t stream, cudaEvent_t event, unsigned flags)) \
	X(cudaGraphCreate, (cudaGraph_t * pGraph, unsigned flags))                         \
	X(cudaGraphInstantiateWithFlags, (cudaGraphExec_t * pGraphExec, cudaGraph_t graph, \
					  unsigned long long flags))                       \
	X(cudaGraphInstantiateWithParams, (cudaGraphExec_t * pGraphExec, cudaGraph_t graph, \
					   cudaGraphInstantiateParams * instantiateParams)) \
	X(cudaGraphInstantiateWithParams_ptsz, (cudaGraphExec_t * pGraphExec,              \
						cudaGraph_t graph,                         \
						cudaGraphInstantiateParams * instantiateParams)) \
	X(cudaGraphExecUpdate, (cudaGraphExec_t hGraphExec, cudaGraph_t hGraph,            \
				cudaGraphExecUpdateResultInfo * resultInfo))               \
	X(cudaGraphExecDestroy, (cudaGraphExec_t graphExec))                               \
	X(cudaGraphDestroy, (cudaGraph_t graph))                                           \
	X(cudaGraphAddKernelNode, (cudaGraphNode_t * pGraphNode, cudaGraph_t graph,        \
				   const cudaGraphNode_t *pDependencies,                   \
				   size_t numDependencies,                                 \
				   const struct cudaKernelNodeParams *pNodeParams))        \
	X(cudaGraphAddMemcpyNode, (cudaGraphNode_t * pGraphNode, cudaGraph_t graph,        \
				   const cudaGraphNode_t *pDependencies,                   \
				   size_t numDependencies,                                 \
				   const struct cudaMemcpy3DParms *pCopyParams))           \
	X(cudaGraphAddMemcpyNode1D, (cudaGraphNode_t * pGraphNode, cudaGraph_t graph,      \
				     const cudaGraphNode_t *pDependencies,                 \
				     size_t numDependencies, void *dst, const void *src,   \
				     size_t count, enum cudaMemcpyKind kind))              \
	X(cudaGraphAddMemsetNode, (cudaGraphNode_t * pGraphNode, cudaGraph_t graph,        \
				   const cudaGraphNode_t *pDependencies,                   \
				   size_t numDependencies,                                 \
				   const struct cudaMemsetParams *pMemsetParams))          \
	X(cudaGraphAddChildGraphNode, (cudaGraphNode_t * pGraphNode, cudaGraph_t graph,    \
				       const cudaGraphNode_t *pDependencies,               \
				       size_t numDependencies, cudaGraph_t childGraph))

#define PROFI_DECLARE_FUNC(name, params) cudaError_t name params;
PROFI_CUDA_CORE_FUNCS(PROFI_DECLARE_FUNC)
PROFI_CUDA_EXTRA_FUNCS(PROFI_DECLARE_FUNC)
PROFI_CUDA_PTSZ_FUNCS(PROFI_DECLARE_FUNC)
PROFI_CUDA_GRAPH_FUNCS(PROFI_DECLARE_FUNC)
PROFI_CUDA_CAPTURE_FUNCS(PROFI_DECLARE_FUNC)
#undef PROFI_DECLARE_FUNC

/* Test control of the stub runtime (not CUDA): the next synchronous copy
 * (cudaMemcpy, cudaMemcpy2D, ...), on any thread, blocks until the process
 * is killed. */
void profi_stub_cuda_block_next_copy(void);

/* Registration entry points that nvcc-generated host code calls from a
 * static constructor (types simplified to the same x86-64 ABI). */
void **__cudaRegisterFatBinary(void *fatCubin);
void __cudaRegisterFunction(void **fatCubinHandle, const char *hostFun,
			    char *deviceFun, const char *deviceName,
			    int thread_limit, void *tid, void *bid, void *bDim,
			    void *gDim, int *wSize);
void __cudaUnregisterFatBinary(void **fatCubinHandle);

/* CUDA 13's launch lowering (nvcc 13): a handle per kernel, then launches. */
cudaError_t __cudaGetKernel(cudaKernel_t *kernel, const void *hostFun);
cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, void **args,
			       size_t sharedMem, cudaStream_t stream);
cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim,
				    void **args, size_t sharedMem, cudaStream_t stream);

#endif
