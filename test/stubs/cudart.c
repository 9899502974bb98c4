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
 * PROFI_STUB_LAUNCH=second-site makes cudaLaunchKernel(_ptsz) reach the
 * driver from other call sites of the runtime (issue 30 item 6).
 *
 * CUDA 13's launch entry points (what nvcc 13 lowers kernel<<<...>>> to):
 * __cudaGetKernel(&handle, hostStub) hands out an opaque cudaKernel_t (not
 * the stub's address), and __cudaLaunchKernel(handle, grid, block, args,
 * shmem, stream) and __cudaLaunchKernel_ptsz launch it by calling the
 * exported cudaLaunchKernel and cudaLaunchKernel_ptsz (through the PLT), as
 * NVIDIA's CUDA 13 runtime does, hence through cuLaunchKernel(_ptsz).
 *
 * The per-thread default stream variants (_ptds for functions without a
 * stream argument, _ptsz for those with one, what nvcc
 * --default-stream per-thread compiles calls into) are distinct exported
 * functions with the same semantics and return codes as their base
 * functions.
 *
 * Stream capture and graphs (CUDA 12.4+ and 13.0 prototypes): as in the
 * real runtime, each call is its driver counterpart's, called through the
 * driver's exported symbols, where the state lives (test/stubs/cuda.c):
 * cudaStreamBeginCapture -> cuStreamBeginCapture_v2 (_ptsz ->
 * cuStreamBeginCapture_v2_ptsz), cudaStreamBeginCaptureToGraph(_ptsz) ->
 * cuStreamBeginCaptureToGraph(_ptsz), cudaStreamEndCapture(_ptsz) ->
 * cuStreamEndCapture(_ptsz), cudaStreamIsCapturing -> cuStreamIsCapturing,
 * cudaStreamSynchronize(_ptsz) -> cuStreamSynchronize(_ptsz),
 * cudaEventCreate(WithFlags) -> cuEventCreate, cudaEventDestroy ->
 * cuEventDestroy_v2, cudaEventRecord(WithFlags)(_ptsz) ->
 * cuEventRecord(WithFlags)(_ptsz), cudaStreamWaitEvent(_ptsz) ->
 * cuStreamWaitEvent(_ptsz), cudaGraphCreate -> cuGraphCreate,
 * cudaGraphInstantiate and cudaGraphInstantiateWithFlags ->
 * cuGraphInstantiateWithFlags, cudaGraphInstantiateWithParams(_ptsz) ->
 * cuGraphInstantiateWithParams(_ptsz), cudaGraphExecUpdate ->
 * cuGraphExecUpdate_v2, cudaGraphExecDestroy -> cuGraphExecDestroy,
 * cudaGraphDestroy -> cuGraphDestroy, cudaGraphAddKernelNode ->
 * cuGraphAddKernelNode_v2 (with the registered CUfunction),
 * cudaGraphAddMemcpyNode(1D) -> cuGraphAddMemcpyNode, cudaGraphAddMemsetNode
 * -> cuGraphAddMemsetNode, cudaGraphAddChildGraphNode ->
 * cuGraphAddChildGraphNode. Launches on a capturing stream reach the driver
 * as every launch does and are recorded there; asynchronous copies and sets
 * (which never call the driver's exported functions here) and, under
 * PROFI_STUB_LAUNCH=runtime, launches are recorded through the driver's
 * private export table (cuGetExportTable), as the real runtime reaches
 * driver internals: a capturing stream records them and they return
 * cudaSuccess (or cudaErrorStreamCaptureInvalidated), moving nothing.
 * Synchronous copies and sets ignore capture (not modelled). */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* The driver's private table (cuGetExportTable), fetched once; NULL under a
 * driver that lacks it (NVIDIA's): nothing then captures. */
static const struct profi_stub_export_table *drv_table;
static pthread_once_t drv_table_once = PTHREAD_ONCE_INIT;

static void fetch_drv_table(void)
{
	const void *p = NULL;
	CUuuid id;
	memcpy(id.bytes, PROFI_STUB_EXPORT_TABLE_ID, sizeof(id.bytes));
	if (cuGetExportTable(&p, &id) == CUDA_SUCCESS && p &&
	    ((const struct profi_stub_export_table *)p)->size >= sizeof(*drv_table))
		drv_table = p;
}

static const struct profi_stub_export_table *driver_table(void)
{
	pthread_once(&drv_table_once, fetch_drv_table);
	return drv_table;
}

/* How a copy or set treats stream capture: a synchronous one ignores it;
 * an asynchronous one on a capturing stream is recorded (ASYNC_PTSZ: a
 * _ptsz entry point, whose NULL stream is the per-thread stream). */
enum { SYNC, ASYNC, ASYNC_PTSZ };

static int captured_copy(int mode, cudaStream_t s, size_t bytes, int kind, cudaError_t *rc)
{
	const struct profi_stub_export_table *t = mode == SYNC ? NULL : driver_table();
	CUresult r;
	if (!t || !t->capture_copy((CUstream)s, mode == ASYNC_PTSZ, bytes, kind, &r))
		return 0;
	*rc = (cudaError_t)r;
	return 1;
}

static int captured_set(int mode, cudaStream_t s, size_t bytes, cudaError_t *rc)
{
	const struct profi_stub_export_table *t = mode == SYNC ? NULL : driver_table();
	CUresult r;
	if (!t || !t->capture_set((CUstream)s, mode == ASYNC_PTSZ, bytes, &r))
		return 0;
	*rc = (cudaError_t)r;
	return 1;
}

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
/* Set by profi_stub_cuda_block_next_copy: the next synchronous copy blocks
 * until the process is killed. */
static int block_next_copy;

INTERNAL cudaError_t do_memcpy(int mode, void *dst, const void *src, size_t count,
			       enum cudaMemcpyKind kind, cudaStream_t stream)
{
	cudaError_t rc;
	if (mode == SYNC && __atomic_exchange_n(&block_next_copy, 0, __ATOMIC_ACQ_REL))
		for (;;)
			pause(); /* a GPU that never answers: until killed */
	sink = (uintptr_t)dst ^ (uintptr_t)src ^ count ^ (uintptr_t)stream;
	/* Unsigned compare so negative kinds are rejected too. */
	if ((unsigned)kind > cudaMemcpyDefault)
		return cudaErrorInvalidMemcpyDirection;
	if (captured_copy(mode, stream, count, kind, &rc))
		return rc;
	return cudaSuccess;
}

INTERNAL cudaError_t do_memcpy_2d(int mode, void *dst, size_t dpitch, const void *src,
				  size_t spitch, size_t width, size_t height,
				  enum cudaMemcpyKind kind, cudaStream_t stream)
{
	sink = dpitch ^ spitch ^ width ^ height;
	return do_memcpy(mode, dst, src, width * height, kind, stream);
}

/* Any devices, any size: a peer copy always succeeds (captured: a
 * device-to-device copy node). */
INTERNAL cudaError_t do_memcpy_peer(int mode, void *dst, int dstDevice, const void *src,
				    int srcDevice, size_t count, cudaStream_t stream)
{
	cudaError_t rc;
	sink = (uintptr_t)dst ^ (uintptr_t)src ^ count ^ (uintptr_t)stream ^
	       (unsigned)dstDevice ^ ((uintptr_t)(unsigned)srcDevice << 32);
	if (captured_copy(mode, stream, count, cudaMemcpyDeviceToDevice, &rc))
		return rc;
	return cudaSuccess;
}

/* The extent's width is in bytes for linear memory: width x height x
 * depth bytes, with the pitches of srcPtr/dstPtr only spacing the rows. */
INTERNAL cudaError_t do_memcpy_3d(int mode, const struct cudaMemcpy3DParms *p,
				  cudaStream_t stream)
{
	if (!p)
		return cudaErrorInvalidValue;
	sink = p->srcPtr.pitch ^ p->dstPtr.pitch;
	return do_memcpy(mode, p->dstPtr.ptr, p->srcPtr.ptr,
			 p->extent.width * p->extent.height * p->extent.depth, p->kind, stream);
}

INTERNAL cudaError_t do_memcpy_3d_peer(int mode, const struct cudaMemcpy3DPeerParms *p,
				       cudaStream_t stream)
{
	if (!p)
		return cudaErrorInvalidValue;
	return do_memcpy_peer(mode, p->dstPtr.ptr, p->dstDevice, p->srcPtr.ptr, p->srcDevice,
			      p->extent.width * p->extent.height * p->extent.depth, stream);
}

/* A NULL symbol is no registered __device__ variable. */
INTERNAL cudaError_t do_memcpy_symbol(int mode, void *dst, const void *src, const void *symbol,
				      size_t count, size_t offset, enum cudaMemcpyKind kind,
				      cudaStream_t stream)
{
	sink = offset;
	if (!symbol)
		return cudaErrorInvalidSymbol;
	return do_memcpy(mode, dst, src, count, kind, stream);
}

INTERNAL cudaError_t do_memset(int mode, void *devPtr, int value, size_t count, cudaStream_t stream)
{
	cudaError_t rc;
	sink = (uintptr_t)devPtr ^ (unsigned)value ^ count ^ (uintptr_t)stream;
	if (!devPtr)
		return cudaErrorInvalidValue;
	if (captured_set(mode, stream, count, &rc))
		return rc;
	return cudaSuccess;
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

/* A launch under PROFI_STUB_LAUNCH=runtime: recorded when its stream
 * captures, else it "runs" here. */
static cudaError_t launch_here(int ptsz, CUfunction f, dim3 grid, dim3 block, unsigned shm,
			       CUstream s)
{
	const struct profi_stub_export_table *t = driver_table();
	unsigned g[3] = {grid.x, grid.y, grid.z}, b[3] = {block.x, block.y, block.z};
	CUresult rc;
	if (t && t->capture_launch(s, ptsz, f, g, b, shm, &rc))
		return (cudaError_t)rc;
	return cudaSuccess;
}

/* launch_second_site: PROFI_STUB_LAUNCH=second-site, read once (issue 30
 * item 6): the runtime reaches the driver from call sites of its own that
 * profi did not see while it learned (as a runtime with another code path
 * for some launches would). */
static int launch_second_site(void)
{
	static int v = -1;
	if (v < 0) {
		const char *e = getenv("PROFI_STUB_LAUNCH");
		v = e && e[0] == 's';
	}
	return v;
}

/* The second call sites: not tail calls, so the driver's return address
 * lies here, apart from do_launch's. */
__attribute__((noinline)) static cudaError_t launch_elsewhere(int ptsz, CUfunction f, dim3 grid,
							      dim3 block, unsigned shm,
							      CUstream s, void **args)
{
	CUresult rc;
	if (ptsz)
		rc = cuLaunchKernel_ptsz(f, grid.x, grid.y, grid.z, block.x, block.y, block.z,
					 shm, s, args, NULL);
	else
		rc = cuLaunchKernel(f, grid.x, grid.y, grid.z, block.x, block.y, block.z, shm, s,
				    args, NULL);
	__asm__ volatile("" ::: "memory");
	return (cudaError_t)rc;
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
	CUfunction f = lookup_function(func);
	CUstream s = (CUstream)stream;
	unsigned shm = (unsigned)sharedMem;
	if (launch_in_runtime())
		return launch_here(api == L_PTSZ, f, grid, block, shm, s);
	if (launch_second_site() && api != L_COOP)
		return launch_elsewhere(api == L_PTSZ, f, grid, block, shm, s, args);
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
		return launch_here(0, lookup_function(func), config->gridDim, config->blockDim,
				   (unsigned)config->dynamicSmemBytes, (CUstream)config->stream);
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

/* The driver answers: a capturing stream may not be synchronised
 * (cudaErrorStreamCaptureUnsupported, and its capture is invalidated). */
INTERNAL cudaError_t do_stream_sync(cudaStream_t stream, int ptsz)
{
	sink = (uintptr_t)stream;
	return ptsz ? cuStreamSynchronize_ptsz((CUstream)stream) : cuStreamSynchronize((CUstream)stream);
}

INTERNAL cudaError_t do_event_sync(cudaEvent_t event)
{
	sink = (uintptr_t)event;
	return event ? cudaSuccess : cudaErrorInvalidResourceHandle;
}

/* A test control, not a CUDA export: the next synchronous copy
 * (cudaMemcpy, cudaMemcpy2D, ...) on any thread blocks until the process is
 * killed, so that a test sees a CUDA call in flight (the Xid blast radius). */
EXPORT void profi_stub_cuda_block_next_copy(void)
{
	__atomic_store_n(&block_next_copy, 1, __ATOMIC_RELEASE);
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

/* Rows of width bytes padded to a pitch of the next multiple of 512 bytes,
 * written back with the pointer. */
static size_t row_pitch(size_t width)
{
	return (width + 511) & ~(size_t)511;
}

static cudaError_t do_malloc_pitch(void **devPtr, size_t *pitch, size_t width, size_t height)
{
	cudaError_t rc;

	if (!pitch)
		return cudaErrorInvalidValue;
	rc = do_malloc(devPtr, row_pitch(width) * height, NULL);
	if (rc == cudaSuccess)
		*pitch = row_pitch(width);
	return rc;
}

static cudaError_t do_malloc_3d(struct cudaPitchedPtr *p, struct cudaExtent e)
{
	cudaError_t rc;

	if (!p)
		return cudaErrorInvalidValue;
	rc = do_malloc(&p->ptr, row_pitch(e.width) * e.height * e.depth, NULL);
	if (rc == cudaSuccess)
		p->pitch = row_pitch(e.width), p->xsize = e.width, p->ysize = e.height;
	return rc;
}

EXPORT cudaError_t cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height)
{
	WRAP(do_malloc_pitch(devPtr, pitch, width, height));
}

/* The extent by value; the pitched pointer written back. */
EXPORT cudaError_t cudaMalloc3D(struct cudaPitchedPtr *p, struct cudaExtent e)
{
	WRAP(do_malloc_3d(p, e));
}

EXPORT cudaError_t cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t memPool,
					   cudaStream_t stream)
{
	sink = (uintptr_t)memPool;
	WRAP(do_malloc(ptr, size, stream));
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
	WRAP(do_memcpy(SYNC, dst, src, count, kind, NULL));
}

EXPORT cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count,
				   enum cudaMemcpyKind kind, cudaStream_t stream)
{
	WRAP(do_memcpy(ASYNC, dst, src, count, kind, stream));
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

/* Like NVIDIA's CUDA 13 runtime (seen with PyTorch 2.11 on an H200: both
 * probes fired once per launch, in one frame, with the application's return
 * address; CUPTI named the call cudaLaunchKernel), __cudaLaunchKernel turns
 * the handle into the function and tail-jumps to the exported
 * cudaLaunchKernel (through the PLT), so a probe there fires inside it on
 * the same stack; likewise the _ptsz pair. A NULL handle stays NULL. */
#if defined(__x86_64__)
#define TAIL_LAUNCH(name, target)                                                   \
	__asm__(".text\n.globl " #name "\n"                                         \
		".type " #name ",@function\n" #name ":\n"                           \
		"\ttest %rdi, %rdi\n"                                               \
		"\tje 1f\n"                                                         \
		"\tmovabs $0x4b00000000000000, %r11\n" /* KERNEL_HANDLE_XOR */      \
		"\txor %r11, %rdi\n"                                                \
		"1:\tjmp " #target "@PLT\n"                                         \
		".size " #name ", .-" #name "\n")
#elif defined(__aarch64__)
/* The same on arm64: the handle in x0, x9 a scratch register; "hint 34"
 * is `bti c`, the landing pad of the PLT's indirect branch (a no-op
 * without BTI); b to a preemptible symbol goes through the PLT. */
#define TAIL_LAUNCH(name, target)                                                   \
	__asm__(".text\n.p2align 2\n.globl " #name "\n"                             \
		".type " #name ",%function\n" #name ":\n"                           \
		"\thint 34\n"                                                       \
		"\tcbz x0, 1f\n"                                                    \
		"\tmovz x9, #0x4b00, lsl #48\n" /* KERNEL_HANDLE_XOR */             \
		"\teor x0, x0, x9\n"                                                \
		"1:\tb " #target "\n"                                               \
		".size " #name ", .-" #name "\n")
#else
#error "TAIL_LAUNCH: no assembly for this architecture"
#endif
_Static_assert(KERNEL_HANDLE_XOR == 0x4b00000000000000ULL, "TAIL_LAUNCH's constant");
TAIL_LAUNCH(__cudaLaunchKernel, cudaLaunchKernel);
TAIL_LAUNCH(__cudaLaunchKernel_ptsz, cudaLaunchKernel_ptsz);
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
	WRAP(do_memcpy(ASYNC_PTSZ, dst, src, count, kind, stream));
}

EXPORT cudaError_t cudaMemcpyPeer(void *dst, int dstDevice, const void *src,
				  int srcDevice, size_t count)
{
	WRAP(do_memcpy_peer(SYNC, dst, dstDevice, src, srcDevice, count, NULL));
}

EXPORT cudaError_t cudaMemcpyPeerAsync(void *dst, int dstDevice, const void *src,
				       int srcDevice, size_t count, cudaStream_t stream)
{
	WRAP(do_memcpy_peer(ASYNC, dst, dstDevice, src, srcDevice, count, stream));
}

EXPORT cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch,
				size_t width, size_t height, enum cudaMemcpyKind kind)
{
	WRAP(do_memcpy_2d(SYNC, dst, dpitch, src, spitch, width, height, kind, NULL));
}

EXPORT cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src,
				     size_t spitch, size_t width, size_t height,
				     enum cudaMemcpyKind kind, cudaStream_t stream)
{
	WRAP(do_memcpy_2d(ASYNC, dst, dpitch, src, spitch, width, height, kind, stream));
}

EXPORT cudaError_t cudaMemcpy3D(const struct cudaMemcpy3DParms *p)
{
	WRAP(do_memcpy_3d(SYNC, p, NULL));
}

EXPORT cudaError_t cudaMemcpy3DAsync(const struct cudaMemcpy3DParms *p, cudaStream_t stream)
{
	WRAP(do_memcpy_3d(ASYNC, p, stream));
}

EXPORT cudaError_t cudaMemcpy3DPeer(const struct cudaMemcpy3DPeerParms *p)
{
	WRAP(do_memcpy_3d_peer(SYNC, p, NULL));
}

EXPORT cudaError_t cudaMemcpy3DPeerAsync(const struct cudaMemcpy3DPeerParms *p,
					 cudaStream_t stream)
{
	WRAP(do_memcpy_3d_peer(ASYNC, p, stream));
}

EXPORT cudaError_t cudaMemcpyToSymbol(const void *symbol, const void *src, size_t count,
				      size_t offset, enum cudaMemcpyKind kind)
{
	WRAP(do_memcpy_symbol(SYNC, (void *)symbol, src, symbol, count, offset, kind, NULL));
}

EXPORT cudaError_t cudaMemcpyFromSymbol(void *dst, const void *symbol, size_t count,
					size_t offset, enum cudaMemcpyKind kind)
{
	WRAP(do_memcpy_symbol(SYNC, dst, symbol, symbol, count, offset, kind, NULL));
}

EXPORT cudaError_t cudaMemcpyToSymbolAsync(const void *symbol, const void *src, size_t count,
					   size_t offset, enum cudaMemcpyKind kind,
					   cudaStream_t stream)
{
	WRAP(do_memcpy_symbol(ASYNC, (void *)symbol, src, symbol, count, offset, kind, stream));
}

EXPORT cudaError_t cudaMemcpyFromSymbolAsync(void *dst, const void *symbol, size_t count,
					     size_t offset, enum cudaMemcpyKind kind,
					     cudaStream_t stream)
{
	WRAP(do_memcpy_symbol(ASYNC, dst, symbol, symbol, count, offset, kind, stream));
}

/* A row wider than its pitch is cudaErrorInvalidValue. */
static cudaError_t do_memset_2d(int mode, void *devPtr, size_t pitch, int value, size_t width,
				size_t height, cudaStream_t stream)
{
	if (width > pitch && height > 1)
		return cudaErrorInvalidValue;
	return do_memset(mode, devPtr, value, width * height, stream);
}

EXPORT cudaError_t cudaMemset2D(void *devPtr, size_t pitch, int value, size_t width,
				size_t height)
{
	WRAP(do_memset_2d(SYNC, devPtr, pitch, value, width, height, NULL));
}

EXPORT cudaError_t cudaMemset2DAsync(void *devPtr, size_t pitch, int value, size_t width,
				     size_t height, cudaStream_t stream)
{
	WRAP(do_memset_2d(ASYNC, devPtr, pitch, value, width, height, stream));
}

/* extent.width bytes in each of height x depth rows: a row wider than the
 * pitch is cudaErrorInvalidValue. Both structs come by value. */
static cudaError_t do_memset_3d(int mode, struct cudaPitchedPtr p, int value, struct cudaExtent e,
				cudaStream_t stream)
{
	if (e.width > p.pitch && e.height * e.depth > 1)
		return cudaErrorInvalidValue;
	return do_memset(mode, p.ptr, value, e.width * e.height * e.depth, stream);
}

EXPORT cudaError_t cudaMemset3D(struct cudaPitchedPtr p, int value, struct cudaExtent e)
{
	WRAP(do_memset_3d(SYNC, p, value, e, NULL));
}

EXPORT cudaError_t cudaMemset3DAsync(struct cudaPitchedPtr p, int value, struct cudaExtent e,
				     cudaStream_t stream)
{
	WRAP(do_memset_3d(ASYNC, p, value, e, stream));
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
	WRAP(do_memset(SYNC, devPtr, value, count, NULL));
}

EXPORT cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count,
				   cudaStream_t stream)
{
	WRAP(do_memset(ASYNC, devPtr, value, count, stream));
}

EXPORT cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
	WRAP(do_stream_sync(stream, 0));
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
	WRAP(do_memcpy(SYNC, dst, src, count, kind, PER_THREAD_STREAM));
}

