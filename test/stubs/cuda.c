/* Stub libcuda.so.1: the real CUDA Driver API symbol names and C ABI with
 * deterministic, GPU-free semantics, modelled on an r550 driver (CUDA 12.4).
 * The stub libcudart calls into it through these exported symbols (as the
 * real runtime does), so a test can check that a runtime launch is not
 * counted twice.
 *
 * Stream capture and graphs live here, as in the real stack: which streams
 * capture which capture sequence (the origin stream, streams that joined it
 * through an event recorded on a capturing stream), the graphs and their
 * nodes, and executable graphs, each a private copy of its graph's nodes
 * taken at instantiation. A launch, copy or set on a capturing stream runs
 * nothing: it is recorded as a node and succeeds, or fails with
 * CUDA_ERROR_STREAM_CAPTURE_INVALIDATED once the capture is invalidated (a
 * stream synchronisation during capture does that, with
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED). Ending a capture ends it on every
 * stream that joined it, also when it ends in an error (invalidated: 901,
 * a joined stream not joined back: 904); the graph is then discarded and
 * *phGraph set to NULL. A graph launch runs its executable graph's nodes
 * (counted in the stats of the private export table, cuGetExportTable).
 * Handles the stub never handed out are accepted where the older workloads
 * pass fake ones: a graph handle instantiates as an opaque graph, whose
 * launches run nothing the stub knows of; an unknown event is created on
 * first use.
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

/* Records a kernel launch on s as a node when s captures (below). */
static int capture_kernel(CUstream s, int ptsz, CUfunction f, const unsigned grid[3],
			  const unsigned block[3], unsigned shared, CUresult *rc);
static unsigned long long driver_launches; /* launches that ran */

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

/* A launch on a capturing stream is recorded, not run (ptsz: a _ptsz
 * entry point, whose NULL stream is the per-thread default stream). */
INTERNAL CUresult do_launch(int ptsz, CUfunction f, unsigned gx, unsigned gy, unsigned gz,
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
	if (!f)
		return CUDA_ERROR_NOT_FOUND;
	unsigned grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
	CUresult rc;
	if (capture_kernel(stream, ptsz, f, grid, block, shared, &rc))
		return rc;
	__atomic_add_fetch(&driver_launches, 1, __ATOMIC_RELAXED);
	return CUDA_SUCCESS;
}

INTERNAL CUresult do_launch_ex(int ptsz, const CUlaunchConfig *c, CUfunction f, void **params,
			       void **extra)
{
	if (!c)
		return CUDA_ERROR_INVALID_VALUE;
	sink = (uintptr_t)c->attrs ^ c->numAttrs;
	return do_launch(ptsz, f, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX,
			 c->blockDimY, c->blockDimZ, c->sharedMemBytes, c->hStream,
			 params, extra);
}

/* Runs an executable graph, or records it into a capture (below). */
static CUresult do_graph_launch(CUgraphExec exec, CUstream stream, int ptsz);

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
	WRAP(do_launch(0, f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
		       sharedMemBytes, hStream, kernelParams, extra));
}

EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gridDimX, unsigned gridDimY,
				    unsigned gridDimZ, unsigned blockDimX, unsigned blockDimY,
				    unsigned blockDimZ, unsigned sharedMemBytes,
				    CUstream hStream, void **kernelParams, void **extra)
{
	WRAP(do_launch(1, f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
		       sharedMemBytes, hStream, kernelParams, extra));
}

EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f,
				 void **kernelParams, void **extra)
{
	WRAP(do_launch_ex(0, config, f, kernelParams, extra));
}

EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gridDimX, unsigned gridDimY,
					  unsigned gridDimZ, unsigned blockDimX,
					  unsigned blockDimY, unsigned blockDimZ,
					  unsigned sharedMemBytes, CUstream hStream,
					  void **kernelParams)
{
	WRAP(do_launch(0, f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
		       sharedMemBytes, hStream, kernelParams, NULL));
}

EXPORT CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
	WRAP(do_graph_launch(hGraphExec, hStream, 0));
}

EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f,
				      void **kernelParams, void **extra)
{
	WRAP(do_launch_ex(1, config, f, kernelParams, extra));
}

EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gridDimX,
					       unsigned gridDimY, unsigned gridDimZ,
					       unsigned blockDimX, unsigned blockDimY,
					       unsigned blockDimZ, unsigned sharedMemBytes,
					       CUstream hStream, void **kernelParams)
{
	WRAP(do_launch(1, f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
		       sharedMemBytes, hStream, kernelParams, NULL));
}

EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
	WRAP(do_graph_launch(hGraphExec, hStream, 1));
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

/* An asynchronous copy (kind: a cudaMemcpyKind) or set of n bytes: a node
 * when s captures. */
static int capture_copy(CUstream s, int ptsz, size_t bytes, int kind, CUresult *rc);
static int capture_set(CUstream s, int ptsz, size_t bytes, CUresult *rc);

INTERNAL CUresult do_mem_async(CUdeviceptr a, uintptr_t b, size_t n, CUstream s, int ptsz, int kind)
{
	CUresult rc;
	sink = (uintptr_t)a ^ b ^ n ^ (uintptr_t)s;
	if (!a || !b)
		return CUDA_ERROR_INVALID_VALUE;
	if (capture_copy(s, ptsz, n, kind, &rc))
		return rc;
	return CUDA_SUCCESS;
}

INTERNAL CUresult do_set_async(CUdeviceptr a, unsigned v, size_t bytes, CUstream s)
{
	CUresult rc;
	sink = (uintptr_t)a ^ v ^ bytes ^ (uintptr_t)s;
	if (!a)
		return CUDA_ERROR_INVALID_VALUE;
	if (capture_set(s, 0, bytes, &rc))
		return rc;
	return CUDA_SUCCESS;
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
/* Rows of WidthInBytes padded to a pitch of the next multiple of 512 bytes,
 * written back through pPitch; ElementSizeBytes must be 4, 8 or 16
 * (CUDA_ERROR_INVALID_VALUE otherwise, nothing allocated). */
static CUresult do_mem_alloc_pitch(CUdeviceptr *dptr, size_t *pPitch, size_t w, size_t h,
				   unsigned elem)
{
	size_t pitch = (w + 511) & ~(size_t)511;
	CUresult rc;

	if (!pPitch || (elem != 4 && elem != 8 && elem != 16))
		return CUDA_ERROR_INVALID_VALUE;
	rc = do_mem_alloc(dptr, pitch * h, &next_dptr);
	if (rc == CUDA_SUCCESS)
		*pPitch = pitch;
	return rc;
}
EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
				   size_t Height, unsigned ElementSizeBytes)
{
	WRAP(do_mem_alloc_pitch(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes));
}
EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
					CUstream hStream)
{
	sink = (uintptr_t)pool ^ (uintptr_t)hStream;
	WRAP(do_mem_alloc(dptr, bytesize, &next_dptr));
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
	WRAP(do_mem_async(dst, src, n, s, 0, 4));
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
	WRAP(do_mem_async(dst, (uintptr_t)src, n, s, 0, 1));
}
EXPORT CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s)
{
	WRAP(do_mem_async((uintptr_t)dst, src, n, s, 0, 2));
}
EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
	WRAP(do_mem_async(dst, src, n, s, 0, 3));
}
EXPORT CUresult cuMemcpyPeer(CUdeviceptr dst, CUcontext dstCtx, CUdeviceptr src, CUcontext srcCtx,
			     size_t n)
{
	sink = (uintptr_t)dstCtx ^ (uintptr_t)srcCtx;
	WRAP(do_mem_use(dst, src, n, NULL));
}
EXPORT CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dst, const void *src, size_t n, CUstream s)
{
	WRAP(do_mem_async(dst, (uintptr_t)src, n, s, 1, 1));
}
EXPORT CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
	WRAP(do_mem_async(dst, src, n, s, 1, 4));
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
	WRAP(do_set_async(dst, ui, 4 * n, s));
}
/* Width elements of unit bytes in each of Height rows pitch bytes apart: a
 * row wider than its pitch is CUDA_ERROR_INVALID_VALUE. */
