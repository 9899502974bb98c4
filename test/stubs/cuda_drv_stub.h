/* Minimal CUDA Driver API 12 types and prototypes shared by the stub
 * libcuda.so.1 (cuda.c), the stub libcudart (which calls into it) and the
 * workload. Layouts and calling conventions match the real cuda.h on x86-64
 * SysV, so uprobes read the same registers and struct offsets. */
#ifndef PROFI_CUDA_DRV_STUB_H
#define PROFI_CUDA_DRV_STUB_H

#include <stddef.h>

typedef int CUresult;
/* Same struct tags as the runtime's handles, as in the real headers: a
 * cudaStream_t is a CUstream. */
typedef struct CUstream_st *CUstream;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef struct CUfunc_st *CUfunction;
typedef struct CUmod_st *CUmodule;
typedef struct CUlib_st *CUlibrary;
typedef struct CUkern_st *CUkernel;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUctx_st *CUcontext;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphNode_st *CUgraphNode;
typedef struct CUevent_st *CUevent;
typedef struct CUarray_st *CUarray;
typedef unsigned long long CUdeviceptr; /* CUdeviceptr_v2 */
typedef unsigned long long CUmemGenericAllocationHandle;

typedef struct {
	unsigned gridDimX, gridDimY, gridDimZ;
	unsigned blockDimX, blockDimY, blockDimZ;
	unsigned sharedMemBytes;
	CUstream hStream;
	void *attrs; /* CUlaunchAttribute *: never read by the stub */
	unsigned numAttrs;
} CUlaunchConfig;

/* Probes read the stream of cuLaunchKernelEx from this offset. */
_Static_assert(offsetof(CUlaunchConfig, hStream) == 32, "CUlaunchConfig.hStream offset");

/* Codes the stub returns (values from cuda.h). */
enum {
	CUDA_SUCCESS = 0,
	CUDA_ERROR_INVALID_VALUE = 1,
	CUDA_ERROR_OUT_OF_MEMORY = 2,
	CUDA_ERROR_INVALID_HANDLE = 400,
	CUDA_ERROR_ILLEGAL_STATE = 401,
	CUDA_ERROR_NOT_FOUND = 500,
	CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
	CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
	CUDA_ERROR_STREAM_CAPTURE_MERGE = 902,
	CUDA_ERROR_STREAM_CAPTURE_UNMATCHED = 903,
	CUDA_ERROR_STREAM_CAPTURE_UNJOINED = 904,
	CUDA_ERROR_STREAM_CAPTURE_ISOLATION = 905,
	CUDA_ERROR_CAPTURED_EVENT = 907,
	CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE = 910,
};

/* Stream capture and graphs (cuda.h, CUDA 12.4 / r550). */
typedef enum {
	CU_STREAM_CAPTURE_STATUS_NONE = 0,
	CU_STREAM_CAPTURE_STATUS_ACTIVE = 1,
	CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2,
} CUstreamCaptureStatus;
typedef enum {
	CU_STREAM_CAPTURE_MODE_GLOBAL = 0,
	CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1,
	CU_STREAM_CAPTURE_MODE_RELAXED = 2,
} CUstreamCaptureMode;
typedef enum {
	CU_GRAPH_NODE_TYPE_KERNEL = 0,
	CU_GRAPH_NODE_TYPE_MEMCPY = 1,
	CU_GRAPH_NODE_TYPE_MEMSET = 2,
	CU_GRAPH_NODE_TYPE_HOST = 3,
	CU_GRAPH_NODE_TYPE_GRAPH = 4,
	CU_GRAPH_NODE_TYPE_EMPTY = 5,
} CUgraphNodeType;
typedef enum {
	CU_MEMORYTYPE_HOST = 1,
	CU_MEMORYTYPE_DEVICE = 2,
	CU_MEMORYTYPE_ARRAY = 3,
	CU_MEMORYTYPE_UNIFIED = 4,
} CUmemorytype;
typedef enum {
	CU_GRAPH_EXEC_UPDATE_SUCCESS = 0,
	CU_GRAPH_EXEC_UPDATE_ERROR = 1,
	CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED = 2,
	CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED = 3,
	CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED = 5,
} CUgraphExecUpdateResult;
typedef enum {
	CUDA_GRAPH_INSTANTIATE_SUCCESS = 0,
	CUDA_GRAPH_INSTANTIATE_ERROR = 1,
} CUgraphInstantiateResult;
/* cuStreamWaitEvent flag: wait on an event recorded outside the capture. */
enum { CU_EVENT_WAIT_EXTERNAL = 0x1 };
/* The instantiate flags cuda.h defines (auto free on launch, upload,
 * device launch, use node priority): others are invalid. Stub name. */