EXPORT cudaError_t cudaMemcpy2D_ptds(void *dst, size_t dpitch, const void *src,
				     size_t spitch, size_t width, size_t height,
				     enum cudaMemcpyKind kind)
{
	WRAP(do_memcpy_2d(SYNC, dst, dpitch, src, spitch, width, height, kind, PER_THREAD_STREAM));
}

EXPORT cudaError_t cudaMemcpy2DAsync_ptsz(void *dst, size_t dpitch, const void *src,
					  size_t spitch, size_t width, size_t height,
					  enum cudaMemcpyKind kind, cudaStream_t stream)
{
	WRAP(do_memcpy_2d(ASYNC_PTSZ, dst, dpitch, src, spitch, width, height, kind, stream));
}

EXPORT cudaError_t cudaMemcpy3D_ptds(const struct cudaMemcpy3DParms *p)
{
	WRAP(do_memcpy_3d(SYNC, p, PER_THREAD_STREAM));
}

EXPORT cudaError_t cudaMemcpy3DAsync_ptsz(const struct cudaMemcpy3DParms *p, cudaStream_t stream)
{
	WRAP(do_memcpy_3d(ASYNC_PTSZ, p, stream));
}

EXPORT cudaError_t cudaMemcpy3DPeer_ptds(const struct cudaMemcpy3DPeerParms *p)
{
	WRAP(do_memcpy_3d_peer(SYNC, p, PER_THREAD_STREAM));
}

