/* Stub libcudart.so.12 and libcudart.so.13: the real CUDA Runtime symbol
 * names and C ABI with deterministic, GPU-free semantics, so the workload can
 * predict every return value and tests can compare the agent's counts with
 * exact ground truth.
 *
 * Built only with the fixed flags in internal/testutil/build.go: they decide
 * each function's first instruction and hence what a uprobe costs there.
 * -DPROFI_STUB_OMIT_GRAPH drops the graph functions ("missing symbols").
 * -DPROFI_STUB_LOCKED_GRAPH=1|2 makes cudaGraphLaunch start with a
 * lock-prefixed instruction, where the kernel refuses uprobes (see there).
 * -DPROFI_CUDART_MAJOR=13 models CUDA 13.0's runtime (adds the
 * __cudaGetKernel/__cudaLaunchKernel entry points); the default, 12, models
 * CUDA 12.x, which lacks them. Each build gets the version script of its
 * release (test/stubs/libcudart.so.N.map): like NVIDIA's, every export is
 * versioned with the SONAME (cudaMalloc@@libcudart.so.12).
 *
 * Compiled into an executable (no -shared), it is a
 * statically linked runtime, as nvcc's default (-cudart static), NCCL and
 * TensorRT-LLM builds are: no libcudart.so in /proc/PID/maps.
 *
 * Like the real runtime, it implements launches by calling the driver (the
 * stub libcuda.so.1, through its exported symbols, so driver uprobes fire
 * inside runtime calls): cudaLaunchKernel -> cuLaunchKernel,
 * cudaLaunchKernel_ptsz -> cuLaunchKernel_ptsz, cudaLaunchCooperativeKernel
 * and cudaLaunchCooperativeKernel_ptsz -> cuLaunchCooperativeKernel,
 * cudaLaunchKernelExC and cudaLaunchKernelExC_ptsz -> cuLaunchKernelEx,
 * cudaGraphLaunch and cudaGraphLaunch_ptsz -> cuGraphLaunch (always, even
 * for a NULL exec). A launch with a NULL function or config fails in the
 * runtime and reaches no driver function. Nothing else calls the driver:
 * registration hands out its own CUfunction handles. (The real runtime
 * loads modules through the driver too, lazily; those internal calls are
 * counted as driver calls when they happen after attach, which depends on
 * timing, so the stub keeps them out of the tests' ground truth.)
 *
 * PROFI_STUB_LAUNCH=runtime in the environment makes every launch return in
 * the runtime without calling the driver (a runtime that launches some other
 * way than through the driver's exported functions).
 *
 * CUDA 13's launch entry points (what nvcc 13 lowers kernel<<<...>>> to):
 * __cudaGetKernel(&handle, hostStub) hands out an opaque cudaKernel_t (not
 * the stub's address), and __cudaLaunchKernel(handle, grid, block, args,
 * shmem, stream) and __cudaLaunchKernel_ptsz launch it as cudaLaunchKernel
 * and cudaLaunchKernel_ptsz do, through cuLaunchKernel(_ptsz).
 *
 * The per-thread default stream variants (_ptds for functions without a
 * stream argument, _ptsz for those with one, what nvcc
 * --default-stream per-thread compiles calls into) are distinct exported
 * functions with the same semantics and return codes as their base
 * functions. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "cuda_drv_stub.h"
#include "cuda_stub.h"

#define EXPORT __attribute__((noinline, visibility("default")))

#ifndef PROFI_CUDART_MAJOR
#define PROFI_CUDART_MAJOR 12
#endif

/* Volatile sinks give every function observable work, so none is empty or
 * folded away, and expose the last launch's arguments to a debugger. */
static volatile uintptr_t sink;
static volatile cudaError_t last_rc;
static volatile uintptr_t last_func, last_args, last_stream;
static volatile unsigned last_grid[3], last_block[3];
static volatile size_t last_shared;

/* cudaStreamPerThread, the stream the _ptds variants work on. */
#define PER_THREAD_STREAM ((cudaStream_t)(uintptr_t)0x2)

/* Fake handles: unique, never dereferenced, recognisable in a dump. */
static uintptr_t next_dev_ptr; /* device pointers: 0x7e0000000000 + n*0x10000 */
static uintptr_t next_stream;  /* streams: 0x5000 + n*0x10, never 0 (default) */