static CUresult do_set_2d(CUdeviceptr dst, size_t pitch, unsigned v, size_t width, size_t height,
			  size_t unit, int async, CUstream s)
{
	if (width * unit > pitch && height > 1)
		return CUDA_ERROR_INVALID_VALUE;
	if (async)
		return do_set_async(dst, v, width * unit * height, s);
	return do_mem_use(dst, (uintptr_t)v + 1, width * unit * height, NULL);
}
EXPORT CUresult cuMemsetD2D8_v2(CUdeviceptr dst, size_t pitch, unsigned char uc, size_t w, size_t h)
{
	WRAP(do_set_2d(dst, pitch, uc, w, h, 1, 0, NULL));
}
EXPORT CUresult cuMemsetD2D16_v2(CUdeviceptr dst, size_t pitch, unsigned short us, size_t w,
				 size_t h)
{
	WRAP(do_set_2d(dst, pitch, us, w, h, 2, 0, NULL));
}
EXPORT CUresult cuMemsetD2D32_v2(CUdeviceptr dst, size_t pitch, unsigned ui, size_t w, size_t h)
{
	WRAP(do_set_2d(dst, pitch, ui, w, h, 4, 0, NULL));
}
EXPORT CUresult cuMemsetD2D32Async(CUdeviceptr dst, size_t pitch, unsigned ui, size_t w, size_t h,
				   CUstream s)
{
	WRAP(do_set_2d(dst, pitch, ui, w, h, 4, 1, s));
}
/* The cudaMemcpyKind between two CUmemorytypes (an array is device memory,
 * unified the default kind). */
static int cu_kind(CUmemorytype src, CUmemorytype dst)
{
	if (src == CU_MEMORYTYPE_UNIFIED || dst == CU_MEMORYTYPE_UNIFIED)
		return 4;
	if (src == CU_MEMORYTYPE_HOST)
		return dst == CU_MEMORYTYPE_HOST ? 0 : 1;
	return dst == CU_MEMORYTYPE_HOST ? 2 : 3;
}
static uintptr_t cu_end(CUmemorytype t, const void *host, CUdeviceptr dev, CUarray array)
{
	return t == CU_MEMORYTYPE_HOST ? (uintptr_t)host
	       : t == CU_MEMORYTYPE_ARRAY ? (uintptr_t)array
					  : dev;
}
/* A 2D or 3D copy of width bytes in height (x depth) rows: an end without
 * memory or a row wider than its pitch is CUDA_ERROR_INVALID_VALUE. */
