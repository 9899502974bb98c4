/* Stub libcuda.so.1: the real CUDA Driver API symbol names and C ABI with
 * deterministic, GPU-free semantics. The stub libcudart calls into it through
 * these exported symbols (as the real runtime does), so a test can check that
 * a runtime launch is not counted twice.
 *
 * Built only with the fixed flags in internal/testutil/build.go, like
 * cudart.c, and for the same reason: every exported function must start with
 * "push %rbp". */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_drv_stub.h"

#define EXPORT __attribute__((noinline, visibility("default")))

/* Volatile sinks: observable work, and the last launch for a debugger. */
static volatile uintptr_t sink;
static volatile CUresult last_rc;
static volatile uintptr_t last_func, last_params, last_stream;
static volatile unsigned last_grid[3], last_block[3], last_shared;

/* Fake handles: unique, never dereferenced, recognisable in a dump.
 * Functions and kernels are FUNC_BASE/KERN_BASE + 0x100 * (index in tab). */
#define MOD_BASE 0x80000000UL
#define LIB_BASE 0x88000000UL
#define FUNC_BASE 0x90000000UL
#define KERN_BASE 0xa0000000UL
#define HANDLE_STEP 0x100UL
static uintptr_t next_mod, next_lib;

/* (module or library, name) pairs handed out so far, so that asking twice
 * gives the same handle. Few entries per process: a linear scan will do. */
struct entry {
	uintptr_t owner;
	char *name;
	int kernel; /* from cuLibraryGetKernel, not cuModuleGetFunction */
};
static pthread_mutex_t tab_mu = PTHREAD_MUTEX_INITIALIZER;
static struct entry *tab;
static size_t tab_len, tab_cap;

#define INTERNAL static __attribute__((noinline))
/* The call is never in tail position, so every export starts with
 * "push %rbp" (see WRAP in cudart.c). */
#define WRAP(call)                    \
	do {                          \
		CUresult rc_ = (call); \
		last_rc = rc_;        \
		return rc_;           \
	} while (0)

/* Finds or adds (owner, name); returns its index, or -1 when out of memory. */
static long tab_index(uintptr_t owner, const char *name, int kernel)
{
	long idx = -1;
	pthread_mutex_lock(&tab_mu);
	for (size_t i = 0; i < tab_len; i++) {
		if (tab[i].owner == owner && tab[i].kernel == kernel && !strcmp(tab[i].name, name)) {
			idx = (long)i;
			goto out;
		}
	}
	if (tab_len == tab_cap) {
		size_t cap = tab_cap ? tab_cap * 2 : 64;
		struct entry *n = realloc(tab, cap * sizeof(*n));
		if (!n)
			goto out;
		tab = n;
		tab_cap = cap;
	}
	char *copy = strdup(name);
	if (!copy)
		goto out;
	tab[tab_len] = (struct entry){owner, copy, kernel};
	idx = (long)tab_len++;
out:
	pthread_mutex_unlock(&tab_mu);
	return idx;
}

static int tab_is_kernel(size_t idx)
{
	pthread_mutex_lock(&tab_mu);
	int ok = idx < tab_len && tab[idx].kernel;
	pthread_mutex_unlock(&tab_mu);
	return ok;
}

INTERNAL CUresult do_init(unsigned flags)
{
	sink = flags;
	return flags ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS; /* must be 0 */
}