static uintptr_t next_host_ptr; /* pinned host: 0x7d0000000000 + n*0x10000 */

/* Live pointers, so frees can reject unknown and double frees: one set for
 * device (and managed) memory, freed with cudaFree, one for pinned host
 * memory, freed with cudaFreeHost. The workload keeps few allocations
 * alive, so a linear scan is enough. */
struct live_set {
	pthread_mutex_t mu;
	uintptr_t *p;
	size_t len, cap;
};
static struct live_set live_dev = {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0};
static struct live_set live_host = {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0};

static int live_add(struct live_set *l, uintptr_t p)
{
	int ok = 1;
	pthread_mutex_lock(&l->mu);
	if (l->len == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 64;
		uintptr_t *n = realloc(l->p, cap * sizeof(*n));
		if (n) {
			l->p = n;
			l->cap = cap;
		} else {
			ok = 0;
		}
	}
	if (ok)
		l->p[l->len++] = p;
	pthread_mutex_unlock(&l->mu);
	return ok;
}

static int live_remove(struct live_set *l, uintptr_t p)
{
	int found = 0;
	pthread_mutex_lock(&l->mu);
	for (size_t i = 0; i < l->len; i++) {
		if (l->p[i] == p) {
			l->p[i] = l->p[--l->len];
			found = 1;
			break;
		}
	}
	pthread_mutex_unlock(&l->mu);
	return found;
}

/* Registered kernels: host stub address -> driver function. Append-only and
 * published with a release store, so launches look up without a lock. */
#define MAX_REGS 1024
struct fatbin {
	CUmodule mod;
	int dead; /* unregistered: its kernels fall back to the host address */
};
static struct reg {
	const void *host;
	CUfunction f;
	struct fatbin *fb;
} regs[MAX_REGS];
static size_t nregs;
static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;

/* Per-thread current device, as in the real runtime. */
static _Thread_local int cur_device;

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

INTERNAL cudaError_t do_alloc(struct live_set *l, void **ptr, size_t size,
			      uintptr_t *counter, uintptr_t base)
{
	if (!ptr)
		return cudaErrorInvalidValue;
	if (size == 0 || size > (1ULL << 40))
		return cudaErrorMemoryAllocation;
	uintptr_t n = __atomic_add_fetch(counter, 1, __ATOMIC_RELAXED);
	uintptr_t p = base + n * 0x10000;
	if (!live_add(l, p))
		return cudaErrorMemoryAllocation;
	*ptr = (void *)p;
	return cudaSuccess;
}

INTERNAL cudaError_t do_malloc(void **devPtr, size_t size, cudaStream_t stream)
{
	sink = size ^ (uintptr_t)stream;
	return do_alloc(&live_dev, devPtr, size, &next_dev_ptr, 0x7e0000000000ULL);
}

/* Managed memory is device memory for bookkeeping: freed with cudaFree. */
INTERNAL cudaError_t do_malloc_managed(void **devPtr, size_t size, unsigned flags)
{
	sink = size ^ flags;
	if (flags != cudaMemAttachGlobal && flags != cudaMemAttachHost)
		return cudaErrorInvalidValue;
	return do_alloc(&live_dev, devPtr, size, &next_dev_ptr, 0x7e0000000000ULL);
}

INTERNAL cudaError_t do_malloc_host(void **ptr, size_t size)
{
	sink = size;
	return do_alloc(&live_host, ptr, size, &next_host_ptr, 0x7d0000000000ULL);
}

INTERNAL cudaError_t do_free(void *devPtr, cudaStream_t stream)
{
	sink = (uintptr_t)devPtr ^ (uintptr_t)stream;
	if (!devPtr)
		return cudaSuccess;
	return live_remove(&live_dev, (uintptr_t)devPtr) ? cudaSuccess : cudaErrorInvalidValue;
}