static CUresult do_copy_nd(CUmemorytype st, uintptr_t src, size_t spitch, CUmemorytype dt,
			   uintptr_t dst, size_t dpitch, size_t width, size_t rows, int async,
			   int ptsz, CUstream s)
{
	size_t n = width * rows;

	if (rows > 1 && ((st != CU_MEMORYTYPE_ARRAY && width > spitch) ||
			 (dt != CU_MEMORYTYPE_ARRAY && width > dpitch)))
		return CUDA_ERROR_INVALID_VALUE;
	if (async)
		return do_mem_async(dst, src, n, s, ptsz, cu_kind(st, dt));
	return do_mem_use(dst, src, n, NULL);
}
static CUresult do_copy_2d(const CUDA_MEMCPY2D *p, int async, CUstream s)
{
	if (!p)
		return CUDA_ERROR_INVALID_VALUE;
	return do_copy_nd(p->srcMemoryType, cu_end(p->srcMemoryType, p->srcHost, p->srcDevice, p->srcArray),
			  p->srcPitch, p->dstMemoryType,
			  cu_end(p->dstMemoryType, p->dstHost, p->dstDevice, p->dstArray), p->dstPitch,
			  p->WidthInBytes, p->Height, async, 0, s);
}
static CUresult do_copy_3d(const CUDA_MEMCPY3D *p, int async, CUstream s)
{
	if (!p)
		return CUDA_ERROR_INVALID_VALUE;
	return do_copy_nd(p->srcMemoryType, cu_end(p->srcMemoryType, p->srcHost, p->srcDevice, p->srcArray),
			  p->srcPitch, p->dstMemoryType,
			  cu_end(p->dstMemoryType, p->dstHost, p->dstDevice, p->dstArray), p->dstPitch,
			  p->WidthInBytes, p->Height * p->Depth, async, 0, s);
}
EXPORT CUresult cuMemcpy2D_v2(const CUDA_MEMCPY2D *p)
{
	WRAP(do_copy_2d(p, 0, NULL));
}
EXPORT CUresult cuMemcpy2DUnaligned_v2(const CUDA_MEMCPY2D *p)
{
	WRAP(do_copy_2d(p, 0, NULL));
}
EXPORT CUresult cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D *p, CUstream s)
{
	WRAP(do_copy_2d(p, 1, s));
}
EXPORT CUresult cuMemcpy3D_v2(const CUDA_MEMCPY3D *p)
{
	WRAP(do_copy_3d(p, 0, NULL));
}
EXPORT CUresult cuMemcpy3DAsync_v2(const CUDA_MEMCPY3D *p, CUstream s)
{
	WRAP(do_copy_3d(p, 1, s));
}
/* A 3D copy between contexts, checked as cuMemcpy3D. */
static CUresult do_copy_3d_peer(const CUDA_MEMCPY3D_PEER *p, int async, CUstream s)
{
	if (!p)
		return CUDA_ERROR_INVALID_VALUE;
	sink = (uintptr_t)p->srcContext ^ (uintptr_t)p->dstContext;
	return do_copy_nd(p->srcMemoryType, cu_end(p->srcMemoryType, p->srcHost, p->srcDevice, p->srcArray),
			  p->srcPitch, p->dstMemoryType,
			  cu_end(p->dstMemoryType, p->dstHost, p->dstDevice, p->dstArray), p->dstPitch,
			  p->WidthInBytes, p->Height * p->Depth, async, 0, s);
}
EXPORT CUresult cuMemcpy3DPeer(const CUDA_MEMCPY3D_PEER *p)
{
	WRAP(do_copy_3d_peer(p, 0, NULL));
}
EXPORT CUresult cuMemcpy3DPeerAsync(const CUDA_MEMCPY3D_PEER *p, CUstream s)
{
	WRAP(do_copy_3d_peer(p, 1, s));
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

/* ---- Stream capture, events and graphs ----------------------------------
 *
 * One lock (graph_mu) guards every table below; the tables are small
 * (a workload has a few streams, events and graphs), so lookups scan.
 * active_captures lets a launch on a process that captures nothing skip
 * the lock. Handles: graphs GRAPH_BASE, nodes NODE_BASE, events EVENT_BASE
 * + n*0x10; executable graphs 0x6000 + n*0x10 (the stub runtime's scheme
 * before the driver owned them); none is ever reused. */
#define GRAPH_BASE 0x47000000UL
#define NODE_BASE 0x4e000000UL
#define EVENT_BASE 0x4f000000UL
#define EXEC_BASE 0x6000UL
#define SMALL_STEP 0x10UL
/* CU_STREAM_LEGACY and CU_STREAM_PER_THREAD; 0 is the legacy stream,
 * except for a _ptsz entry point, where it is the per-thread stream. */
#define STREAM_LEGACY ((uintptr_t)0x1)
#define STREAM_PER_THREAD ((uintptr_t)0x2)

struct graph;
struct node {
	uintptr_t handle; /* 0 in an executable graph's copy */
	CUgraphNodeType type;
	uintptr_t func;	  /* kernel: CUfunction */
	unsigned grid[3], block[3], shared;
	size_t bytes;	  /* memcpy, memset */
	int kind;	  /* memcpy: cudaMemcpyKind; memset: element size */
	struct graph *child; /* child graph: its own copy */
};
struct graph {
	uintptr_t handle; /* 0 for copies */
	int dead;	  /* destroyed: kept so its handle stays invalid */
	struct node *nodes;
	size_t n, cap;
};
struct capture {
	unsigned long long id;
	uintptr_t origin;
	struct graph *g;
	int to_graph;	 /* cuStreamBeginCaptureToGraph: g is the caller's */
	int invalidated; /* an error ended it: launches fail with 901 */
};
/* A stream that captured once. work counts what it recorded in its
 * current capture (a joined stream starts at 1: its fork); joined is the
 * work the origin's side has waited for through an event: work > joined on
 * a stream other than the origin means it was not joined back. */
struct cstream {
	uintptr_t handle;
	struct capture *cap; /* NULL: not capturing */
	unsigned long long work, joined;
};
struct event {
	uintptr_t handle;
	int dead, recorded;
	unsigned long long cap_id; /* recorded in this capture; 0: outside one */
	uintptr_t stream;
	unsigned long long seq; /* the stream's work when recorded */
};
struct exec {
	uintptr_t handle;
	int dead;
	struct graph *g; /* its copy of the graph; NULL: an opaque graph */
};

static pthread_mutex_t graph_mu = PTHREAD_MUTEX_INITIALIZER;
static int active_captures;
static unsigned long long next_capture_id;
static uintptr_t next_graph, next_node, next_event, next_exec;
static struct graph **graphs;
static size_t ngraphs, graphs_cap;
static struct capture **captures;
static size_t ncaptures, captures_cap;
static struct cstream *cstreams;
static size_t ncstreams, cstreams_cap;
static struct event *events;
static size_t nevents, events_cap;
static struct exec *execs;
static size_t nexecs, execs_cap;
static struct profi_stub_stats stats; /* but driver_launches: counted apart, lock-free */

/* Makes room for one more element of size sz in *p (len used, *cap). */
static int grow(void **p, size_t len, size_t *cap, size_t sz)
{
	if (len < *cap)
		return 1;
	size_t ncap = *cap ? *cap * 2 : 16;
	void *n = realloc(*p, ncap * sz);
	if (!n)
		return 0;
	*p = n;
	*cap = ncap;
	return 1;
}

static void graph_free(struct graph *g)
{
	if (!g)
		return;
	for (size_t i = 0; i < g->n; i++)
		graph_free(g->nodes[i].child);
	free(g->nodes);
	free(g);
}

/* A deep copy without handles (an executable graph's, a child node's). */
static struct graph *graph_copy(const struct graph *g)
{
	struct graph *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	if (g->n) {
		c->nodes = calloc(g->n, sizeof(*c->nodes));
		if (!c->nodes) {
			free(c);
			return NULL;
		}
		c->cap = g->n;
	}
	for (size_t i = 0; i < g->n; i++) {
		c->nodes[i] = g->nodes[i];
		c->nodes[i].handle = 0;
		c->nodes[i].child = NULL;
		c->n = i + 1;
		if (g->nodes[i].child && !(c->nodes[i].child = graph_copy(g->nodes[i].child))) {
			graph_free(c);
			return NULL;
		}
	}
	return c;
}

/* Appends nd (its child, if any, now owned by g). */
static int graph_append(struct graph *g, const struct node *nd)
{
	if (!grow((void **)&g->nodes, g->n, &g->cap, sizeof(*g->nodes)))
		return 0;
	g->nodes[g->n++] = *nd;
	return 1;
}

static struct graph *graph_new(void)
{
	struct graph *g = calloc(1, sizeof(*g));
	if (g)
		g->handle = GRAPH_BASE + ++next_graph * SMALL_STEP;
	return g;
}

/* Adds g to the graphs handed out. */
static int graph_publish(struct graph *g)
{
	if (!grow((void **)&graphs, ngraphs, &graphs_cap, sizeof(*graphs)))
		return 0;
	graphs[ngraphs++] = g;
	return 1;
}

/* A graph handed out, destroyed or not; NULL for a handle never handed out. */
static struct graph *graph_find(uintptr_t h)
{
	for (size_t i = 0; i < ngraphs; i++)
		if (graphs[i]->handle == h)
			return graphs[i];
	return NULL;
}

static struct exec *exec_find(uintptr_t h)
{
	for (size_t i = 0; i < nexecs; i++)
		if (execs[i].handle == h)
			return &execs[i];
	return NULL;
}

static uintptr_t stream_key(CUstream s, int ptsz)
{
	return !s && ptsz ? STREAM_PER_THREAD : (uintptr_t)s;
}

static int stream_is_legacy(uintptr_t s)
{
	return s == 0 || s == STREAM_LEGACY;
}

static struct cstream *cstream_find(uintptr_t s, int create)
{
	for (size_t i = 0; i < ncstreams; i++)
		if (cstreams[i].handle == s)
			return &cstreams[i];
	if (!create || !grow((void **)&cstreams, ncstreams, &cstreams_cap, sizeof(*cstreams)))
		return NULL;
	cstreams[ncstreams] = (struct cstream){.handle = s};
	return &cstreams[ncstreams++];
}

static struct capture *capture_find(unsigned long long id)
{
	for (size_t i = 0; i < ncaptures; i++)
		if (captures[i]->id == id)
			return captures[i];
	return NULL;
}

/* Unknown handles are created on first use: older workloads pass fake events. */
static struct event *event_find(uintptr_t h, int create)
{
	for (size_t i = 0; i < nevents; i++)
		if (events[i].handle == h)
			return &events[i];
	if (!create || !grow((void **)&events, nevents, &events_cap, sizeof(*events)))
		return NULL;
	events[nevents] = (struct event){.handle = h};
	return &events[nevents++];
}

/* Adds what one launch of g runs to the stats. */
static void graph_ran(const struct graph *g)
{
	for (size_t i = 0; i < g->n; i++) {
		const struct node *nd = &g->nodes[i];
		switch (nd->type) {
		case CU_GRAPH_NODE_TYPE_KERNEL:
			stats.graph_kernels++;
			break;
		case CU_GRAPH_NODE_TYPE_MEMCPY:
			stats.graph_copy_bytes[nd->kind] += nd->bytes;
			break;
		case CU_GRAPH_NODE_TYPE_MEMSET:
			stats.graph_set_bytes += nd->bytes;
			break;
		case CU_GRAPH_NODE_TYPE_GRAPH:
			graph_ran(nd->child);
			break;
		default:
			break;
		}
	}
}

/* Records nd on s when s captures: returns 0 when it does not (nd's child
 * stays the caller's), else 1 with *rc the call's result. */
static int capture_record(CUstream s, int ptsz, struct node *nd, CUresult *rc)
{
	if (!__atomic_load_n(&active_captures, __ATOMIC_ACQUIRE))
		return 0;
	pthread_mutex_lock(&graph_mu);
	struct cstream *cs = cstream_find(stream_key(s, ptsz), 0);
	if (!cs || !cs->cap) {
		pthread_mutex_unlock(&graph_mu);
		return 0;
	}
	switch (nd->type) {
	case CU_GRAPH_NODE_TYPE_KERNEL:
		stats.captured_launches++;
		break;
	case CU_GRAPH_NODE_TYPE_MEMCPY:
		stats.captured_copies++;
		break;
	case CU_GRAPH_NODE_TYPE_MEMSET:
		stats.captured_sets++;
		break;
	default:
		break;
	}
	nd->handle = NODE_BASE + ++next_node * SMALL_STEP;
	if (cs->cap->invalidated) {
		*rc = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
	} else if (!graph_append(cs->cap->g, nd)) {
		*rc = CUDA_ERROR_OUT_OF_MEMORY;
	} else {
		cs->work++;
		nd->child = NULL; /* the graph's now */
		*rc = CUDA_SUCCESS;
	}
	graph_free(nd->child);
	pthread_mutex_unlock(&graph_mu);
	return 1;
}

static int capture_kernel(CUstream s, int ptsz, CUfunction f, const unsigned grid[3],
			  const unsigned block[3], unsigned shared, CUresult *rc)
{
	struct node nd = {.type = CU_GRAPH_NODE_TYPE_KERNEL, .func = (uintptr_t)f, .shared = shared,
			  .grid = {grid[0], grid[1], grid[2]}, .block = {block[0], block[1], block[2]}};
	return capture_record(s, ptsz, &nd, rc);
}

static int capture_copy(CUstream s, int ptsz, size_t bytes, int kind, CUresult *rc)
{
	struct node nd = {.type = CU_GRAPH_NODE_TYPE_MEMCPY, .bytes = bytes,
			  .kind = (unsigned)kind <= 4 ? kind : 4};
	return capture_record(s, ptsz, &nd, rc);
}

static int capture_set(CUstream s, int ptsz, size_t bytes, CUresult *rc)
{
	struct node nd = {.type = CU_GRAPH_NODE_TYPE_MEMSET, .bytes = bytes, .kind = 1};
	return capture_record(s, ptsz, &nd, rc);
}

INTERNAL CUresult do_begin_capture(CUstream s, int ptsz, CUgraph into, const CUgraphNode *deps,
				   size_t ndeps, unsigned mode, int to_graph)
{
	uintptr_t key = stream_key(s, ptsz);
	CUresult rc = CUDA_SUCCESS;
	if (stream_is_legacy(key))
		return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
	if (mode > CU_STREAM_CAPTURE_MODE_RELAXED || (ndeps && !deps))
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&graph_mu);
	struct cstream *cs = cstream_find(key, 1);
	struct graph *g = to_graph ? graph_find((uintptr_t)into) : NULL;
	struct capture *cap = NULL;
	if (!cs)
		rc = CUDA_ERROR_OUT_OF_MEMORY;
	else if (cs->cap)
		rc = CUDA_ERROR_ILLEGAL_STATE; /* already capturing */
	else if (to_graph && (!g || g->dead))
		rc = CUDA_ERROR_INVALID_VALUE;
	else if (!grow((void **)&captures, ncaptures, &captures_cap, sizeof(*captures)) ||
		 !(cap = calloc(1, sizeof(*cap))) || (!to_graph && !(g = graph_new()))) {
		free(cap);
		rc = CUDA_ERROR_OUT_OF_MEMORY;
	} else {
		*cap = (struct capture){.id = ++next_capture_id, .origin = key, .g = g, .to_graph = to_graph};
		captures[ncaptures++] = cap;
		*cs = (struct cstream){.handle = key, .cap = cap};
		__atomic_add_fetch(&active_captures, 1, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&graph_mu);
	return rc;
}

static int capture_unjoined(const struct capture *cap)
{
	for (size_t i = 0; i < ncstreams; i++)
		if (cstreams[i].cap == cap && cstreams[i].handle != cap->origin &&
		    cstreams[i].work > cstreams[i].joined)
			return 1;
	return 0;
}

INTERNAL CUresult do_end_capture(CUstream s, int ptsz, CUgraph *phGraph)
{
	CUresult rc;
	pthread_mutex_lock(&graph_mu);
	struct cstream *cs = cstream_find(stream_key(s, ptsz), 0);
	struct capture *cap = cs ? cs->cap : NULL;
	if (!cap) {
		rc = CUDA_ERROR_ILLEGAL_STATE; /* not capturing */
		goto out;
	}
	if (!phGraph && !cap->to_graph) {
		rc = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	if (cs->handle != cap->origin) {
		cap->invalidated = 1;
		rc = CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;
		goto out;
	}
	rc = cap->invalidated	     ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
	     : capture_unjoined(cap) ? CUDA_ERROR_STREAM_CAPTURE_UNJOINED
				     : CUDA_SUCCESS;
	/* It ends on every stream it reached, whatever the result. */
	for (size_t i = 0; i < ncstreams; i++)
		if (cstreams[i].cap == cap)
			cstreams[i].cap = NULL;
	for (size_t i = 0; i < ncaptures; i++)
		if (captures[i] == cap)
			captures[i] = captures[--ncaptures];
	__atomic_sub_fetch(&active_captures, 1, __ATOMIC_RELEASE);
	if (rc == CUDA_SUCCESS && !cap->to_graph && !graph_publish(cap->g))
		rc = CUDA_ERROR_OUT_OF_MEMORY;
	if (phGraph)
		*phGraph = rc == CUDA_SUCCESS ? (CUgraph)cap->g->handle : NULL;
	if (rc != CUDA_SUCCESS && !cap->to_graph)
		graph_free(cap->g);
	free(cap);
out:
	pthread_mutex_unlock(&graph_mu);
	return rc;
}

INTERNAL CUresult do_is_capturing(CUstream s, int ptsz, CUstreamCaptureStatus *status)
{
	if (!status)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&graph_mu);
	struct cstream *cs = cstream_find(stream_key(s, ptsz), 0);
	*status = !cs || !cs->cap	  ? CU_STREAM_CAPTURE_STATUS_NONE
		  : cs->cap->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
					 : CU_STREAM_CAPTURE_STATUS_ACTIVE;
	pthread_mutex_unlock(&graph_mu);
	return CUDA_SUCCESS;
}

/* Nothing ever runs, so nothing is pending; synchronising a capturing
 * stream is not allowed and invalidates its capture. */
INTERNAL CUresult do_stream_sync(CUstream s, int ptsz)
{
	CUresult rc = CUDA_SUCCESS;
	sink = (uintptr_t)s;
	if (!__atomic_load_n(&active_captures, __ATOMIC_ACQUIRE))
		return rc;
	pthread_mutex_lock(&graph_mu);
	struct cstream *cs = cstream_find(stream_key(s, ptsz), 0);
	if (cs && cs->cap) {
		cs->cap->invalidated = 1;
		rc = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
	}
	pthread_mutex_unlock(&graph_mu);
	return rc;
}

INTERNAL CUresult do_event_create(CUevent *ph, unsigned flags)
{
	if (!ph || flags > 0xf) /* default, blocking sync, disable timing, interprocess */
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&graph_mu);
	struct event *e = event_find(EVENT_BASE + ++next_event * SMALL_STEP, 1);
	if (e)
		*ph = (CUevent)e->handle;
	pthread_mutex_unlock(&graph_mu);
	return e ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

INTERNAL CUresult do_event_destroy(CUevent h)
{
	CUresult rc = CUDA_SUCCESS;
	if (!h)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&graph_mu);
	struct event *e = event_find((uintptr_t)h, 1);
	if (!e)
		rc = CUDA_ERROR_OUT_OF_MEMORY;
	else if (e->dead)
		rc = CUDA_ERROR_INVALID_HANDLE;
	else
		e->dead = 1;
	pthread_mutex_unlock(&graph_mu);
	return rc;
}