EXPORT cudaError_t cudaMemcpy3DPeerAsync_ptsz(const struct cudaMemcpy3DPeerParms *p,
					      cudaStream_t stream)
{
	WRAP(do_memcpy_3d_peer(ASYNC_PTSZ, p, stream));
}

EXPORT cudaError_t cudaMemcpyToSymbol_ptds(const void *symbol, const void *src, size_t count,
					   size_t offset, enum cudaMemcpyKind kind)
{
	WRAP(do_memcpy_symbol(SYNC, (void *)symbol, src, symbol, count, offset, kind,
			      PER_THREAD_STREAM));
}

EXPORT cudaError_t cudaMemcpyFromSymbol_ptds(void *dst, const void *symbol, size_t count,
					     size_t offset, enum cudaMemcpyKind kind)
{
	WRAP(do_memcpy_symbol(SYNC, dst, symbol, symbol, count, offset, kind, PER_THREAD_STREAM));
}

EXPORT cudaError_t cudaMemcpyToSymbolAsync_ptsz(const void *symbol, const void *src,
						size_t count, size_t offset,
						enum cudaMemcpyKind kind, cudaStream_t stream)
{
	WRAP(do_memcpy_symbol(ASYNC_PTSZ, (void *)symbol, src, symbol, count, offset, kind,
			      stream));
}