INTERNAL cudaError_t do_free_host(void *ptr)
{
	sink = (uintptr_t)ptr;
	if (!ptr)
		return cudaSuccess;
	return live_remove(&live_host, (uintptr_t)ptr) ? cudaSuccess : cudaErrorInvalidValue;
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

INTERNAL cudaError_t do_memcpy_2d(void *dst, size_t dpitch, const void *src,
				  size_t spitch, size_t width, size_t height,
				  enum cudaMemcpyKind kind, cudaStream_t stream)
{
	sink = dpitch ^ spitch ^ width ^ height;
	return do_memcpy(dst, src, width * height, kind, stream);
}

/* Any devices, any size: a peer copy always succeeds. */
INTERNAL cudaError_t do_memcpy_peer(void *dst, int dstDevice, const void *src,
				    int srcDevice, size_t count, cudaStream_t stream)
{
	sink = (uintptr_t)dst ^ (uintptr_t)src ^ count ^ (uintptr_t)stream ^
	       (unsigned)dstDevice ^ ((uintptr_t)(unsigned)srcDevice << 32);
	return cudaSuccess;
}

INTERNAL cudaError_t do_memset(void *devPtr, int value, size_t count, cudaStream_t stream)
{
	sink = (uintptr_t)devPtr ^ (unsigned)value ^ count ^ (uintptr_t)stream;
	return devPtr ? cudaSuccess : cudaErrorInvalidValue;
}

/* The registered driver function for a host stub, else the address itself
 * (what the runtime would hand the driver for an unknown kernel). */
static CUfunction lookup_function(const void *host)
{
	size_t n = __atomic_load_n(&nregs, __ATOMIC_ACQUIRE);
	for (size_t i = 0; i < n; i++)
		if (regs[i].host == host && !__atomic_load_n(&regs[i].fb->dead, __ATOMIC_RELAXED))
			return regs[i].f;
	return (CUfunction)host;
}

enum launch_api { L_PLAIN, L_PTSZ, L_COOP };

/* The runtime rejects a NULL function itself; everything else is the
 * driver's answer (codes it can return here mean the same in both APIs). */
/* launch_in_runtime: PROFI_STUB_LAUNCH=runtime, read once. */
static int launch_in_runtime(void)
{
	static int v = -1;
	if (v < 0) {
		const char *e = getenv("PROFI_STUB_LAUNCH");
		v = e && e[0] == 'r';
	}
	return v;
}

INTERNAL cudaError_t do_launch(enum launch_api api, const void *func, dim3 grid,
			       dim3 block, void **args, size_t sharedMem,
			       cudaStream_t stream)
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
	if (!func)
		return cudaErrorInvalidDeviceFunction;
	if (launch_in_runtime())
		return cudaSuccess;
	CUfunction f = lookup_function(func);
	CUstream s = (CUstream)stream;
	unsigned shm = (unsigned)sharedMem;
	switch (api) {
	case L_PTSZ:
		return cuLaunchKernel_ptsz(f, grid.x, grid.y, grid.z, block.x, block.y,
					   block.z, shm, s, args, NULL);
	case L_COOP:
		return cuLaunchCooperativeKernel(f, grid.x, grid.y, grid.z, block.x,
						 block.y, block.z, shm, s, args);
	default:
		return cuLaunchKernel(f, grid.x, grid.y, grid.z, block.x, block.y,
				      block.z, shm, s, args, NULL);
	}
}

INTERNAL cudaError_t do_launch_ex(const cudaLaunchConfig_t *config, const void *func,
				  void **args)
{
	if (!config)
		return cudaErrorInvalidValue;
	last_func = (uintptr_t)func;
	last_args = (uintptr_t)args;
	if (!func)
		return cudaErrorInvalidDeviceFunction;
	if (launch_in_runtime())
		return cudaSuccess;
	CUlaunchConfig c = {
		.gridDimX = config->gridDim.x, .gridDimY = config->gridDim.y,
		.gridDimZ = config->gridDim.z, .blockDimX = config->blockDim.x,
		.blockDimY = config->blockDim.y, .blockDimZ = config->blockDim.z,
		.sharedMemBytes = (unsigned)config->dynamicSmemBytes,
		.hStream = (CUstream)config->stream,
		.attrs = config->attrs, .numAttrs = config->numAttrs,
	};
	return cuLaunchKernelEx(&c, lookup_function(func), args, NULL);
}

INTERNAL cudaError_t do_sync(uintptr_t what)
{
	sink = what;
	return cudaSuccess; /* nothing ever runs, so nothing is pending */
}