/* On a capturing stream the event becomes a capture event: a stream that
 * waits on it joins the capture (a fork), or, already in it, has waited
 * for the recording stream's work so far (a join). */
INTERNAL CUresult do_event_record(CUevent h, CUstream s, int ptsz, unsigned flags)
{
	CUresult rc = CUDA_SUCCESS;
	uintptr_t key = stream_key(s, ptsz);
	if (!h)
		return CUDA_ERROR_INVALID_HANDLE;
	if (flags > 1) /* CU_EVENT_RECORD_DEFAULT, CU_EVENT_RECORD_EXTERNAL */
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&graph_mu);
	struct event *e = event_find((uintptr_t)h, 1);
	struct cstream *cs = cstream_find(key, 0);
	if (!e) {
		rc = CUDA_ERROR_OUT_OF_MEMORY;
	} else if (e->dead) {
		rc = CUDA_ERROR_INVALID_HANDLE;
	} else if (cs && cs->cap && cs->cap->invalidated) {
		rc = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
	} else {
		e->recorded = 1;
		e->stream = key;
		e->cap_id = cs && cs->cap ? cs->cap->id : 0;
		e->seq = cs && cs->cap ? cs->work : 0;
	}
	pthread_mutex_unlock(&graph_mu);
	return rc;
}