EXPORT cudaError_t cudaMemcpyFromSymbolAsync_ptsz(void *dst, const void *symbol, size_t count,
						  size_t offset, enum cudaMemcpyKind kind,
						  cudaStream_t stream)
{
	WRAP(do_memcpy_symbol(ASYNC_PTSZ, dst, symbol, symbol, count, offset, kind, stream));
}

EXPORT cudaError_t cudaMemset2D_ptds(void *devPtr, size_t pitch, int value, size_t width,
				     size_t height)
{
	WRAP(do_memset_2d(SYNC, devPtr, pitch, value, width, height, PER_THREAD_STREAM));
}

EXPORT cudaError_t cudaMemset2DAsync_ptsz(void *devPtr, size_t pitch, int value, size_t width,
					  size_t height, cudaStream_t stream)
{
	WRAP(do_memset_2d(ASYNC_PTSZ, devPtr, pitch, value, width, height, stream));
}

EXPORT cudaError_t cudaMallocFromPoolAsync_ptsz(void **ptr, size_t size, cudaMemPool_t memPool,
						cudaStream_t stream)
{
	sink = (uintptr_t)memPool;
	WRAP(do_malloc(ptr, size, stream));
}

EXPORT cudaError_t cudaMemset3D_ptds(struct cudaPitchedPtr p, int value, struct cudaExtent e)
{
	WRAP(do_memset_3d(SYNC, p, value, e, PER_THREAD_STREAM));
}