enum { PROFI_GRAPH_INSTANTIATE_FLAGS = 0x1 | 0x2 | 0x4 | 0x8 };

/* CUDA_KERNEL_NODE_PARAMS_v1 (cuGraphAddKernelNode) and _v2 (CUDA 12.0+,
 * cuGraphAddKernelNode_v2 and the CUDA_KERNEL_NODE_PARAMS of cuda.h 12). */
typedef struct {
	CUfunction func;
	unsigned gridDimX, gridDimY, gridDimZ;
	unsigned blockDimX, blockDimY, blockDimZ;
	unsigned sharedMemBytes;
	void **kernelParams;
	void **extra;
} CUDA_KERNEL_NODE_PARAMS_v1;
typedef struct {
	CUfunction func;
	unsigned gridDimX, gridDimY, gridDimZ;
	unsigned blockDimX, blockDimY, blockDimZ;
	unsigned sharedMemBytes;
	void **kernelParams;
	void **extra;
	CUkernel kern; /* used when func is NULL */
	CUcontext ctx;
} CUDA_KERNEL_NODE_PARAMS;
_Static_assert(offsetof(CUDA_KERNEL_NODE_PARAMS, gridDimX) == 8, "CUDA_KERNEL_NODE_PARAMS.gridDimX offset");
_Static_assert(offsetof(CUDA_KERNEL_NODE_PARAMS, sharedMemBytes) == 32, "CUDA_KERNEL_NODE_PARAMS.sharedMemBytes offset");
_Static_assert(offsetof(CUDA_KERNEL_NODE_PARAMS, kern) == 56, "CUDA_KERNEL_NODE_PARAMS.kern offset");
_Static_assert(sizeof(CUDA_KERNEL_NODE_PARAMS_v1) == 56, "CUDA_KERNEL_NODE_PARAMS_v1 size");

typedef struct {
	CUdeviceptr dst;
	size_t pitch;
	unsigned value;
	unsigned elementSize; /* 1, 2 or 4 */
	size_t width;	      /* elements */
	size_t height;
} CUDA_MEMSET_NODE_PARAMS;
_Static_assert(offsetof(CUDA_MEMSET_NODE_PARAMS, elementSize) == 20, "CUDA_MEMSET_NODE_PARAMS.elementSize offset");
_Static_assert(offsetof(CUDA_MEMSET_NODE_PARAMS, height) == 32, "CUDA_MEMSET_NODE_PARAMS.height offset");

typedef struct {
	size_t srcXInBytes, srcY;
	CUmemorytype srcMemoryType;
	const void *srcHost;
	CUdeviceptr srcDevice;
	CUarray srcArray;
	size_t srcPitch;
	size_t dstXInBytes, dstY;
	CUmemorytype dstMemoryType;
	void *dstHost;
	CUdeviceptr dstDevice;
	CUarray dstArray;
	size_t dstPitch;
	size_t WidthInBytes, Height;
} CUDA_MEMCPY2D;
_Static_assert(offsetof(CUDA_MEMCPY2D, dstMemoryType) == 72, "CUDA_MEMCPY2D.dstMemoryType offset");
_Static_assert(offsetof(CUDA_MEMCPY2D, WidthInBytes) == 112, "CUDA_MEMCPY2D.WidthInBytes offset");
_Static_assert(sizeof(CUDA_MEMCPY2D) == 128, "CUDA_MEMCPY2D size");