INTERNAL CUresult do_stream_wait(CUstream s, int ptsz, CUevent h, unsigned flags)
{
	CUresult rc = CUDA_SUCCESS;
	uintptr_t key = stream_key(s, ptsz);
	if (!h)
		return CUDA_ERROR_INVALID_HANDLE;
	if (flags > CU_EVENT_WAIT_EXTERNAL)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&graph_mu);
	struct event *e = event_find((uintptr_t)h, 1);
	struct cstream *cs = cstream_find(key, 0);
	struct capture *mine = cs ? cs->cap : NULL;
	struct capture *theirs = e && e->cap_id ? capture_find(e->cap_id) : NULL;
	if (!e) {
		rc = CUDA_ERROR_OUT_OF_MEMORY;
	} else if (e->dead) {
		rc = CUDA_ERROR_INVALID_HANDLE;
	} else if (theirs && !mine) {
		/* A fork: the stream joins the capture. */
		if (stream_is_legacy(key)) {
			theirs->invalidated = 1;
			rc = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
		} else if (!(cs = cstream_find(key, 1))) {
			rc = CUDA_ERROR_OUT_OF_MEMORY;
		} else {
			*cs = (struct cstream){.handle = key, .cap = theirs, .work = 1};
			rc = theirs->invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS;
		}
	} else if (theirs && mine != theirs) {
		mine->invalidated = 1;
		rc = CUDA_ERROR_STREAM_CAPTURE_MERGE;
	} else if (theirs) {
		/* A join: the recording stream's work up to the event is waited for. */
		struct cstream *from = cstream_find(e->stream, 0);
		if (from && from != cs && from->cap == theirs && e->seq > from->joined)
			from->joined = e->seq;
		rc = theirs->invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS;
	} else if (e->cap_id) {
		/* Last recorded in a capture that has ended. */
		if (mine)
			mine->invalidated = 1;
		rc = CUDA_ERROR_CAPTURED_EVENT;
	} else if (mine && e->recorded && !(flags & CU_EVENT_WAIT_EXTERNAL)) {
		mine->invalidated = 1; /* a capture may not depend on outside work */
		rc = CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
	} else if (mine && mine->invalidated) {
		rc = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
	}
	pthread_mutex_unlock(&graph_mu);
	return rc;
}

INTERNAL CUresult do_graph_create(CUgraph *ph, unsigned flags)
{
	if (!ph || flags)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&graph_mu);
	struct graph *g = graph_new();
	int ok = g && graph_publish(g);
	if (ok)
		*ph = (CUgraph)g->handle;
	else
		free(g);
	pthread_mutex_unlock(&graph_mu);
	return ok ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

/* A handle never handed out is an opaque graph: destroying it succeeds. */
INTERNAL CUresult do_graph_destroy(CUgraph h)
{
	CUresult rc = CUDA_SUCCESS;
	if (!h)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&graph_mu);
	struct graph *g = graph_find((uintptr_t)h);
	if (g && g->dead) {
		rc = CUDA_ERROR_INVALID_VALUE;
	} else if (g) {
		g->dead = 1;
		for (size_t i = 0; i < g->n; i++)
			graph_free(g->nodes[i].child);
		free(g->nodes);
		g->nodes = NULL;
		g->n = g->cap = 0;
	}
	pthread_mutex_unlock(&graph_mu);
	return rc;
}

/* An executable graph copies its graph's nodes; a graph handle never
 * handed out instantiates as an opaque graph (the older workloads' fakes). */
INTERNAL CUresult do_instantiate(CUgraphExec *pExec, CUgraph h, unsigned long long flags)
{
	CUresult rc = CUDA_SUCCESS;
	if (!pExec || !h || (flags & ~(unsigned long long)PROFI_GRAPH_INSTANTIATE_FLAGS))
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&graph_mu);
	struct graph *g = graph_find((uintptr_t)h), *c = NULL;
	if (g && g->dead) {
		rc = CUDA_ERROR_INVALID_VALUE;
	} else if ((g && !(c = graph_copy(g))) ||
		   !grow((void **)&execs, nexecs, &execs_cap, sizeof(*execs))) {
		graph_free(c);
		rc = CUDA_ERROR_OUT_OF_MEMORY;
	} else {
		execs[nexecs] = (struct exec){.handle = EXEC_BASE + ++next_exec * SMALL_STEP, .g = c};
		*pExec = (CUgraphExec)execs[nexecs++].handle;
	}
	pthread_mutex_unlock(&graph_mu);
	return rc;
}