EXPORT cudaError_t cudaMemset3DAsync_ptsz(struct cudaPitchedPtr p, int value, struct cudaExtent e,
					  cudaStream_t stream)
{
	WRAP(do_memset_3d(ASYNC_PTSZ, p, value, e, stream));
}

EXPORT cudaError_t cudaMemset_ptds(void *devPtr, int value, size_t count)
{
	WRAP(do_memset(SYNC, devPtr, value, count, PER_THREAD_STREAM));
}

EXPORT cudaError_t cudaMemsetAsync_ptsz(void *devPtr, int value, size_t count,
					cudaStream_t stream)
{
	WRAP(do_memset(ASYNC_PTSZ, devPtr, value, count, stream));
}

EXPORT cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t stream)
{
	WRAP(do_stream_sync(stream, 1));
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

/* Graphs and stream capture: the driver's answers. Its codes mean the
 * same in both APIs here (CUDA_ERROR_INVALID_HANDLE for a NULL exec equals
 * cudaErrorInvalidResourceHandle, 400; 401 and 900-910 likewise). */
INTERNAL cudaError_t do_graph_instantiate(cudaGraphExec_t *pGraphExec,
					  cudaGraph_t graph,
					  unsigned long long flags)
{
	sink = (uintptr_t)graph ^ flags;
	return cuGraphInstantiateWithFlags((CUgraphExec *)pGraphExec, (CUgraph)graph, flags);
}

INTERNAL cudaError_t do_begin_capture(cudaStream_t stream, int ptsz, enum cudaStreamCaptureMode mode)
{
	sink = (uintptr_t)stream ^ (unsigned)mode;
	return ptsz ? cuStreamBeginCapture_v2_ptsz((CUstream)stream, (CUstreamCaptureMode)mode)
		    : cuStreamBeginCapture_v2((CUstream)stream, (CUstreamCaptureMode)mode);
}

INTERNAL cudaError_t do_begin_capture_to_graph(cudaStream_t stream, int ptsz, cudaGraph_t graph,
					       const cudaGraphNode_t *deps,
					       const cudaGraphEdgeData *edges, size_t ndeps,
					       enum cudaStreamCaptureMode mode)
{
	sink = (uintptr_t)stream ^ (uintptr_t)graph;
	return (ptsz ? cuStreamBeginCaptureToGraph_ptsz : cuStreamBeginCaptureToGraph)(
		(CUstream)stream, (CUgraph)graph, (const CUgraphNode *)deps, edges, ndeps,
		(CUstreamCaptureMode)mode);
}

INTERNAL cudaError_t do_end_capture(cudaStream_t stream, int ptsz, cudaGraph_t *pGraph)
{
	sink = (uintptr_t)stream;
	return ptsz ? cuStreamEndCapture_ptsz((CUstream)stream, (CUgraph *)pGraph)
		    : cuStreamEndCapture((CUstream)stream, (CUgraph *)pGraph);
}

INTERNAL cudaError_t do_is_capturing(cudaStream_t stream, enum cudaStreamCaptureStatus *status)
{
	sink = (uintptr_t)stream;
	return cuStreamIsCapturing((CUstream)stream, (CUstreamCaptureStatus *)status);
}

INTERNAL cudaError_t do_event_create(cudaEvent_t *event, unsigned flags)
{
	sink = flags;
	return cuEventCreate((CUevent *)event, flags);
}

INTERNAL cudaError_t do_event_destroy(cudaEvent_t event)
{
	sink = (uintptr_t)event;
	return cuEventDestroy_v2((CUevent)event);
}

/* flags < 0: cudaEventRecord, no flags argument. */
INTERNAL cudaError_t do_event_record(cudaEvent_t event, cudaStream_t stream, int ptsz, long flags)
{
	CUevent e = (CUevent)event;
	CUstream s = (CUstream)stream;
	sink = (uintptr_t)event ^ (uintptr_t)stream;
	if (flags < 0)
		return ptsz ? cuEventRecord_ptsz(e, s) : cuEventRecord(e, s);
	return ptsz ? cuEventRecordWithFlags_ptsz(e, s, (unsigned)flags)
		    : cuEventRecordWithFlags(e, s, (unsigned)flags);
}

INTERNAL cudaError_t do_stream_wait(cudaStream_t stream, cudaEvent_t event, unsigned flags, int ptsz)
{
	sink = (uintptr_t)event ^ (uintptr_t)stream;
	return ptsz ? cuStreamWaitEvent_ptsz((CUstream)stream, (CUevent)event, flags)
		    : cuStreamWaitEvent((CUstream)stream, (CUevent)event, flags);
}

INTERNAL cudaError_t do_graph_create(cudaGraph_t *pGraph, unsigned flags)
{
	sink = flags;
	return cuGraphCreate((CUgraph *)pGraph, flags);
}

/* cudaGraphInstantiateParams and CUDA_GRAPH_INSTANTIATE_PARAMS share
 * their layout, as cudaGraphExecUpdateResultInfo and
 * CUgraphExecUpdateResultInfo do. */
INTERNAL cudaError_t do_instantiate_params(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
					   cudaGraphInstantiateParams *p, int ptsz)
{
	sink = (uintptr_t)graph;
	CUDA_GRAPH_INSTANTIATE_PARAMS *cp = (CUDA_GRAPH_INSTANTIATE_PARAMS *)p;
	return ptsz ? cuGraphInstantiateWithParams_ptsz((CUgraphExec *)pGraphExec, (CUgraph)graph, cp)
		    : cuGraphInstantiateWithParams((CUgraphExec *)pGraphExec, (CUgraph)graph, cp);
}

INTERNAL cudaError_t do_exec_update(cudaGraphExec_t exec, cudaGraph_t graph,
				    cudaGraphExecUpdateResultInfo *info)
{
	sink = (uintptr_t)exec ^ (uintptr_t)graph;
	return cuGraphExecUpdate_v2((CUgraphExec)exec, (CUgraph)graph,
				    (CUgraphExecUpdateResultInfo *)info);
}

INTERNAL cudaError_t do_exec_destroy(cudaGraphExec_t exec)
{
	sink = (uintptr_t)exec;
	return cuGraphExecDestroy((CUgraphExec)exec);
}

INTERNAL cudaError_t do_graph_destroy(cudaGraph_t graph)
{
	sink = (uintptr_t)graph;
	return cuGraphDestroy((CUgraph)graph);
}

/* The driver gets the kernel's registered CUfunction, as from a launch. */
INTERNAL cudaError_t do_add_kernel_node(cudaGraphNode_t *pNode, cudaGraph_t graph,
					const cudaGraphNode_t *deps, size_t ndeps,
					const struct cudaKernelNodeParams *p)
{
	if (!p)
		return cudaErrorInvalidValue;
	if (!p->func)
		return cudaErrorInvalidDeviceFunction;
	CUDA_KERNEL_NODE_PARAMS cp = {
		.func = lookup_function(p->func),
		.gridDimX = p->gridDim.x, .gridDimY = p->gridDim.y, .gridDimZ = p->gridDim.z,
		.blockDimX = p->blockDim.x, .blockDimY = p->blockDim.y, .blockDimZ = p->blockDim.z,
		.sharedMemBytes = p->sharedMemBytes, .kernelParams = p->kernelParams, .extra = p->extra,
	};
	return cuGraphAddKernelNode_v2((CUgraphNode *)pNode, (CUgraph)graph,
				       (const CUgraphNode *)deps, ndeps, &cp);
}

/* The memory types of a cudaMemcpyKind's source and destination. */
static void copy_types(enum cudaMemcpyKind kind, CUmemorytype *src, CUmemorytype *dst)
{
	switch (kind) {
	case cudaMemcpyHostToHost:
		*src = *dst = CU_MEMORYTYPE_HOST;
		break;
	case cudaMemcpyHostToDevice:
		*src = CU_MEMORYTYPE_HOST;
		*dst = CU_MEMORYTYPE_DEVICE;
		break;
	case cudaMemcpyDeviceToHost:
		*src = CU_MEMORYTYPE_DEVICE;
		*dst = CU_MEMORYTYPE_HOST;
		break;
	case cudaMemcpyDeviceToDevice:
		*src = *dst = CU_MEMORYTYPE_DEVICE;
		break;
	default:
		*src = *dst = CU_MEMORYTYPE_UNIFIED;
	}
}

/* Linear memory only (no arrays): width is in bytes. */
INTERNAL cudaError_t do_add_memcpy_node(cudaGraphNode_t *pNode, cudaGraph_t graph,
					const cudaGraphNode_t *deps, size_t ndeps, void *dst,
					const void *src, size_t width, size_t height, size_t depth,
					enum cudaMemcpyKind kind)
{
	CUDA_MEMCPY3D c = {.srcHost = src, .srcDevice = (CUdeviceptr)(uintptr_t)src,
			   .dstHost = dst, .dstDevice = (CUdeviceptr)(uintptr_t)dst,
			   .WidthInBytes = width, .Height = height, .Depth = depth};
	if ((unsigned)kind > cudaMemcpyDefault)
		return cudaErrorInvalidMemcpyDirection;
	copy_types(kind, &c.srcMemoryType, &c.dstMemoryType);
	return cuGraphAddMemcpyNode((CUgraphNode *)pNode, (CUgraph)graph, (const CUgraphNode *)deps,
				    ndeps, &c, NULL);
}

INTERNAL cudaError_t do_add_memcpy3d_node(cudaGraphNode_t *pNode, cudaGraph_t graph,
					  const cudaGraphNode_t *deps, size_t ndeps,
					  const struct cudaMemcpy3DParms *p)
{
	if (!p || p->srcArray || p->dstArray)
		return cudaErrorInvalidValue;
	return do_add_memcpy_node(pNode, graph, deps, ndeps, p->dstPtr.ptr, p->srcPtr.ptr,
				  p->extent.width, p->extent.height, p->extent.depth, p->kind);
}

INTERNAL cudaError_t do_add_memset_node(cudaGraphNode_t *pNode, cudaGraph_t graph,
					const cudaGraphNode_t *deps, size_t ndeps,
					const struct cudaMemsetParams *p)
{
	if (!p)
		return cudaErrorInvalidValue;
	CUDA_MEMSET_NODE_PARAMS cp = {.dst = (CUdeviceptr)(uintptr_t)p->dst, .pitch = p->pitch,
				      .value = p->value, .elementSize = p->elementSize,
				      .width = p->width, .height = p->height};
	return cuGraphAddMemsetNode((CUgraphNode *)pNode, (CUgraph)graph, (const CUgraphNode *)deps,
				    ndeps, &cp, NULL);
}

INTERNAL cudaError_t do_add_child_node(cudaGraphNode_t *pNode, cudaGraph_t graph,
				       const cudaGraphNode_t *deps, size_t ndeps, cudaGraph_t child)
{
	sink = (uintptr_t)child;
	return cuGraphAddChildGraphNode((CUgraphNode *)pNode, (CUgraph)graph,
					(const CUgraphNode *)deps, ndeps, (CUgraph)child);
}

#ifndef PROFI_STUB_OMIT_GRAPH
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

#if defined(__x86_64__)
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
#elif defined(__aarch64__)
/* arm64 refuses a uprobe on an exclusive load (=2) and on a literal load
 * (=1), and profi never moves an arm64 probe: both entries are refused.
 * Neither changes an argument register (x9 is a scratch register). The
 * entry is no BTI landing pad: these variants are built without branch
 * protection (internal/testutil), as the PLT reaches it indirectly. */
#if PROFI_STUB_LOCKED_GRAPH == 1
#define LOCKED_GRAPH_INSN "ldr w9, 2f"
#else
#define LOCKED_GRAPH_INSN "ldxr w9, [sp]\n\tclrex"
#endif
__asm__(".text\n.p2align 2\n.globl cudaGraphLaunch\n"
	".type cudaGraphLaunch,%function\ncudaGraphLaunch:\n\t" LOCKED_GRAPH_INSN "\n"
	"\tb profi_graph_launch_body\n"
	"2:\t.word 0\n"
	".size cudaGraphLaunch, .-cudaGraphLaunch\n");
#else
#error "cudaGraphLaunch: no locked entry for this architecture"
#endif
#endif

EXPORT cudaError_t cudaGraphLaunch_ptsz(cudaGraphExec_t exec, cudaStream_t stream)
{
	WRAP(do_graph_launch(exec, stream));
}
#endif

EXPORT cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode)
{
	WRAP(do_begin_capture(stream, 0, mode));
}