typedef struct {
	size_t srcXInBytes, srcY, srcZ, srcLOD;
	CUmemorytype srcMemoryType;
	const void *srcHost;
	CUdeviceptr srcDevice;
	CUarray srcArray;
	void *reserved0;
	size_t srcPitch, srcHeight;
	size_t dstXInBytes, dstY, dstZ, dstLOD;
	CUmemorytype dstMemoryType;
	void *dstHost;
	CUdeviceptr dstDevice;
	CUarray dstArray;
	void *reserved1;
	size_t dstPitch, dstHeight;
	size_t WidthInBytes, Height, Depth;
} CUDA_MEMCPY3D;
_Static_assert(offsetof(CUDA_MEMCPY3D, srcMemoryType) == 32, "CUDA_MEMCPY3D.srcMemoryType offset");
_Static_assert(offsetof(CUDA_MEMCPY3D, dstMemoryType) == 120, "CUDA_MEMCPY3D.dstMemoryType offset");
_Static_assert(offsetof(CUDA_MEMCPY3D, WidthInBytes) == 176, "CUDA_MEMCPY3D.WidthInBytes offset");
_Static_assert(sizeof(CUDA_MEMCPY3D) == 200, "CUDA_MEMCPY3D size");

/* CUDA 12.4's cuda.h: CUDA_MEMCPY3D with the two contexts in place of its
 * reserved pointers, so the same offsets. */
typedef struct {
	size_t srcXInBytes, srcY, srcZ, srcLOD;
	CUmemorytype srcMemoryType;
	const void *srcHost;
	CUdeviceptr srcDevice;
	CUarray srcArray;
	CUcontext srcContext;
	size_t srcPitch, srcHeight;
	size_t dstXInBytes, dstY, dstZ, dstLOD;
	CUmemorytype dstMemoryType;
	void *dstHost;
	CUdeviceptr dstDevice;
	CUarray dstArray;
	CUcontext dstContext;
	size_t dstPitch, dstHeight;
	size_t WidthInBytes, Height, Depth;
} CUDA_MEMCPY3D_PEER;
_Static_assert(offsetof(CUDA_MEMCPY3D_PEER, srcContext) == 64, "CUDA_MEMCPY3D_PEER.srcContext offset");
_Static_assert(offsetof(CUDA_MEMCPY3D_PEER, dstContext) == 152, "CUDA_MEMCPY3D_PEER.dstContext offset");
_Static_assert(offsetof(CUDA_MEMCPY3D_PEER, WidthInBytes) == 176, "CUDA_MEMCPY3D_PEER.WidthInBytes offset");
_Static_assert(sizeof(CUDA_MEMCPY3D_PEER) == 200, "CUDA_MEMCPY3D_PEER size");

typedef struct {
	unsigned long long flags;
	CUstream hUploadStream;
	CUgraphNode hErrNode_out;
	CUgraphInstantiateResult result_out;
} CUDA_GRAPH_INSTANTIATE_PARAMS;
_Static_assert(sizeof(CUDA_GRAPH_INSTANTIATE_PARAMS) == 32, "CUDA_GRAPH_INSTANTIATE_PARAMS size");

typedef struct {
	CUgraphExecUpdateResult result;
	CUgraphNode errorNode;
	CUgraphNode errorFromNode;
} CUgraphExecUpdateResultInfo;

typedef struct {
	char bytes[16];
} CUuuid;

/* The stub driver's private export table, returned by cuGetExportTable for
 * PROFI_STUB_EXPORT_TABLE_ID: the real runtime reaches driver internals
 * through such undocumented tables, and the stub runtime records what it
 * does not hand to the driver's exported functions (copies and sets, and
 * every launch under PROFI_STUB_LAUNCH=runtime) into a capture through it.
 * No uprobe fires inside: nothing here is exported by name. */
#define PROFI_STUB_EXPORT_TABLE_ID "profi-stub-rt-v1" /* the 16 bytes of the CUuuid */

/* What graph launches ran and captures recorded, in the stub's own
 * bookkeeping (the workloads check their ground truth against it). */
struct profi_stub_stats {
	unsigned long long graph_launches;	   /* launches of executable graphs the stub built */
	unsigned long long opaque_graph_launches;  /* of handles it never handed out */
	unsigned long long graph_kernels;	   /* kernel nodes those launches ran */
	unsigned long long graph_copy_bytes[5];	   /* by cudaMemcpyKind */
	unsigned long long graph_set_bytes;
	unsigned long long captured_launches;	   /* launch calls made on capturing streams */
	unsigned long long captured_copies, captured_sets;
	unsigned long long driver_launches;	   /* launches that reached the driver and ran */
};