INTERNAL CUresult do_instantiate_params(CUgraphExec *pExec, CUgraph h,
					CUDA_GRAPH_INSTANTIATE_PARAMS *p)
{
	if (!p)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult rc = do_instantiate(pExec, h, p->flags);
	sink = (uintptr_t)p->hUploadStream; /* uploading is free: nothing runs */
	p->hErrNode_out = NULL;
	p->result_out = rc ? CUDA_GRAPH_INSTANTIATE_ERROR : CUDA_GRAPH_INSTANTIATE_SUCCESS;
	return rc;
}

INTERNAL CUresult do_instantiate_v1(CUgraphExec *pExec, CUgraph h, CUgraphNode *errNode,
				    char *log, size_t logSize)
{
	if (errNode)
		*errNode = NULL;
	if (log && logSize)
		log[0] = 0;
	return do_instantiate(pExec, h, 0);
}

/* Whether b can replace a's parameters in an executable graph: the same
 * nodes in the same order, with the same types, copies of the same kind
 * and sets of the same element size (kernels may change function). */
static CUgraphExecUpdateResult graph_compare(const struct graph *a, const struct graph *b)
{
	if (a->n != b->n)
		return CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED;
	for (size_t i = 0; i < a->n; i++) {
		const struct node *x = &a->nodes[i], *y = &b->nodes[i];
		if (x->type != y->type)
			return CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED;
		if (x->type == CU_GRAPH_NODE_TYPE_GRAPH &&
		    graph_compare(x->child, y->child) != CU_GRAPH_EXEC_UPDATE_SUCCESS)
			return CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED;
		if ((x->type == CU_GRAPH_NODE_TYPE_MEMCPY || x->type == CU_GRAPH_NODE_TYPE_MEMSET) &&
		    x->kind != y->kind)
			return CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED;
	}
	return CU_GRAPH_EXEC_UPDATE_SUCCESS;
}

/* On success the executable graph runs h's nodes from now on; on failure
 * (CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE) it keeps its own. */
INTERNAL CUresult do_exec_update(CUgraphExec x, CUgraph h, CUgraphExecUpdateResult *result,
				 CUgraphNode *errNode)
{
	CUresult rc = CUDA_SUCCESS;
	CUgraphExecUpdateResult r = CU_GRAPH_EXEC_UPDATE_ERROR;
	if (errNode)
		*errNode = NULL;
	if (!x || !h || !result)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&graph_mu);
	struct exec *e = exec_find((uintptr_t)x);
	struct graph *g = graph_find((uintptr_t)h), *c;
	if (!e || e->dead || !g || g->dead) {
		rc = CUDA_ERROR_INVALID_VALUE;
	} else if (!e->g || (r = graph_compare(e->g, g)) != CU_GRAPH_EXEC_UPDATE_SUCCESS) {
		if (!e->g)
			r = CU_GRAPH_EXEC_UPDATE_ERROR; /* an opaque graph: nothing to compare */
		rc = CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
	} else if (!(c = graph_copy(g))) {
		rc = CUDA_ERROR_OUT_OF_MEMORY;
	} else {
		graph_free(e->g);
		e->g = c;
	}
	*result = r;
	pthread_mutex_unlock(&graph_mu);
	return rc;
}

INTERNAL CUresult do_exec_update_v2(CUgraphExec x, CUgraph h, CUgraphExecUpdateResultInfo *info)
{
	if (!info)
		return CUDA_ERROR_INVALID_VALUE;
	info->errorFromNode = NULL;
	return do_exec_update(x, h, &info->result, &info->errorNode);
}

/* A handle never handed out is an opaque executable graph: destroying it
 * succeeds. */
INTERNAL CUresult do_exec_destroy(CUgraphExec x)
{
	CUresult rc = CUDA_SUCCESS;
	if (!x)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&graph_mu);
	struct exec *e = exec_find((uintptr_t)x);
	if (e && e->dead) {
		rc = CUDA_ERROR_INVALID_VALUE;
	} else if (e) {
		e->dead = 1;
		graph_free(e->g);
		e->g = NULL;
	}
	pthread_mutex_unlock(&graph_mu);
	return rc;
}

/* Runs the executable graph's nodes (an opaque one runs nothing the stub
 * knows of); on a capturing stream it is recorded as a child graph node. */
static CUresult do_graph_launch(CUgraphExec x, CUstream s, int ptsz)
{
	CUresult rc = CUDA_SUCCESS;
	sink = (uintptr_t)x ^ (uintptr_t)s;
	if (!x)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&graph_mu);
	struct exec *e = exec_find((uintptr_t)x);
	struct cstream *cs = __atomic_load_n(&active_captures, __ATOMIC_ACQUIRE)
				     ? cstream_find(stream_key(s, ptsz), 0)
				     : NULL;
	if (e && e->dead) {
		rc = CUDA_ERROR_INVALID_HANDLE;
	} else if (cs && cs->cap) {
		struct node nd = {.type = CU_GRAPH_NODE_TYPE_GRAPH,
				  .handle = NODE_BASE + ++next_node * SMALL_STEP};
		if (cs->cap->invalidated)
			rc = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
		else if (!(nd.child = e && e->g ? graph_copy(e->g) : calloc(1, sizeof(struct graph))) ||
			 !graph_append(cs->cap->g, &nd)) {
			graph_free(nd.child);
			rc = CUDA_ERROR_OUT_OF_MEMORY;
		} else {
			cs->work++;
		}
	} else if (e && e->g) {
		stats.graph_launches++;
		graph_ran(e->g);
	} else {
		stats.opaque_graph_launches++;
	}
	pthread_mutex_unlock(&graph_mu);
	return rc;
}

/* Appends nd to graph h and hands out its node handle. */
INTERNAL CUresult do_add_node(CUgraphNode *ph, CUgraph h, const CUgraphNode *deps, size_t ndeps,
			      struct node *nd)
{
	CUresult rc = CUDA_SUCCESS;
	if (!ph || (ndeps && !deps)) {
		graph_free(nd->child);
		return CUDA_ERROR_INVALID_VALUE;
	}
	pthread_mutex_lock(&graph_mu);
	struct graph *g = graph_find((uintptr_t)h);
	if (!g || g->dead) {
		rc = CUDA_ERROR_INVALID_VALUE;
	} else {
		nd->handle = NODE_BASE + ++next_node * SMALL_STEP;
		if (graph_append(g, nd)) {
			*ph = (CUgraphNode)nd->handle;
			nd->child = NULL;
		} else {
			rc = CUDA_ERROR_OUT_OF_MEMORY;
		}
	}
	graph_free(nd->child);
	pthread_mutex_unlock(&graph_mu);
	return rc;
}