INTERNAL CUresult do_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
			    unsigned bx, unsigned by, unsigned bz, unsigned shared,
			    CUstream stream, void **params, void **extra)
{
	last_func = (uintptr_t)f;
	last_grid[0] = gx;
	last_grid[1] = gy;
	last_grid[2] = gz;
	last_block[0] = bx;
	last_block[1] = by;
	last_block[2] = bz;
	last_shared = shared;
	last_stream = (uintptr_t)stream;
	last_params = (uintptr_t)params ^ (uintptr_t)extra;
	return f ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

INTERNAL CUresult do_launch_ex(const CUlaunchConfig *c, CUfunction f, void **params,
			       void **extra)
{
	if (!c)
		return CUDA_ERROR_INVALID_VALUE;
	sink = (uintptr_t)c->attrs ^ c->numAttrs;
	return do_launch(f, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX,
			 c->blockDimY, c->blockDimZ, c->sharedMemBytes, c->hStream,
			 params, extra);
}

INTERNAL CUresult do_graph_launch(CUgraphExec exec, CUstream stream)
{
	sink = (uintptr_t)exec ^ (uintptr_t)stream;
	return exec ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* Loads nothing: any non-NULL image gives a fresh handle base + n*0x100. */
INTERNAL CUresult do_load(void **out, const void *image, uintptr_t *counter, uintptr_t base)
{
	if (!out || !image)
		return CUDA_ERROR_INVALID_VALUE;
	uintptr_t n = __atomic_add_fetch(counter, 1, __ATOMIC_RELAXED);
	*out = (void *)(base + n * HANDLE_STEP);
	sink = (uintptr_t)image;
	return CUDA_SUCCESS;
}

/* Every name exists in every module: the stub has no real code to look in. */
INTERNAL CUresult do_get(void **out, uintptr_t owner, const char *name, int kernel)
{
	if (!out || !name)
		return CUDA_ERROR_INVALID_VALUE;
	if (!owner)
		return CUDA_ERROR_INVALID_HANDLE;
	long idx = tab_index(owner, name, kernel);
	if (idx < 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*out = (void *)((kernel ? KERN_BASE : FUNC_BASE) + (uintptr_t)idx * HANDLE_STEP);
	return CUDA_SUCCESS;
}

/* A kernel's function shares its table index, so it differs from every
 * function cuModuleGetFunction hands out. */
INTERNAL CUresult do_kernel_function(CUfunction *pFunc, CUkernel kernel)
{
	uintptr_t k = (uintptr_t)kernel;
	if (!pFunc)
		return CUDA_ERROR_INVALID_VALUE;
	if (k < KERN_BASE || (k - KERN_BASE) % HANDLE_STEP || !tab_is_kernel((k - KERN_BASE) / HANDLE_STEP))
		return CUDA_ERROR_INVALID_HANDLE;
	*pFunc = (CUfunction)(FUNC_BASE + (k - KERN_BASE));
	return CUDA_SUCCESS;
}

EXPORT CUresult cuInit(unsigned flags)
{
	WRAP(do_init(flags));
}

EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gridDimX, unsigned gridDimY,
			       unsigned gridDimZ, unsigned blockDimX, unsigned blockDimY,
			       unsigned blockDimZ, unsigned sharedMemBytes, CUstream hStream,
			       void **kernelParams, void **extra)
{
	WRAP(do_launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
		       sharedMemBytes, hStream, kernelParams, extra));
}

EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gridDimX, unsigned gridDimY,
				    unsigned gridDimZ, unsigned blockDimX, unsigned blockDimY,
				    unsigned blockDimZ, unsigned sharedMemBytes,
				    CUstream hStream, void **kernelParams, void **extra)
{
	WRAP(do_launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
		       sharedMemBytes, hStream, kernelParams, extra));
}

EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f,
				 void **kernelParams, void **extra)
{
	WRAP(do_launch_ex(config, f, kernelParams, extra));
}

EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gridDimX, unsigned gridDimY,
					  unsigned gridDimZ, unsigned blockDimX,
					  unsigned blockDimY, unsigned blockDimZ,
					  unsigned sharedMemBytes, CUstream hStream,
					  void **kernelParams)
{
	WRAP(do_launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
		       sharedMemBytes, hStream, kernelParams, NULL));
}

EXPORT CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
	WRAP(do_graph_launch(hGraphExec, hStream));
}

EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f,
				      void **kernelParams, void **extra)
{
	WRAP(do_launch_ex(config, f, kernelParams, extra));
}

EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gridDimX,
					       unsigned gridDimY, unsigned gridDimZ,
					       unsigned blockDimX, unsigned blockDimY,
					       unsigned blockDimZ, unsigned sharedMemBytes,
					       CUstream hStream, void **kernelParams)
{
	WRAP(do_launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
		       sharedMemBytes, hStream, kernelParams, NULL));
}

EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
	WRAP(do_graph_launch(hGraphExec, hStream));
}

EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
	WRAP(do_load((void **)module, image, &next_mod, MOD_BASE));
}

EXPORT CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
	WRAP(do_get((void **)hfunc, (uintptr_t)hmod, name, 0));
}

EXPORT CUresult cuLibraryLoadData(CUlibrary *library, const void *code, void *jitOptions,
				  void **jitOptionsValues, unsigned numJitOptions,
				  void *libraryOptions, void **libraryOptionValues,
				  unsigned numLibraryOptions)
{
	sink = (uintptr_t)jitOptions ^ (uintptr_t)jitOptionsValues ^ numJitOptions ^
	       (uintptr_t)libraryOptions ^ (uintptr_t)libraryOptionValues ^ numLibraryOptions;
	WRAP(do_load((void **)library, code, &next_lib, LIB_BASE));
}

