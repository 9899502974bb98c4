/* Minimal CUDA Runtime 12 types and prototypes shared by the stub library
 * (cudart.c) and the workload (workload.c). Only what the project probes or
 * the workload needs; the layouts and calling conventions match the real
 * cuda_runtime_api.h on x86-64 SysV so uprobes read the same registers. */
#ifndef PROFI_CUDA_STUB_H
#define PROFI_CUDA_STUB_H

#include <stddef.h>

typedef int cudaError_t;
typedef struct CUstream_st *cudaStream_t;
typedef struct CUkern_st *cudaKernel_t; /* CUDA 12+: an opaque kernel handle */
typedef struct CUgraph_st *cudaGraph_t;
typedef struct CUgraphExec_st *cudaGraphExec_t;
typedef struct CUevent_st *cudaEvent_t;
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
	cudaErrorInvalidMemcpyDirection = 21,
	cudaErrorInvalidDeviceFunction = 98,
	cudaErrorInvalidDevice = 101,
	cudaErrorInvalidResourceHandle = 400,
};

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

#define PROFI_DECLARE_FUNC(name, params) cudaError_t name params;
PROFI_CUDA_CORE_FUNCS(PROFI_DECLARE_FUNC)
PROFI_CUDA_EXTRA_FUNCS(PROFI_DECLARE_FUNC)
PROFI_CUDA_PTSZ_FUNCS(PROFI_DECLARE_FUNC)
PROFI_CUDA_GRAPH_FUNCS(PROFI_DECLARE_FUNC)
#undef PROFI_DECLARE_FUNC

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