EXPORT cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t stream, enum cudaStreamCaptureMode mode)
{
	WRAP(do_begin_capture(stream, 1, mode));
}

EXPORT cudaError_t cudaStreamBeginCaptureToGraph(cudaStream_t stream, cudaGraph_t graph,
						 const cudaGraphNode_t *dependencies,
						 const cudaGraphEdgeData *dependencyData,
						 size_t numDependencies,
						 enum cudaStreamCaptureMode mode)
{
	WRAP(do_begin_capture_to_graph(stream, 0, graph, dependencies, dependencyData,
				       numDependencies, mode));
}

EXPORT cudaError_t cudaStreamBeginCaptureToGraph_ptsz(cudaStream_t stream, cudaGraph_t graph,
						      const cudaGraphNode_t *dependencies,
						      const cudaGraphEdgeData *dependencyData,
						      size_t numDependencies,
						      enum cudaStreamCaptureMode mode)
{
	WRAP(do_begin_capture_to_graph(stream, 1, graph, dependencies, dependencyData,
				       numDependencies, mode));
}

EXPORT cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph)
{
	WRAP(do_end_capture(stream, 0, pGraph));
}

EXPORT cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t stream, cudaGraph_t *pGraph)
{
	WRAP(do_end_capture(stream, 1, pGraph));
}

