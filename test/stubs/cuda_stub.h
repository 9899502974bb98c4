/* Minimal CUDA Runtime 12 types and prototypes shared by the stub library
 * (cudart.c) and the workload (workload.c). Only what the project probes or
 * the workload needs; the layouts and calling conventions match the real
 * cuda_runtime_api.h on x86-64 SysV so uprobes read the same registers. */
#ifndef PROFI_CUDA_STUB_H
#define PROFI_CUDA_STUB_H

#include <stddef.h>

typedef int cudaError_t;
typedef struct CUstream_st *cudaStream_t;
typedef struct CUgraph_st *cudaGraph_t;
typedef struct CUgraphExec_st *cudaGraphExec_t;
typedef struct {
	unsigned x, y, z;
} dim3;

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
	cudaErrorInvalidResourceHandle = 400,
};

/* X-macro over every exported function: name, parameter list. All return
 * cudaError_t. The workload uses it to declare dlsym'd pointers. */
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

/* Omitted from the PROFI_STUB_OMIT_GRAPH build ("library missing symbols"). */
#define PROFI_CUDA_GRAPH_FUNCS(X)                                             \
	X(cudaGraphLaunch, (cudaGraphExec_t exec, cudaStream_t stream))       \
	X(cudaGraphInstantiate, (cudaGraphExec_t * pGraphExec,                \
				 cudaGraph_t graph, unsigned long long flags))

#define PROFI_DECLARE_FUNC(name, params) cudaError_t name params;
PROFI_CUDA_CORE_FUNCS(PROFI_DECLARE_FUNC)
PROFI_CUDA_GRAPH_FUNCS(PROFI_DECLARE_FUNC)
#undef PROFI_DECLARE_FUNC

#endif