EXPORT CUresult cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name)
{
	WRAP(do_get((void **)pKernel, (uintptr_t)library, name, 1));
}

EXPORT CUresult cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel)
{
	WRAP(do_kernel_function(pFunc, kernel));
}

/* The memory API: device pointers and VMM handles from counters (never
 * reused), copies and sets that succeed unless a pointer is NULL, and a
 * free or release of 0 that fails with CUDA_ERROR_INVALID_VALUE. */
static uintptr_t next_dptr = 0x20000000, next_mem_handle = 0x7000;

INTERNAL CUresult do_mem_alloc(CUdeviceptr *dptr, size_t size, uintptr_t *counter)
{
	if (!dptr || !size)
		return CUDA_ERROR_INVALID_VALUE;
	*dptr = __atomic_fetch_add(counter, (size + 0xff) & ~(size_t)0xff, __ATOMIC_RELAXED);
	return CUDA_SUCCESS;
}

INTERNAL CUresult do_mem_use(CUdeviceptr a, uintptr_t b, size_t n, CUstream s)
{
	sink = (uintptr_t)a ^ b ^ n ^ (uintptr_t)s;
	return a && b ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

INTERNAL CUresult do_mem_free(CUdeviceptr p, CUstream s)
{
	sink = (uintptr_t)s;
	return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
	WRAP(do_mem_alloc(dptr, bytesize, &next_dptr));
}
EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
	WRAP(do_mem_free(dptr, NULL));
}
EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
	sink = (uintptr_t)hStream;
	WRAP(do_mem_alloc(dptr, bytesize, &next_dptr));
}
EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
	WRAP(do_mem_free(dptr, hStream));
}
EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned flags)
{
	sink = flags;
	WRAP(do_mem_alloc(dptr, bytesize, &next_dptr));
}
EXPORT CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
	WRAP(do_mem_use(dst, src, n, NULL));
}
EXPORT CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
	WRAP(do_mem_use(dst, src, n, s));
}
EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
	WRAP(do_mem_use(dst, (uintptr_t)src, n, NULL));
}
EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
	WRAP(do_mem_use((uintptr_t)dst, src, n, NULL));
}
EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
	WRAP(do_mem_use(dst, src, n, NULL));
}
EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s)
{
	WRAP(do_mem_use(dst, (uintptr_t)src, n, s));
}
EXPORT CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s)
{
	WRAP(do_mem_use((uintptr_t)dst, src, n, s));
}
EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
	WRAP(do_mem_use(dst, src, n, s));
}
EXPORT CUresult cuMemcpyPeer(CUdeviceptr dst, CUcontext dstCtx, CUdeviceptr src, CUcontext srcCtx,
			     size_t n)
{
	sink = (uintptr_t)dstCtx ^ (uintptr_t)srcCtx;
	WRAP(do_mem_use(dst, src, n, NULL));
}
EXPORT CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dst, const void *src, size_t n, CUstream s)
{
	WRAP(do_mem_use(dst, (uintptr_t)src, n, s));
}
EXPORT CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
	WRAP(do_mem_use(dst, src, n, s));
}
EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char uc, size_t n)
{
	WRAP(do_mem_use(dst, uc + 1, n, NULL));
}
EXPORT CUresult cuMemsetD16_v2(CUdeviceptr dst, unsigned short us, size_t n)
{
	WRAP(do_mem_use(dst, us + 1, n, NULL));
}
EXPORT CUresult cuMemsetD32_v2(CUdeviceptr dst, unsigned ui, size_t n)
{
	WRAP(do_mem_use(dst, (uintptr_t)ui + 1, n, NULL));
}
EXPORT CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned ui, size_t n, CUstream s)
{
	WRAP(do_mem_use(dst, (uintptr_t)ui + 1, n, s));
}
EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const void *prop,
			    unsigned long long flags)
{
	sink = (uintptr_t)prop ^ flags;
	WRAP(do_mem_alloc(handle, size, &next_mem_handle));
}
EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
	WRAP(do_mem_free(handle, NULL));
}
EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
				    CUdeviceptr addr, unsigned long long flags)
{
	sink = alignment ^ addr ^ flags;
	WRAP(do_mem_alloc(ptr, size, &next_dptr));
}
EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
	sink = size;
	WRAP(do_mem_free(ptr, NULL));
}
EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
			 CUmemGenericAllocationHandle handle, unsigned long long flags)
{
	sink = offset ^ flags;
	WRAP(do_mem_use(ptr, handle, size, NULL));
}
EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
	sink = size;
	WRAP(do_mem_free(ptr, NULL));
}