INTERNAL CUresult do_add_kernel(CUgraphNode *ph, CUgraph h, const CUgraphNode *deps, size_t ndeps,
				const CUDA_KERNEL_NODE_PARAMS_v1 *p, CUkernel kern)
{
	CUfunction f;
	if (!p)
		return CUDA_ERROR_INVALID_VALUE;
	f = p->func;
	if (!f && kern && do_kernel_function(&f, kern) != CUDA_SUCCESS)
		return CUDA_ERROR_INVALID_VALUE;
	if (!f || !p->gridDimX || !p->gridDimY || !p->gridDimZ || !p->blockDimX || !p->blockDimY ||
	    !p->blockDimZ)
		return CUDA_ERROR_INVALID_VALUE;
	struct node nd = {.type = CU_GRAPH_NODE_TYPE_KERNEL, .func = (uintptr_t)f,
			  .grid = {p->gridDimX, p->gridDimY, p->gridDimZ},
			  .block = {p->blockDimX, p->blockDimY, p->blockDimZ},
			  .shared = p->sharedMemBytes};
	return do_add_node(ph, h, deps, ndeps, &nd);
}

/* The cudaMemcpyKind of a copy between these memory types. */
static int copy_kind(CUmemorytype src, CUmemorytype dst)
{
	if (src == CU_MEMORYTYPE_UNIFIED || dst == CU_MEMORYTYPE_UNIFIED)
		return 4;
	int from_host = src == CU_MEMORYTYPE_HOST, to_host = dst == CU_MEMORYTYPE_HOST;
	return from_host ? (to_host ? 0 : 1) : (to_host ? 2 : 3);
}

INTERNAL CUresult do_add_memcpy(CUgraphNode *ph, CUgraph h, const CUgraphNode *deps, size_t ndeps,
				const CUDA_MEMCPY3D *p, CUcontext ctx)
{
	sink = (uintptr_t)ctx;
	if (!p || !p->WidthInBytes || !p->Height || !p->Depth || p->srcMemoryType < CU_MEMORYTYPE_HOST ||
	    p->srcMemoryType > CU_MEMORYTYPE_UNIFIED || p->dstMemoryType < CU_MEMORYTYPE_HOST ||
	    p->dstMemoryType > CU_MEMORYTYPE_UNIFIED)
		return CUDA_ERROR_INVALID_VALUE;
	struct node nd = {.type = CU_GRAPH_NODE_TYPE_MEMCPY,
			  .bytes = p->WidthInBytes * p->Height * p->Depth,
			  .kind = copy_kind(p->srcMemoryType, p->dstMemoryType)};
	return do_add_node(ph, h, deps, ndeps, &nd);
}

INTERNAL CUresult do_add_memset(CUgraphNode *ph, CUgraph h, const CUgraphNode *deps, size_t ndeps,
				const CUDA_MEMSET_NODE_PARAMS *p, CUcontext ctx)
{
	sink = (uintptr_t)ctx;
	if (!p || !p->dst || !p->width || !p->height ||
	    (p->elementSize != 1 && p->elementSize != 2 && p->elementSize != 4))
		return CUDA_ERROR_INVALID_VALUE;
	struct node nd = {.type = CU_GRAPH_NODE_TYPE_MEMSET,
			  .bytes = (size_t)p->elementSize * p->width * p->height,
			  .kind = (int)p->elementSize};
	return do_add_node(ph, h, deps, ndeps, &nd);
}

/* The child is copied: changing it later changes no parent. */
INTERNAL CUresult do_add_child(CUgraphNode *ph, CUgraph h, const CUgraphNode *deps, size_t ndeps,
			       CUgraph child)
{
	struct node nd = {.type = CU_GRAPH_NODE_TYPE_GRAPH};
	pthread_mutex_lock(&graph_mu);
	struct graph *c = graph_find((uintptr_t)child);
	int ok = c && !c->dead && c->handle != (uintptr_t)h;
	if (ok)
		nd.child = graph_copy(c);
	pthread_mutex_unlock(&graph_mu);
	if (!ok)
		return CUDA_ERROR_INVALID_VALUE;
	if (!nd.child)
		return CUDA_ERROR_OUT_OF_MEMORY;
	return do_add_node(ph, h, deps, ndeps, &nd);
}

INTERNAL CUresult do_get_nodes(CUgraph h, CUgraphNode *nodes, size_t *num)
{
	CUresult rc = CUDA_SUCCESS;
	if (!num)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&graph_mu);
	struct graph *g = graph_find((uintptr_t)h);
	if (!g || g->dead) {
		rc = CUDA_ERROR_INVALID_VALUE;
	} else {
		for (size_t i = 0; nodes && i < *num; i++)
			nodes[i] = i < g->n ? (CUgraphNode)g->nodes[i].handle : NULL;
		*num = g->n;
	}
	pthread_mutex_unlock(&graph_mu);
	return rc;
}

INTERNAL CUresult do_node_type(CUgraphNode h, CUgraphNodeType *type)
{
	CUresult rc = CUDA_ERROR_INVALID_VALUE;
	if (!h || !type)
		return rc;
	pthread_mutex_lock(&graph_mu);
	for (size_t i = 0; i < ngraphs && rc; i++)
		for (size_t j = 0; j < graphs[i]->n && rc; j++)
			if (graphs[i]->nodes[j].handle == (uintptr_t)h) {
				*type = graphs[i]->nodes[j].type;
				rc = CUDA_SUCCESS;
			}
	pthread_mutex_unlock(&graph_mu);
	return rc;
}

static int exptab_capture_launch(CUstream s, int ptsz, CUfunction f, const unsigned grid[3],
				 const unsigned block[3], unsigned shared, CUresult *rc)
{
	return capture_kernel(s, ptsz, f, grid, block, shared, rc);
}

static void exptab_stats(struct profi_stub_stats *out)
{
	pthread_mutex_lock(&graph_mu);
	*out = stats;
	pthread_mutex_unlock(&graph_mu);
	out->driver_launches = __atomic_load_n(&driver_launches, __ATOMIC_RELAXED);
}

static const struct profi_stub_export_table export_table = {
	.size = sizeof(struct profi_stub_export_table),
	.capture_launch = exptab_capture_launch,
	.capture_copy = capture_copy,
	.capture_set = capture_set,
	.stats = exptab_stats,
};