struct profi_stub_export_table {
	size_t size; /* sizeof(struct profi_stub_export_table) */
	/* Each returns 0 when s is not capturing (the caller proceeds), else 1
	 * with *rc the call's result: the node recorded (CUDA_SUCCESS) or the
	 * capture's error (CUDA_ERROR_STREAM_CAPTURE_INVALIDATED). */
	int (*capture_launch)(CUstream s, int ptsz, CUfunction f, const unsigned grid[3],
			      const unsigned block[3], unsigned shared, CUresult *rc);
	int (*capture_copy)(CUstream s, int ptsz, size_t bytes, int kind, CUresult *rc);
	int (*capture_set)(CUstream s, int ptsz, size_t bytes, CUresult *rc);
	void (*stats)(struct profi_stub_stats *out);
};

/* X-macro over every exported function: name, parameter list. All return
 * CUresult. The workload uses it to declare dlsym'd pointers. */
#define PROFI_CU_FUNCS(X)                                                     \
	X(cuInit, (unsigned flags))                                           \
	X(cuLaunchKernel, (CUfunction f, unsigned gridDimX, unsigned gridDimY, \
			   unsigned gridDimZ, unsigned blockDimX,             \
			   unsigned blockDimY, unsigned blockDimZ,            \
			   unsigned sharedMemBytes, CUstream hStream,         \
			   void **kernelParams, void **extra))                \
	X(cuLaunchKernel_ptsz, (CUfunction f, unsigned gridDimX,              \
				unsigned gridDimY, unsigned gridDimZ,         \
				unsigned blockDimX, unsigned blockDimY,       \
				unsigned blockDimZ, unsigned sharedMemBytes,  \
				CUstream hStream, void **kernelParams,        \
				void **extra))                                \
	X(cuLaunchKernelEx, (const CUlaunchConfig *config, CUfunction f,      \
			     void **kernelParams, void **extra))              \
	X(cuLaunchCooperativeKernel, (CUfunction f, unsigned gridDimX,        \
				      unsigned gridDimY, unsigned gridDimZ,   \
				      unsigned blockDimX, unsigned blockDimY, \
				      unsigned blockDimZ,                     \
				      unsigned sharedMemBytes,                \
				      CUstream hStream, void **kernelParams)) \
	X(cuGraphLaunch, (CUgraphExec hGraphExec, CUstream hStream))          \
	X(cuModuleLoadData, (CUmodule * module, const void *image))           \
	X(cuModuleGetFunction, (CUfunction * hfunc, CUmodule hmod,            \
				const char *name))                            \
	X(cuLibraryLoadData, (CUlibrary * library, const void *code,          \
			      void *jitOptions, void **jitOptionsValues,      \
			      unsigned numJitOptions, void *libraryOptions,   \
			      void **libraryOptionValues,                     \
			      unsigned numLibraryOptions))                    \
	X(cuLibraryGetKernel, (CUkernel * pKernel, CUlibrary library,         \
			       const char *name))                             \
	X(cuKernelGetFunction, (CUfunction * pFunc, CUkernel kernel))

#define PROFI_DECLARE_CU_FUNC(name, params) CUresult name params;
PROFI_CU_FUNCS(PROFI_DECLARE_CU_FUNC)
#undef PROFI_DECLARE_CU_FUNC

/* The driver memory API (CUDA 11.8-13 names: the _v2 entry points that
 * cuda.h's macros and cuGetProcAddress resolve to, their per-thread-stream
 * variants, and the VMM calls). Prototypes as in cuda.h; the property
 * structs are opaque here (the stub never reads them). */