INTERNAL cudaError_t do_event_sync(cudaEvent_t event)
{
	sink = (uintptr_t)event;
	return event ? cudaSuccess : cudaErrorInvalidResourceHandle;
}

/* Four devices, although cudaGetDeviceCount says 1 (kept for old tests). */
INTERNAL cudaError_t do_set_device(int device)
{
	sink = (unsigned)device;
	if (device < 0 || device >= 4)
		return cudaErrorInvalidDevice;
	cur_device = device;
	return cudaSuccess;
}

INTERNAL cudaError_t do_get_device(int *device)
{
	if (!device)
		return cudaErrorInvalidValue;
	*device = cur_device;
	return cudaSuccess;
}

/* nvcc passes a wrapper the stub never reads. */
INTERNAL void **do_register_fatbin(void *fatCubin)
{
	struct fatbin *fb = calloc(1, sizeof(*fb));
	if (!fb)
		return NULL;
	fb->mod = (CUmodule)fatCubin;
	return (void **)fb;
}

INTERNAL int do_register_function(void **handle, const char *hostFun, const char *deviceFun)
{
	struct fatbin *fb = (struct fatbin *)handle;
	CUfunction f;
	int ok = 0;
	if (!fb || !hostFun || !deviceFun)
		return 0;
	pthread_mutex_lock(&reg_mu);
	/* A handle of its own, unique per registration, never NULL. */
	f = (CUfunction)(uintptr_t)(0xf0000000u + 0x100u * (unsigned)(nregs + 1));
	if (nregs < MAX_REGS) {
		regs[nregs] = (struct reg){hostFun, f, fb};
		__atomic_store_n(&nregs, nregs + 1, __ATOMIC_RELEASE);
		ok = 1;
	}
	pthread_mutex_unlock(&reg_mu);
	return ok;
}

INTERNAL int do_unregister_fatbin(void **handle)
{
	struct fatbin *fb = (struct fatbin *)handle;
	if (!fb)
		return 0;
	/* Never freed: a concurrent launch may still be reading its entries. */
	__atomic_store_n(&fb->dead, 1, __ATOMIC_RELAXED);
	return 1;
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
	WRAP(do_launch(L_PLAIN, func, gridDim, blockDim, args, sharedMem, stream));
}

EXPORT cudaError_t cudaLaunchKernel_ptsz(const void *func, dim3 gridDim, dim3 blockDim,
					 void **args, size_t sharedMem,
					 cudaStream_t stream)
{
	WRAP(do_launch(L_PTSZ, func, gridDim, blockDim, args, sharedMem, stream));
}

#if PROFI_CUDART_MAJOR >= 13
/* cudaKernel_t handles: the host stub's address xor this, never the stub itself. */
#define KERNEL_HANDLE_XOR 0x4b00000000000000ULL

INTERNAL cudaError_t do_get_kernel(cudaKernel_t *kernel, const void *hostFun)
{
	if (!kernel || !hostFun)
		return cudaErrorInvalidValue;
	*kernel = (cudaKernel_t)((uintptr_t)hostFun ^ KERNEL_HANDLE_XOR);
	return cudaSuccess;
}

EXPORT cudaError_t __cudaGetKernel(cudaKernel_t *kernel, const void *hostFun)
{
	WRAP(do_get_kernel(kernel, hostFun));
}

static const void *kernel_stub(cudaKernel_t kernel)
{
	return kernel ? (const void *)((uintptr_t)kernel ^ KERNEL_HANDLE_XOR) : NULL;
}

EXPORT cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim,
				      void **args, size_t sharedMem, cudaStream_t stream)
{
	WRAP(do_launch(L_PLAIN, kernel_stub(kernel), gridDim, blockDim, args, sharedMem, stream));
}

EXPORT cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim,
					   void **args, size_t sharedMem, cudaStream_t stream)
{
	WRAP(do_launch(L_PTSZ, kernel_stub(kernel), gridDim, blockDim, args, sharedMem, stream));
}
#endif

EXPORT cudaError_t cudaLaunchCooperativeKernel(const void *func, dim3 gridDim,
					       dim3 blockDim, void **args,
					       size_t sharedMem, cudaStream_t stream)
{
	WRAP(do_launch(L_COOP, func, gridDim, blockDim, args, sharedMem, stream));
}