EXPORT cudaError_t cudaStreamIsCapturing(cudaStream_t stream,
					 enum cudaStreamCaptureStatus *pCaptureStatus)
{
	WRAP(do_is_capturing(stream, pCaptureStatus));
}

EXPORT cudaError_t cudaEventCreate(cudaEvent_t *event)
{
	WRAP(do_event_create(event, cudaEventDefault));
}

EXPORT cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned flags)
{
	WRAP(do_event_create(event, flags));
}

EXPORT cudaError_t cudaEventDestroy(cudaEvent_t event)
{
	WRAP(do_event_destroy(event));
}

EXPORT cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
	WRAP(do_event_record(event, stream, 0, -1));
}

EXPORT cudaError_t cudaEventRecord_ptsz(cudaEvent_t event, cudaStream_t stream)
{
	WRAP(do_event_record(event, stream, 1, -1));
}

EXPORT cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream, unsigned flags)
{
	WRAP(do_event_record(event, stream, 0, flags));
}

EXPORT cudaError_t cudaEventRecordWithFlags_ptsz(cudaEvent_t event, cudaStream_t stream,
						 unsigned flags)
{
	WRAP(do_event_record(event, stream, 1, flags));
}

EXPORT cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags)
{
	WRAP(do_stream_wait(stream, event, flags, 0));
}