#define PROFI_CU_MEM_FUNCS(X)                                                          \
	X(cuMemAlloc_v2, (CUdeviceptr * dptr, size_t bytesize))                      \
	X(cuMemFree_v2, (CUdeviceptr dptr))                                           \
	X(cuMemAllocAsync, (CUdeviceptr * dptr, size_t bytesize, CUstream hStream))  \
	X(cuMemFreeAsync, (CUdeviceptr dptr, CUstream hStream))                       \
	X(cuMemAllocManaged, (CUdeviceptr * dptr, size_t bytesize, unsigned flags))  \
	X(cuMemcpy, (CUdeviceptr dst, CUdeviceptr src, size_t ByteCount))             \
	X(cuMemcpyAsync, (CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)) \
	X(cuMemcpyHtoD_v2, (CUdeviceptr dst, const void *src, size_t ByteCount))      \
	X(cuMemcpyDtoH_v2, (void *dst, CUdeviceptr src, size_t ByteCount))           \
	X(cuMemcpyDtoD_v2, (CUdeviceptr dst, CUdeviceptr src, size_t ByteCount))      \
	X(cuMemcpyHtoDAsync_v2, (CUdeviceptr dst, const void *src, size_t ByteCount, CUstream hStream)) \
	X(cuMemcpyDtoHAsync_v2, (void *dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)) \
	X(cuMemcpyDtoDAsync_v2, (CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)) \
	X(cuMemcpyPeer, (CUdeviceptr dst, CUcontext dstCtx, CUdeviceptr src, CUcontext srcCtx, size_t ByteCount)) \
	X(cuMemcpyHtoDAsync_v2_ptsz, (CUdeviceptr dst, const void *src, size_t ByteCount, CUstream hStream)) \
	X(cuMemcpyAsync_ptsz, (CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)) \
	X(cuMemsetD8_v2, (CUdeviceptr dst, unsigned char uc, size_t N))               \
	X(cuMemsetD16_v2, (CUdeviceptr dst, unsigned short us, size_t N))             \
	X(cuMemsetD32_v2, (CUdeviceptr dst, unsigned ui, size_t N))                   \
	X(cuMemsetD32Async, (CUdeviceptr dst, unsigned ui, size_t N, CUstream hStream)) \
	X(cuMemsetD2D8_v2, (CUdeviceptr dst, size_t dstPitch, unsigned char uc, size_t Width, size_t Height)) \
	X(cuMemsetD2D16_v2, (CUdeviceptr dst, size_t dstPitch, unsigned short us, size_t Width, size_t Height)) \
	X(cuMemsetD2D32_v2, (CUdeviceptr dst, size_t dstPitch, unsigned ui, size_t Width, size_t Height)) \
	X(cuMemsetD2D32Async, (CUdeviceptr dst, size_t dstPitch, unsigned ui, size_t Width, size_t Height, CUstream hStream)) \
	X(cuMemcpy2D_v2, (const CUDA_MEMCPY2D *pCopy))                                \
	X(cuMemcpy2DUnaligned_v2, (const CUDA_MEMCPY2D *pCopy))                       \
	X(cuMemcpy2DAsync_v2, (const CUDA_MEMCPY2D *pCopy, CUstream hStream))         \
	X(cuMemcpy3D_v2, (const CUDA_MEMCPY3D *pCopy))                                \
	X(cuMemcpy3DAsync_v2, (const CUDA_MEMCPY3D *pCopy, CUstream hStream))         \
	X(cuMemcpy3DPeer, (const CUDA_MEMCPY3D_PEER *pCopy))                          \
	X(cuMemcpy3DPeerAsync, (const CUDA_MEMCPY3D_PEER *pCopy, CUstream hStream))   \
	X(cuMemAllocPitch_v2, (CUdeviceptr * dptr, size_t *pPitch, size_t WidthInBytes, size_t Height, unsigned ElementSizeBytes)) \
	X(cuMemAllocFromPoolAsync, (CUdeviceptr * dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream)) \
	X(cuMemCreate, (CUmemGenericAllocationHandle * handle, size_t size, const void *prop, unsigned long long flags)) \
	X(cuMemRelease, (CUmemGenericAllocationHandle handle))                        \
	X(cuMemAddressReserve, (CUdeviceptr * ptr, size_t size, size_t alignment, CUdeviceptr addr, unsigned long long flags)) \
	X(cuMemAddressFree, (CUdeviceptr ptr, size_t size))                           \
	X(cuMemMap, (CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle, unsigned long long flags)) \
	X(cuMemUnmap, (CUdeviceptr ptr, size_t size))

#define PROFI_DECLARE_CU_MEM(name, params) CUresult name params;
PROFI_CU_MEM_FUNCS(PROFI_DECLARE_CU_MEM)
#undef PROFI_DECLARE_CU_MEM

/* The driver's launch API as code that calls the driver directly uses it
 * (Triton, statically linked runtimes), with the per-thread-default-stream
 * variants cuGetProcAddress hands out under
 * CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM (CUDA 11.8-13 names). */