INTERNAL CUresult do_export_table(const void **pp, const CUuuid *id)
{
	if (!pp || !id)
		return CUDA_ERROR_INVALID_VALUE;
	if (memcmp(id->bytes, PROFI_STUB_EXPORT_TABLE_ID, sizeof(id->bytes)))
		return CUDA_ERROR_INVALID_VALUE; /* what the driver says to an unknown table */
	*pp = &export_table;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamBeginCapture(CUstream hStream)
{
	WRAP(do_begin_capture(hStream, 0, NULL, NULL, 0, CU_STREAM_CAPTURE_MODE_GLOBAL, 0));
}
EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream hStream)
{
	WRAP(do_begin_capture(hStream, 1, NULL, NULL, 0, CU_STREAM_CAPTURE_MODE_GLOBAL, 0));
}
EXPORT CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode)
{
	WRAP(do_begin_capture(hStream, 0, NULL, NULL, 0, mode, 0));
}
EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode)
{
	WRAP(do_begin_capture(hStream, 1, NULL, NULL, 0, mode, 0));
}
EXPORT CUresult cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph,
					    const CUgraphNode *dependencies,
					    const void *dependencyData, size_t numDependencies,
					    CUstreamCaptureMode mode)
{
	sink = (uintptr_t)dependencyData;
	WRAP(do_begin_capture(hStream, 0, hGraph, dependencies, numDependencies, mode, 1));
}
EXPORT CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph,
						 const CUgraphNode *dependencies,
						 const void *dependencyData,
						 size_t numDependencies, CUstreamCaptureMode mode)
{
	sink = (uintptr_t)dependencyData;
	WRAP(do_begin_capture(hStream, 1, hGraph, dependencies, numDependencies, mode, 1));
}
EXPORT CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
	WRAP(do_end_capture(hStream, 0, phGraph));
}
EXPORT CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph)
{
	WRAP(do_end_capture(hStream, 1, phGraph));
}
EXPORT CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
	WRAP(do_is_capturing(hStream, 0, captureStatus));
}
EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
	WRAP(do_is_capturing(hStream, 1, captureStatus));
}
EXPORT CUresult cuStreamSynchronize(CUstream hStream)
{
	WRAP(do_stream_sync(hStream, 0));
}
EXPORT CUresult cuStreamSynchronize_ptsz(CUstream hStream)
{
	WRAP(do_stream_sync(hStream, 1));
}
EXPORT CUresult cuEventCreate(CUevent *phEvent, unsigned Flags)
{
	WRAP(do_event_create(phEvent, Flags));
}
EXPORT CUresult cuEventDestroy_v2(CUevent hEvent)
{
	WRAP(do_event_destroy(hEvent));
}
EXPORT CUresult cuEventRecord(CUevent hEvent, CUstream hStream)
{
	WRAP(do_event_record(hEvent, hStream, 0, 0));
}
EXPORT CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream)
{
	WRAP(do_event_record(hEvent, hStream, 1, 0));
}
EXPORT CUresult cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned flags)
{
	WRAP(do_event_record(hEvent, hStream, 0, flags));
}
EXPORT CUresult cuEventRecordWithFlags_ptsz(CUevent hEvent, CUstream hStream, unsigned flags)
{
	WRAP(do_event_record(hEvent, hStream, 1, flags));
}
EXPORT CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned Flags)
{
	WRAP(do_stream_wait(hStream, 0, hEvent, Flags));
}
EXPORT CUresult cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned Flags)
{
	WRAP(do_stream_wait(hStream, 1, hEvent, Flags));
}
EXPORT CUresult cuGraphCreate(CUgraph *phGraph, unsigned flags)
{
	WRAP(do_graph_create(phGraph, flags));
}
EXPORT CUresult cuGraphDestroy(CUgraph hGraph)
{
	WRAP(do_graph_destroy(hGraph));
}
EXPORT CUresult cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph,
				   CUgraphNode *phErrorNode, char *logBuffer, size_t bufferSize)
{
	WRAP(do_instantiate_v1(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize));
}
EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph,
				      CUgraphNode *phErrorNode, char *logBuffer, size_t bufferSize)
{
	WRAP(do_instantiate_v1(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize));
}
EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
					    unsigned long long flags)
{
	WRAP(do_instantiate(phGraphExec, hGraph, flags));
}
EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
					     CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams)
{
	WRAP(do_instantiate_params(phGraphExec, hGraph, instantiateParams));
}
EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *phGraphExec, CUgraph hGraph,
						  CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams)
{
	WRAP(do_instantiate_params(phGraphExec, hGraph, instantiateParams));
}
EXPORT CUresult cuGraphExecUpdate(CUgraphExec hGraphExec, CUgraph hGraph,
				  CUgraphNode *hErrorNode_out,
				  CUgraphExecUpdateResult *updateResult_out)
{
	WRAP(do_exec_update(hGraphExec, hGraph, updateResult_out, hErrorNode_out));
}
EXPORT CUresult cuGraphExecUpdate_v2(CUgraphExec hGraphExec, CUgraph hGraph,
				     CUgraphExecUpdateResultInfo *resultInfo)
{
	WRAP(do_exec_update_v2(hGraphExec, hGraph, resultInfo));
}
EXPORT CUresult cuGraphExecDestroy(CUgraphExec hGraphExec)
{
	WRAP(do_exec_destroy(hGraphExec));
}
EXPORT CUresult cuGraphAddKernelNode(CUgraphNode *phGraphNode, CUgraph hGraph,
				     const CUgraphNode *dependencies, size_t numDependencies,
				     const CUDA_KERNEL_NODE_PARAMS_v1 *nodeParams)
{
	WRAP(do_add_kernel(phGraphNode, hGraph, dependencies, numDependencies, nodeParams, NULL));
}
/* CUDA_KERNEL_NODE_PARAMS_v2 begins with _v1's fields. */
EXPORT CUresult cuGraphAddKernelNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph,
					const CUgraphNode *dependencies, size_t numDependencies,
					const CUDA_KERNEL_NODE_PARAMS *nodeParams)
{
	WRAP(do_add_kernel(phGraphNode, hGraph, dependencies, numDependencies,
			   (const CUDA_KERNEL_NODE_PARAMS_v1 *)nodeParams,
			   nodeParams ? nodeParams->kern : NULL));
}
EXPORT CUresult cuGraphAddMemcpyNode(CUgraphNode *phGraphNode, CUgraph hGraph,
				     const CUgraphNode *dependencies, size_t numDependencies,
				     const CUDA_MEMCPY3D *copyParams, CUcontext ctx)
{
	WRAP(do_add_memcpy(phGraphNode, hGraph, dependencies, numDependencies, copyParams, ctx));
}
EXPORT CUresult cuGraphAddMemsetNode(CUgraphNode *phGraphNode, CUgraph hGraph,
				     const CUgraphNode *dependencies, size_t numDependencies,
				     const CUDA_MEMSET_NODE_PARAMS *memsetParams, CUcontext ctx)
{
	WRAP(do_add_memset(phGraphNode, hGraph, dependencies, numDependencies, memsetParams, ctx));
}
EXPORT CUresult cuGraphAddChildGraphNode(CUgraphNode *phGraphNode, CUgraph hGraph,
					 const CUgraphNode *dependencies, size_t numDependencies,
					 CUgraph childGraph)
{
	WRAP(do_add_child(phGraphNode, hGraph, dependencies, numDependencies, childGraph));
}
EXPORT CUresult cuGraphGetNodes(CUgraph hGraph, CUgraphNode *nodes, size_t *numNodes)
{
	WRAP(do_get_nodes(hGraph, nodes, numNodes));
}
EXPORT CUresult cuGraphNodeGetType(CUgraphNode hNode, CUgraphNodeType *type)
{
	WRAP(do_node_type(hNode, type));
}
EXPORT CUresult cuGetExportTable(const void **ppExportTable, const CUuuid *pExportTableId)
{
	WRAP(do_export_table(ppExportTable, pExportTableId));
}