EXPORT cudaError_t cudaStreamWaitEvent_ptsz(cudaStream_t stream, cudaEvent_t event, unsigned flags)
{
	WRAP(do_stream_wait(stream, event, flags, 1));
}

EXPORT cudaError_t cudaGraphCreate(cudaGraph_t *pGraph, unsigned flags)
{
	WRAP(do_graph_create(pGraph, flags));
}

EXPORT cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
						 unsigned long long flags)
{
	WRAP(do_graph_instantiate(pGraphExec, graph, flags));
}

EXPORT cudaError_t cudaGraphInstantiateWithParams(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
						  cudaGraphInstantiateParams *instantiateParams)
{
	WRAP(do_instantiate_params(pGraphExec, graph, instantiateParams, 0));
}

EXPORT cudaError_t cudaGraphInstantiateWithParams_ptsz(cudaGraphExec_t *pGraphExec,
						       cudaGraph_t graph,
						       cudaGraphInstantiateParams *instantiateParams)
{
	WRAP(do_instantiate_params(pGraphExec, graph, instantiateParams, 1));
}

EXPORT cudaError_t cudaGraphExecUpdate(cudaGraphExec_t hGraphExec, cudaGraph_t hGraph,
				       cudaGraphExecUpdateResultInfo *resultInfo)
{
	WRAP(do_exec_update(hGraphExec, hGraph, resultInfo));
}

EXPORT cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec)
{
	WRAP(do_exec_destroy(graphExec));
}

EXPORT cudaError_t cudaGraphDestroy(cudaGraph_t graph)
{
	WRAP(do_graph_destroy(graph));
}

EXPORT cudaError_t cudaGraphAddKernelNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
					  const cudaGraphNode_t *pDependencies,
					  size_t numDependencies,
					  const struct cudaKernelNodeParams *pNodeParams)
{
	WRAP(do_add_kernel_node(pGraphNode, graph, pDependencies, numDependencies, pNodeParams));
}

EXPORT cudaError_t cudaGraphAddMemcpyNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
					  const cudaGraphNode_t *pDependencies,
					  size_t numDependencies,
					  const struct cudaMemcpy3DParms *pCopyParams)
{
	WRAP(do_add_memcpy3d_node(pGraphNode, graph, pDependencies, numDependencies, pCopyParams));
}

EXPORT cudaError_t cudaGraphAddMemcpyNode1D(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
					    const cudaGraphNode_t *pDependencies,
					    size_t numDependencies, void *dst, const void *src,
					    size_t count, enum cudaMemcpyKind kind)
{
	WRAP(do_add_memcpy_node(pGraphNode, graph, pDependencies, numDependencies, dst, src, count,
				1, 1, kind));
}

EXPORT cudaError_t cudaGraphAddMemsetNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
					  const cudaGraphNode_t *pDependencies,
					  size_t numDependencies,
					  const struct cudaMemsetParams *pMemsetParams)
{
	WRAP(do_add_memset_node(pGraphNode, graph, pDependencies, numDependencies, pMemsetParams));
}

EXPORT cudaError_t cudaGraphAddChildGraphNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
					      const cudaGraphNode_t *pDependencies,
					      size_t numDependencies, cudaGraph_t childGraph)
{
	WRAP(do_add_child_node(pGraphNode, graph, pDependencies, numDependencies, childGraph));
}

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