#define PROFI_CU_LAUNCH_FUNCS(X)                                                      \
	X(cuLaunchKernel, (CUfunction f, unsigned gridDimX, unsigned gridDimY,        \
			   unsigned gridDimZ, unsigned blockDimX, unsigned blockDimY, \
			   unsigned blockDimZ, unsigned sharedMemBytes, CUstream hStream, \
			   void **kernelParams, void **extra))                        \
	X(cuLaunchKernel_ptsz, (CUfunction f, unsigned gridDimX, unsigned gridDimY,   \
				unsigned gridDimZ, unsigned blockDimX, unsigned blockDimY, \
				unsigned blockDimZ, unsigned sharedMemBytes,          \
				CUstream hStream, void **kernelParams, void **extra)) \
	X(cuLaunchKernelEx, (const CUlaunchConfig *config, CUfunction f,              \
			     void **kernelParams, void **extra))                      \
	X(cuLaunchKernelEx_ptsz, (const CUlaunchConfig *config, CUfunction f,         \
				  void **kernelParams, void **extra))                 \
	X(cuLaunchCooperativeKernel, (CUfunction f, unsigned gridDimX, unsigned gridDimY, \
				      unsigned gridDimZ, unsigned blockDimX,          \
				      unsigned blockDimY, unsigned blockDimZ,         \
				      unsigned sharedMemBytes, CUstream hStream,      \
				      void **kernelParams))                           \
	X(cuLaunchCooperativeKernel_ptsz, (CUfunction f, unsigned gridDimX,           \
					   unsigned gridDimY, unsigned gridDimZ,      \
					   unsigned blockDimX, unsigned blockDimY,    \
					   unsigned blockDimZ, unsigned sharedMemBytes, \
					   CUstream hStream, void **kernelParams))    \
	X(cuGraphLaunch, (CUgraphExec hGraphExec, CUstream hStream))                  \
	X(cuGraphLaunch_ptsz, (CUgraphExec hGraphExec, CUstream hStream))

#define PROFI_DECLARE_CU_LAUNCH(name, params) CUresult name params;
PROFI_CU_LAUNCH_FUNCS(PROFI_DECLARE_CU_LAUNCH)
#undef PROFI_DECLARE_CU_LAUNCH

/* Stream capture, events and graphs (CUDA 12.4 / r550 names and
 * prototypes; cuStreamBeginCapture is CUDA 10.0's form without a mode,
 * cuGraphInstantiate and cuGraphInstantiate_v2 the CUDA 11 ABI with an error
 * node and log buffer, cuGraphExecUpdate the CUDA 11 ABI with an error node
 * and result, all still exported). */
