/* Stub libcudart.so.12: the real CUDA Runtime symbol names and C ABI with
 * deterministic, GPU-free semantics, so the workload can predict every return
 * value and tests can compare the agent's counts with exact ground truth.
 *
 * Built only with the fixed flags in internal/testutil/build.go: they decide
 * each function's first instruction and hence what a uprobe costs there.
 * -DPROFI_STUB_OMIT_GRAPH drops the graph functions ("missing symbols"). */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "cuda_stub.h"

#define EXPORT __attribute__((noinline, visibility("default")))

/* Volatile sinks give every function observable work, so none is empty or
 * folded away, and expose the last launch's arguments to a debugger. */
static volatile uintptr_t sink;
static volatile cudaError_t last_rc;
static volatile uintptr_t last_func, last_args, last_stream;
static volatile unsigned last_grid[3], last_block[3];
static volatile size_t last_shared;

/* Fake handles: unique, never dereferenced, recognisable in a dump. */
static uintptr_t next_dev_ptr; /* device pointers: 0x7e0000000000 + n*0x10000 */
static uintptr_t next_stream;  /* streams: 0x5000 + n*0x10, never 0 (default) */

/* Live device pointers, so cudaFree can reject unknown and double frees.
 * The workload keeps few allocations alive, so a linear scan is enough. */
static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static uintptr_t *live;
static size_t live_len, live_cap;

static int live_add(uintptr_t p)
{
	int ok = 1;
	pthread_mutex_lock(&live_mu);
	if (live_len == live_cap) {
		size_t cap = live_cap ? live_cap * 2 : 64;
		uintptr_t *n = realloc(live, cap * sizeof(*n));
		if (n) {
			live = n;
			live_cap = cap;
		} else {
			ok = 0;
		}
	}
	if (ok)
		live[live_len++] = p;
	pthread_mutex_unlock(&live_mu);
	return ok;
}

static int live_remove(uintptr_t p)
{
	int found = 0;
	pthread_mutex_lock(&live_mu);
	for (size_t i = 0; i < live_len; i++) {
		if (live[i] == p) {
			live[i] = live[--live_len];
			found = 1;
			break;
		}
	}
	pthread_mutex_unlock(&live_mu);
	return found;
}

/* Each exported function is a thin wrapper that calls an out-of-line static
 * implementation and then stores its result, like the real cudart's API
 * entry points. The call is never in tail position, so with
 * -fno-omit-frame-pointer every exported symbol starts with the same
 * "push %rbp; mov %rsp,%rbp" prologue: leaf or tail-calling functions would
 * otherwise start with arbitrary (often RIP-relative) instructions, and the
 * first instruction decides how the kernel handles a uprobe there. */
#define INTERNAL static __attribute__((noinline))
#define WRAP(call)                       \
	do {                             \
		cudaError_t rc_ = (call); \
		last_rc = rc_;           \
		return rc_;              \
	} while (0)

INTERNAL cudaError_t do_malloc(void **devPtr, size_t size, cudaStream_t stream)
{
	sink = size ^ (uintptr_t)stream;
	if (!devPtr)
		return cudaErrorInvalidValue;
	if (size == 0 || size > (1ULL << 40))
		return cudaErrorMemoryAllocation;
	uintptr_t n = __atomic_add_fetch(&next_dev_ptr, 1, __ATOMIC_RELAXED);
	uintptr_t p = 0x7e0000000000ULL + n * 0x10000;
	if (!live_add(p))
		return cudaErrorMemoryAllocation;
	*devPtr = (void *)p;
	return cudaSuccess;
}

INTERNAL cudaError_t do_free(void *devPtr, cudaStream_t stream)
{
	sink = (uintptr_t)devPtr ^ (uintptr_t)stream;
	if (!devPtr)
		return cudaSuccess;
	return live_remove((uintptr_t)devPtr) ? cudaSuccess : cudaErrorInvalidValue;
}

/* Buffers are fake device pointers: never touched. */
INTERNAL cudaError_t do_memcpy(void *dst, const void *src, size_t count,
			       enum cudaMemcpyKind kind, cudaStream_t stream)
{
	sink = (uintptr_t)dst ^ (uintptr_t)src ^ count ^ (uintptr_t)stream;
	/* Unsigned compare so negative kinds are rejected too. */
	return (unsigned)kind <= cudaMemcpyDefault ? cudaSuccess
						   : cudaErrorInvalidMemcpyDirection;
}