EXPORT cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func,
				       void **args)
{
	WRAP(do_launch_ex(config, func, args));
}

EXPORT cudaError_t cudaMemcpyAsync_ptsz(void *dst, const void *src, size_t count,
					enum cudaMemcpyKind kind, cudaStream_t stream)
{
	WRAP(do_memcpy(dst, src, count, kind, stream));
}

EXPORT cudaError_t cudaMemcpyPeer(void *dst, int dstDevice, const void *src,
				  int srcDevice, size_t count)
{
	WRAP(do_memcpy_peer(dst, dstDevice, src, srcDevice, count, NULL));
}

EXPORT cudaError_t cudaMemcpyPeerAsync(void *dst, int dstDevice, const void *src,
				       int srcDevice, size_t count, cudaStream_t stream)
{
	WRAP(do_memcpy_peer(dst, dstDevice, src, srcDevice, count, stream));
}

EXPORT cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch,
				size_t width, size_t height, enum cudaMemcpyKind kind)
{
	WRAP(do_memcpy_2d(dst, dpitch, src, spitch, width, height, kind, NULL));
}

EXPORT cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src,
				     size_t spitch, size_t width, size_t height,
				     enum cudaMemcpyKind kind, cudaStream_t stream)
{
	WRAP(do_memcpy_2d(dst, dpitch, src, spitch, width, height, kind, stream));
}

EXPORT cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned flags)
{
	WRAP(do_malloc_managed(devPtr, size, flags));
}

EXPORT cudaError_t cudaMallocHost(void **ptr, size_t size)
{
	WRAP(do_malloc_host(ptr, size));
}

EXPORT cudaError_t cudaFreeHost(void *ptr)
{
	WRAP(do_free_host(ptr));
}

EXPORT cudaError_t cudaMemset(void *devPtr, int value, size_t count)
{
	WRAP(do_memset(devPtr, value, count, NULL));
}

EXPORT cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count,
				   cudaStream_t stream)
{
	WRAP(do_memset(devPtr, value, count, stream));
}

EXPORT cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
	WRAP(do_sync((uintptr_t)stream));
}

EXPORT cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
	WRAP(do_event_sync(event));
}

EXPORT cudaError_t cudaDeviceSynchronize(void)
{
	WRAP(do_sync(0));
}

EXPORT cudaError_t cudaSetDevice(int device)
{
	WRAP(do_set_device(device));
}

EXPORT cudaError_t cudaGetDevice(int *device)
{
	WRAP(do_get_device(device));
}

/* Per-thread default stream variants: same implementations as the base
 * functions, each its own exported (noinline, never folded) function. */
EXPORT cudaError_t cudaMemcpy_ptds(void *dst, const void *src, size_t count,
				   enum cudaMemcpyKind kind)
{
	WRAP(do_memcpy(dst, src, count, kind, PER_THREAD_STREAM));
}

EXPORT cudaError_t cudaMemcpy2D_ptds(void *dst, size_t dpitch, const void *src,
				     size_t spitch, size_t width, size_t height,
				     enum cudaMemcpyKind kind)
{
	WRAP(do_memcpy_2d(dst, dpitch, src, spitch, width, height, kind, PER_THREAD_STREAM));
}

EXPORT cudaError_t cudaMemcpy2DAsync_ptsz(void *dst, size_t dpitch, const void *src,
					  size_t spitch, size_t width, size_t height,
					  enum cudaMemcpyKind kind, cudaStream_t stream)
{
	WRAP(do_memcpy_2d(dst, dpitch, src, spitch, width, height, kind, stream));
}

EXPORT cudaError_t cudaMemset_ptds(void *devPtr, int value, size_t count)
{
	WRAP(do_memset(devPtr, value, count, PER_THREAD_STREAM));
}

EXPORT cudaError_t cudaMemsetAsync_ptsz(void *devPtr, int value, size_t count,
					cudaStream_t stream)
{
	WRAP(do_memset(devPtr, value, count, stream));
}

EXPORT cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t stream)
{
	WRAP(do_sync((uintptr_t)stream));
}

EXPORT cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t hStream)
{
	WRAP(do_malloc(devPtr, size, hStream));
}