#define PROFI_CU_GRAPH_FUNCS(X)                                                         \
	X(cuStreamBeginCapture, (CUstream hStream))                                     \
	X(cuStreamBeginCapture_ptsz, (CUstream hStream))                                \
	X(cuStreamBeginCapture_v2, (CUstream hStream, CUstreamCaptureMode mode))        \
	X(cuStreamBeginCapture_v2_ptsz, (CUstream hStream, CUstreamCaptureMode mode))   \
	X(cuStreamBeginCaptureToGraph, (CUstream hStream, CUgraph hGraph,               \
					const CUgraphNode *dependencies,                \
					const void *dependencyData, size_t numDependencies, \
					CUstreamCaptureMode mode))                      \
	X(cuStreamBeginCaptureToGraph_ptsz, (CUstream hStream, CUgraph hGraph,          \
					     const CUgraphNode *dependencies,           \
					     const void *dependencyData,                \
					     size_t numDependencies, CUstreamCaptureMode mode)) \
	X(cuStreamEndCapture, (CUstream hStream, CUgraph * phGraph))                    \
	X(cuStreamEndCapture_ptsz, (CUstream hStream, CUgraph * phGraph))               \
	X(cuStreamIsCapturing, (CUstream hStream, CUstreamCaptureStatus * captureStatus)) \
	X(cuStreamIsCapturing_ptsz, (CUstream hStream, CUstreamCaptureStatus * captureStatus)) \
	X(cuStreamSynchronize, (CUstream hStream))                                      \
	X(cuStreamSynchronize_ptsz, (CUstream hStream))                                 \
	X(cuEventCreate, (CUevent * phEvent, unsigned Flags))                           \
	X(cuEventDestroy_v2, (CUevent hEvent))                                          \
	X(cuEventRecord, (CUevent hEvent, CUstream hStream))                            \
	X(cuEventRecord_ptsz, (CUevent hEvent, CUstream hStream))                       \
	X(cuEventRecordWithFlags, (CUevent hEvent, CUstream hStream, unsigned flags))   \
	X(cuEventRecordWithFlags_ptsz, (CUevent hEvent, CUstream hStream, unsigned flags)) \
	X(cuStreamWaitEvent, (CUstream hStream, CUevent hEvent, unsigned Flags))        \
	X(cuStreamWaitEvent_ptsz, (CUstream hStream, CUevent hEvent, unsigned Flags))   \
	X(cuGraphCreate, (CUgraph * phGraph, unsigned flags))                           \
	X(cuGraphDestroy, (CUgraph hGraph))                                             \
	X(cuGraphInstantiate, (CUgraphExec * phGraphExec, CUgraph hGraph,               \
			       CUgraphNode * phErrorNode, char *logBuffer, size_t bufferSize)) \
	X(cuGraphInstantiate_v2, (CUgraphExec * phGraphExec, CUgraph hGraph,            \
				  CUgraphNode * phErrorNode, char *logBuffer,           \
				  size_t bufferSize))                                   \
	X(cuGraphInstantiateWithFlags, (CUgraphExec * phGraphExec, CUgraph hGraph,      \
					unsigned long long flags))                      \
	X(cuGraphInstantiateWithParams, (CUgraphExec * phGraphExec, CUgraph hGraph,     \
					 CUDA_GRAPH_INSTANTIATE_PARAMS * instantiateParams)) \
	X(cuGraphInstantiateWithParams_ptsz, (CUgraphExec * phGraphExec, CUgraph hGraph, \
					      CUDA_GRAPH_INSTANTIATE_PARAMS * instantiateParams)) \
	X(cuGraphExecUpdate, (CUgraphExec hGraphExec, CUgraph hGraph,                   \
			      CUgraphNode * hErrorNode_out,                             \
			      CUgraphExecUpdateResult * updateResult_out))              \
	X(cuGraphExecUpdate_v2, (CUgraphExec hGraphExec, CUgraph hGraph,                \
				 CUgraphExecUpdateResultInfo * resultInfo))             \
	X(cuGraphExecDestroy, (CUgraphExec hGraphExec))                                 \
	X(cuGraphAddKernelNode, (CUgraphNode * phGraphNode, CUgraph hGraph,             \
				 const CUgraphNode *dependencies, size_t numDependencies, \
				 const CUDA_KERNEL_NODE_PARAMS_v1 *nodeParams))         \
	X(cuGraphAddKernelNode_v2, (CUgraphNode * phGraphNode, CUgraph hGraph,          \
				    const CUgraphNode *dependencies,                    \
				    size_t numDependencies,                             \
				    const CUDA_KERNEL_NODE_PARAMS *nodeParams))         \
	X(cuGraphAddMemcpyNode, (CUgraphNode * phGraphNode, CUgraph hGraph,             \
				 const CUgraphNode *dependencies, size_t numDependencies, \
				 const CUDA_MEMCPY3D *copyParams, CUcontext ctx))       \
	X(cuGraphAddMemsetNode, (CUgraphNode * phGraphNode, CUgraph hGraph,             \
				 const CUgraphNode *dependencies, size_t numDependencies, \
				 const CUDA_MEMSET_NODE_PARAMS *memsetParams, CUcontext ctx)) \
	X(cuGraphAddChildGraphNode, (CUgraphNode * phGraphNode, CUgraph hGraph,         \
				     const CUgraphNode *dependencies,                   \
				     size_t numDependencies, CUgraph childGraph))       \
	X(cuGraphGetNodes, (CUgraph hGraph, CUgraphNode * nodes, size_t *numNodes))     \
	X(cuGraphNodeGetType, (CUgraphNode hNode, CUgraphNodeType * type))              \
	X(cuGetExportTable, (const void **ppExportTable, const CUuuid *pExportTableId))

#define PROFI_DECLARE_CU_GRAPH(name, params) CUresult name params;
PROFI_CU_GRAPH_FUNCS(PROFI_DECLARE_CU_GRAPH)
#undef PROFI_DECLARE_CU_GRAPH

#endif