INTERNAL cudaError_t do_launch(const void *func, dim3 grid, dim3 block,
			       void **args, size_t sharedMem, cudaStream_t stream)
{
	last_func = (uintptr_t)func;
	last_grid[0] = grid.x;
	last_grid[1] = grid.y;
	last_grid[2] = grid.z;
	last_block[0] = block.x;
	last_block[1] = block.y;
	last_block[2] = block.z;
	last_args = (uintptr_t)args;
	last_shared = sharedMem;
	last_stream = (uintptr_t)stream;
	return func ? cudaSuccess : cudaErrorInvalidDeviceFunction;
}

/* Hands out base + n*0x10 (n >= 1) in *out: fake, never-zero handles. */
INTERNAL cudaError_t do_handle(void **out, uintptr_t *counter, uintptr_t base)
{
	if (!out)
		return cudaErrorInvalidValue;
	uintptr_t n = __atomic_add_fetch(counter, 1, __ATOMIC_RELAXED);
	*out = (void *)(base + n * 0x10);
	sink = n;
	return cudaSuccess;
}

INTERNAL cudaError_t do_last_error(void)
{
	sink = 0;
	return cudaSuccess; /* nothing ever fails asynchronously here */
}

INTERNAL cudaError_t do_device_count(int *count)
{
	if (!count)
		return cudaErrorInvalidValue;
	*count = 1;
	return cudaSuccess;
}

EXPORT cudaError_t cudaMalloc(void **devPtr, size_t size)
{
	WRAP(do_malloc(devPtr, size, NULL));
}

EXPORT cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t stream)
{
	WRAP(do_malloc(devPtr, size, stream));
}

EXPORT cudaError_t cudaFree(void *devPtr)
{
	WRAP(do_free(devPtr, NULL));
}

EXPORT cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t stream)
{
	WRAP(do_free(devPtr, stream));
}

EXPORT cudaError_t cudaMemcpy(void *dst, const void *src, size_t count,
			      enum cudaMemcpyKind kind)
{
	WRAP(do_memcpy(dst, src, count, kind, NULL));
}

EXPORT cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count,
				   enum cudaMemcpyKind kind, cudaStream_t stream)
{
	WRAP(do_memcpy(dst, src, count, kind, stream));
}

EXPORT cudaError_t cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim,
				    void **args, size_t sharedMem,
				    cudaStream_t stream)
{
	WRAP(do_launch(func, gridDim, blockDim, args, sharedMem, stream));
}

#ifndef PROFI_STUB_OMIT_GRAPH
static uintptr_t next_exec; /* graph execs: 0x6000 + n*0x10 */

INTERNAL cudaError_t do_graph_instantiate(cudaGraphExec_t *pGraphExec,
					  cudaGraph_t graph,
					  unsigned long long flags)
{
	sink = (uintptr_t)graph ^ flags;
	return do_handle((void **)pGraphExec, &next_exec, 0x6000);
}

INTERNAL cudaError_t do_graph_launch(cudaGraphExec_t exec, cudaStream_t stream)
{
	sink = (uintptr_t)exec ^ (uintptr_t)stream;
	return exec ? cudaSuccess : cudaErrorInvalidResourceHandle;
}

EXPORT cudaError_t cudaGraphInstantiate(cudaGraphExec_t *pGraphExec,
					cudaGraph_t graph,
					unsigned long long flags)
{
	WRAP(do_graph_instantiate(pGraphExec, graph, flags));
}

EXPORT cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream)
{
	WRAP(do_graph_launch(exec, stream));
}
#endif

EXPORT cudaError_t cudaStreamCreate(cudaStream_t *pStream)
{
	WRAP(do_handle((void **)pStream, &next_stream, 0x5000));
}

EXPORT cudaError_t cudaGetLastError(void)
{
	WRAP(do_last_error());
}

EXPORT cudaError_t cudaGetDeviceCount(int *count)
{
	WRAP(do_device_count(count));
}