EXPORT cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t hStream)
{
	WRAP(do_free(devPtr, hStream));
}

EXPORT cudaError_t cudaLaunchKernelExC_ptsz(const cudaLaunchConfig_t *config,
					    const void *func, void **args)
{
	WRAP(do_launch_ex(config, func, args));
}

EXPORT cudaError_t cudaLaunchCooperativeKernel_ptsz(const void *func, dim3 gridDim,
						    dim3 blockDim, void **args,
						    size_t sharedMem, cudaStream_t stream)
{
	WRAP(do_launch(L_COOP, func, gridDim, blockDim, args, sharedMem, stream));
}

/* The registration functions return no cudaError_t, but likewise store what
 * the implementation returned, so they start with "push %rbp" too. */
static volatile uintptr_t last_handle;

EXPORT void **__cudaRegisterFatBinary(void *fatCubin)
{
	void **h = do_register_fatbin(fatCubin);
	last_handle = (uintptr_t)h;
	return h;
}

EXPORT void __cudaRegisterFunction(void **fatCubinHandle, const char *hostFun,
				   char *deviceFun, const char *deviceName,
				   int thread_limit, void *tid, void *bid, void *bDim,
				   void *gDim, int *wSize)
{
	sink = (uintptr_t)deviceName ^ (unsigned)thread_limit ^ (uintptr_t)tid ^
	       (uintptr_t)bid ^ (uintptr_t)bDim ^ (uintptr_t)gDim ^ (uintptr_t)wSize;
	last_rc = do_register_function(fatCubinHandle, hostFun, deviceFun);
}

EXPORT void __cudaUnregisterFatBinary(void **fatCubinHandle)
{
	last_rc = do_unregister_fatbin(fatCubinHandle);
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

/* CUDA_ERROR_INVALID_HANDLE for a NULL exec equals
 * cudaErrorInvalidResourceHandle (400). */
INTERNAL cudaError_t do_graph_launch(cudaGraphExec_t exec, cudaStream_t stream)
{
	sink = (uintptr_t)exec ^ (uintptr_t)stream;
	return cuGraphLaunch((CUgraphExec)exec, (CUstream)stream);
}

EXPORT cudaError_t cudaGraphInstantiate(cudaGraphExec_t *pGraphExec,
					cudaGraph_t graph,
					unsigned long long flags)
{
	WRAP(do_graph_instantiate(pGraphExec, graph, flags));
}

#ifndef PROFI_STUB_LOCKED_GRAPH
EXPORT cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream)
{
	WRAP(do_graph_launch(exec, stream));
}
#else
/* cudaGraphLaunch starts with a lock-prefixed instruction, on which the
 * kernel refuses uprobes (EOPNOTSUPP-like ENOTSUPP at attach time), then
 * tail-jumps to the usual body: the same semantics, an unprobeable entry.
 * PROFI_STUB_LOCKED_GRAPH=1: "lock incl" on a global, which changes no
 * register (a probe one instruction later sees the same arguments and
 * stack); =2: "lock xadd %ecx" on a global, which writes an argument
 * register (rcx, unused by cudaGraphLaunch): no probe may move past it. */
__attribute__((used, visibility("hidden"))) volatile unsigned profi_graph_entries;

__attribute__((noinline, used, visibility("hidden"))) cudaError_t
profi_graph_launch_body(cudaGraphExec_t exec, cudaStream_t stream)
{
	WRAP(do_graph_launch(exec, stream));
}

#if PROFI_STUB_LOCKED_GRAPH == 1
#define LOCKED_GRAPH_INSN "lock incl profi_graph_entries(%rip)"
#else
#define LOCKED_GRAPH_INSN "lock xaddl %ecx, profi_graph_entries(%rip)"
#endif

EXPORT __attribute__((naked)) cudaError_t cudaGraphLaunch(__attribute__((unused)) cudaGraphExec_t exec,
							 __attribute__((unused)) cudaStream_t stream)
{
	__asm__(LOCKED_GRAPH_INSN "\n\t"
		"jmp profi_graph_launch_body");
}
#endif

EXPORT cudaError_t cudaGraphLaunch_ptsz(cudaGraphExec_t exec, cudaStream_t stream)
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
