/* Fake inference server driving the stub libcudart.so.12 (and, with
 * --driver, the stub libcuda.so.1 directly) and printing exact ground truth,
 * so tests can compare what the agent counted with what happened. Ground
 * truth is tallied from the arguments passed and the codes returned, never
 * from formulas. Built twice (internal/testutil/build.go): linked against
 * the stub, and with -DPROFI_DLOPEN resolving every function with dlsym at
 * runtime, the way frameworks load cudart.
 *
 * Ground truth counts only the calls the workload makes itself: the driver
 * calls the runtime stub makes inside a runtime call (and at kernel
 * registration, outside any phase) are not in it.
 *
 * With --nvtx (or --nvtx-lib PATH) it also dlopens the stub NVTX library
 * at start (libnvToolsExt.so.1: through the RUNPATH in the linked build,
 * next to --lib in the dlopen build) and, in every iteration, launches
 * kernels inside nested NVTX ranges (nvtx_ranges()); the ground truth then
 * adds launches_by_phase, every launch's phase per docs/INTERFACE.md's `phase`
 * rules computed from the thread's range stack at the launch, and
 * nvtx_calls. Without it the output is exactly what it was before.
 *
 * With --nccl-lib PATH as well (NVTX only) it dlopens that libnccl and
 * makes an empty group (ncclGroupStart, ncclGroupEnd) on the launching
 * thread before every NVTX-annotated launch, inside and outside ranges:
 * NCCL calls must not disturb the thread's phase. The ground truth then
 * adds nccl_calls.
 *
 * stdin protocol: prints "ready <pid>"; "load" -> dlopen -> "loaded" (the
 * linked build just answers); "go" -> one measured phase -> one JSON line of
 * cumulative totals; "run" -> a phase that lasts until "stop": "running"
 * once every thread has made its first iteration, then iterations (at least
 * --iters per thread) until "stop" (or "exit", or EOF) -> the JSON line, so
 * that a test's adversary, not the clock, decides how long it runs
 * (--pause-us N: N microseconds of sleep after each iteration, to bound
 * how many calls it makes meanwhile; --spin-us N: N microseconds on the CPU
 * after each iteration, without a call); "segv", "ill" or "nullstore" -> dies
 * of that fault; "xol" or "tramp" -> dies of a fault in the uprobe page;
 * "xol-thread" -> the same fault on a thread that made no probed call;
 * "send HOW SIG" -> sends itself SIG (HOW: kill, tgkill, sigqueue, forge);
 * "exit" or EOF -> exit 0.
 *
 * With --park a phase's threads do not exit at its end: they wait until
 * the next command, so that their CPU time stays readable, and the JSON
 * line adds "threads": per thread its tid, its CPU clock at its start and
 * once parked (read by the main thread: CLOCK_THREAD_CPUTIME_ID of a
 * thread that no longer runs), and the wall clock (CLOCK_REALTIME) at its
 * start and at the end of its iterations. */
#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <wchar.h>

#include "cuda_drv_stub.h"
#include "cuda_stub.h"
#include "nvtx_stub.h"

#ifdef PROFI_DLOPEN
#define DECLARE_PTR(name, params) static cudaError_t(*p_##name) params;
PROFI_CUDA_CORE_FUNCS(DECLARE_PTR)
PROFI_CUDA_EXTRA_FUNCS(DECLARE_PTR)
PROFI_CUDA_PTSZ_FUNCS(DECLARE_PTR)
PROFI_CUDA_GRAPH_FUNCS(DECLARE_PTR)
static void **(*p___cudaRegisterFatBinary)(void *);
static void (*p___cudaRegisterFunction)(void **, const char *, char *, const char *, int,
					void *, void *, void *, void *, int *);
static void (*p___cudaUnregisterFatBinary)(void **);
#define CUDA(name) p_##name
#else
#define CUDA(name) name
#endif

/* The driver is always reached through dlsym'd pointers: the linked build
 * takes the libcuda.so.1 its libcudart already loaded (found through the
 * stub's RUNPATH), so the workload itself does not link the driver. */
#define DECLARE_CU_PTR(name, params) static CUresult(*d_##name) params;
PROFI_CU_FUNCS(DECLARE_CU_PTR)
#define CU(name) d_##name

/* Every function the workload calls and reports, in ground-truth order.
 * Groups: the default set, --extra, --driver, --ptsz. */
enum { G_CORE, G_EXTRA, G_DRIVER, G_PTSZ };
enum {
	F_MALLOC, F_FREE, F_MEMCPY, F_MEMCPY_ASYNC, F_LAUNCH, F_MALLOC_ASYNC,
	F_FREE_ASYNC, F_GRAPH_LAUNCH, F_GRAPH_INST,
	F_LAUNCH_PTSZ, F_LAUNCH_EXC, F_LAUNCH_COOP, F_MEMCPY_ASYNC_PTSZ,
	F_MEMCPY_PEER, F_MEMCPY_PEER_ASYNC, F_MEMCPY_2D, F_MEMCPY_2D_ASYNC,
	F_MALLOC_MANAGED, F_MALLOC_HOST, F_FREE_HOST, F_MEMSET, F_MEMSET_ASYNC,
	F_STREAM_SYNC, F_EVENT_SYNC, F_DEVICE_SYNC, F_SET_DEVICE, F_GET_DEVICE,
	F_CU_INIT, F_CU_MODULE_LOAD, F_CU_MODULE_GET_FUNCTION, F_CU_LIBRARY_LOAD,
	F_CU_LIBRARY_GET_KERNEL, F_CU_KERNEL_GET_FUNCTION, F_CU_LAUNCH,
	F_CU_LAUNCH_EX, F_CU_LAUNCH_COOP,
	F_MEMCPY_PTDS, F_MEMCPY_2D_PTDS, F_MEMCPY_2D_ASYNC_PTSZ, F_MEMSET_PTDS,
	F_MEMSET_ASYNC_PTSZ, F_STREAM_SYNC_PTSZ, F_GRAPH_LAUNCH_PTSZ,
	F_MALLOC_ASYNC_PTSZ, F_FREE_ASYNC_PTSZ, F_LAUNCH_EXC_PTSZ, F_LAUNCH_COOP_PTSZ,
	F_MEMCPY_3D, F_MEMCPY_3D_ASYNC, F_MEMCPY_3D_PEER, F_MEMCPY_3D_PEER_ASYNC,
	F_MEMCPY_3D_PTDS, F_MEMCPY_3D_ASYNC_PTSZ, F_MEMCPY_3D_PEER_PTDS, F_MEMCPY_3D_PEER_ASYNC_PTSZ,
	F_TO_SYMBOL, F_FROM_SYMBOL, F_TO_SYMBOL_ASYNC, F_FROM_SYMBOL_ASYNC,
	F_TO_SYMBOL_PTDS, F_FROM_SYMBOL_PTDS, F_TO_SYMBOL_ASYNC_PTSZ, F_FROM_SYMBOL_ASYNC_PTSZ,
	F_MEMSET_2D, F_MEMSET_2D_ASYNC, F_MEMSET_2D_PTDS, F_MEMSET_2D_ASYNC_PTSZ,
	F_MEMSET_3D, F_MEMSET_3D_ASYNC, F_MEMSET_3D_PTDS, F_MEMSET_3D_ASYNC_PTSZ,
	F_MALLOC_PITCH, F_MALLOC_3D, F_MALLOC_FROM_POOL, F_MALLOC_FROM_POOL_PTSZ,
	NFN
};
static const struct {
	const char *name;
	int has_stream, group;
} fn[NFN] = {
	{"cudaMalloc", 0, G_CORE}, {"cudaFree", 0, G_CORE},
	{"cudaMemcpy", 0, G_CORE}, {"cudaMemcpyAsync", 1, G_CORE},
	{"cudaLaunchKernel", 1, G_CORE}, {"cudaMallocAsync", 1, G_CORE},
	{"cudaFreeAsync", 1, G_CORE}, {"cudaGraphLaunch", 1, G_CORE},
	{"cudaGraphInstantiate", 0, G_CORE},
	{"cudaLaunchKernel_ptsz", 1, G_EXTRA}, {"cudaLaunchKernelExC", 1, G_EXTRA},
	{"cudaLaunchCooperativeKernel", 1, G_EXTRA}, {"cudaMemcpyAsync_ptsz", 1, G_EXTRA},
	{"cudaMemcpyPeer", 0, G_EXTRA}, {"cudaMemcpyPeerAsync", 1, G_EXTRA},
	{"cudaMemcpy2D", 0, G_EXTRA}, {"cudaMemcpy2DAsync", 1, G_EXTRA},
	{"cudaMallocManaged", 0, G_EXTRA}, {"cudaMallocHost", 0, G_EXTRA},
	{"cudaFreeHost", 0, G_EXTRA}, {"cudaMemset", 0, G_EXTRA},
	{"cudaMemsetAsync", 1, G_EXTRA}, {"cudaStreamSynchronize", 1, G_EXTRA},
	{"cudaEventSynchronize", 0, G_EXTRA}, {"cudaDeviceSynchronize", 0, G_EXTRA},
	{"cudaSetDevice", 0, G_EXTRA}, {"cudaGetDevice", 0, G_EXTRA},
	{"cuInit", 0, G_DRIVER}, {"cuModuleLoadData", 0, G_DRIVER},
	{"cuModuleGetFunction", 0, G_DRIVER}, {"cuLibraryLoadData", 0, G_DRIVER},
	{"cuLibraryGetKernel", 0, G_DRIVER}, {"cuKernelGetFunction", 0, G_DRIVER},
	{"cuLaunchKernel", 1, G_DRIVER}, {"cuLaunchKernelEx", 1, G_DRIVER},
	{"cuLaunchCooperativeKernel", 1, G_DRIVER},
	{"cudaMemcpy_ptds", 0, G_PTSZ}, {"cudaMemcpy2D_ptds", 0, G_PTSZ},
	{"cudaMemcpy2DAsync_ptsz", 1, G_PTSZ}, {"cudaMemset_ptds", 0, G_PTSZ},
	{"cudaMemsetAsync_ptsz", 1, G_PTSZ}, {"cudaStreamSynchronize_ptsz", 1, G_PTSZ},
	{"cudaGraphLaunch_ptsz", 1, G_PTSZ}, {"cudaMallocAsync_ptsz", 1, G_PTSZ},
	{"cudaFreeAsync_ptsz", 1, G_PTSZ}, {"cudaLaunchKernelExC_ptsz", 1, G_PTSZ},
	{"cudaLaunchCooperativeKernel_ptsz", 1, G_PTSZ},
	{"cudaMemcpy3D", 0, G_EXTRA}, {"cudaMemcpy3DAsync", 1, G_EXTRA},
	{"cudaMemcpy3DPeer", 0, G_EXTRA}, {"cudaMemcpy3DPeerAsync", 1, G_EXTRA},
	{"cudaMemcpy3D_ptds", 0, G_PTSZ}, {"cudaMemcpy3DAsync_ptsz", 1, G_PTSZ},
	{"cudaMemcpy3DPeer_ptds", 0, G_PTSZ}, {"cudaMemcpy3DPeerAsync_ptsz", 1, G_PTSZ},
	{"cudaMemcpyToSymbol", 0, G_EXTRA}, {"cudaMemcpyFromSymbol", 0, G_EXTRA},
	{"cudaMemcpyToSymbolAsync", 1, G_EXTRA}, {"cudaMemcpyFromSymbolAsync", 1, G_EXTRA},
	{"cudaMemcpyToSymbol_ptds", 0, G_PTSZ}, {"cudaMemcpyFromSymbol_ptds", 0, G_PTSZ},
	{"cudaMemcpyToSymbolAsync_ptsz", 1, G_PTSZ}, {"cudaMemcpyFromSymbolAsync_ptsz", 1, G_PTSZ},
	{"cudaMemset2D", 0, G_EXTRA}, {"cudaMemset2DAsync", 1, G_EXTRA},
	{"cudaMemset2D_ptds", 0, G_PTSZ}, {"cudaMemset2DAsync_ptsz", 1, G_PTSZ},
	{"cudaMemset3D", 0, G_EXTRA}, {"cudaMemset3DAsync", 1, G_EXTRA},
	{"cudaMemset3D_ptds", 0, G_PTSZ}, {"cudaMemset3DAsync_ptsz", 1, G_PTSZ},
	{"cudaMallocPitch", 0, G_EXTRA}, {"cudaMalloc3D", 0, G_EXTRA},
	{"cudaMallocFromPoolAsync", 1, G_EXTRA}, {"cudaMallocFromPoolAsync_ptsz", 1, G_PTSZ},
};

/* Launch APIs, the keys of launches_by_api (all always listed). */
enum { LA_RT, LA_RT_PTSZ, LA_RT_EXC, LA_RT_COOP, LA_RT_EXC_PTSZ, LA_RT_COOP_PTSZ,
       LA_CU, LA_CU_EX, LA_CU_COOP, NLA };
static const int la_fn[NLA] = {F_LAUNCH, F_LAUNCH_PTSZ, F_LAUNCH_EXC, F_LAUNCH_COOP,
			       F_LAUNCH_EXC_PTSZ, F_LAUNCH_COOP_PTSZ,
			       F_CU_LAUNCH, F_CU_LAUNCH_EX, F_CU_LAUNCH_COOP};

/* Kernels, the keys of launches_by_kernel: four registered with the
 * runtime under real mangled C++ names (checked with c++filt by the Go
 * tests), three looked up through the driver, and "" for NULL launches. */
#define NAME_FLASH "_ZN5flash16flash_fwd_kernelILi128ELi64EEEvPKfPfi"
#define NAME_GEMM "_ZN7cutlass6KernelI66cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x3_tn_align8EEvNT_6ParamsE"
#define NAME_SILU "_ZN2at6native29vectorized_elementwise_kernelILi4EZZZNS0_12_GLOBAL__N_111silu_kernelERNS_18TensorIteratorBaseEENKUlvE_clEvENKUlvE0_clEvEUlfE_NS_6detail5ArrayIPcLi2EEEEEviT0_T1_"
#define NAME_RMS "_Z15rms_norm_kernelIfEvPT_PKS0_i"
enum { K_FLASH, K_GEMM, K_SILU, K_RMS, NRT_KERNELS,
       K_TRITON_ADD = NRT_KERNELS, K_TRITON_SOFTMAX, K_PAGED, K_NONE, NKERN };
static const char *const kernel_name[NKERN] = {
	NAME_FLASH, NAME_GEMM, NAME_SILU, NAME_RMS,
	"triton_poi_fused_add_mul_0", "triton_red_fused_softmax_1",
	"_Z15paged_attentionPfS_i", "",
};

/* Host-side kernel stubs, named like nvcc's so that a symbolizer finds the
 * kernel name for a launch's func address (exported with -rdynamic).
 * Distinct bodies so the linker cannot fold them into one address. */
static volatile int kernel_sink;
#define KERNEL_STUB(c_name, mangled, n)               \
	void c_name(void) __asm__(mangled);           \
	void c_name(void) { kernel_sink = n; }
KERNEL_STUB(k_flash, NAME_FLASH, 1)
KERNEL_STUB(k_gemm, NAME_GEMM, 2)
KERNEL_STUB(k_silu, NAME_SILU, 3)
KERNEL_STUB(k_rms, NAME_RMS, 4)
static void (*const kernel_fn[NRT_KERNELS])(void) = {k_flash, k_gemm, k_silu, k_rms};

/* Memcpy kinds 0..4, then "unknown" for invalid kinds. */
static const char *const kind_name[6] = {"h2h", "h2d", "d2h", "d2d", "default", "unknown"};

/* NVTX functions (--nvtx), the keys of nvtx_calls. */
enum { N_PUSH_A, N_PUSH_W, N_POP, N_DOMAIN_CREATE, N_DOMAIN_PUSH_EX, N_DOMAIN_POP, NNVTX };
static const char *const nvtx_name[NNVTX] = {
	"nvtxRangePushA", "nvtxRangePushW", "nvtxRangePop",
	"nvtxDomainCreateA", "nvtxDomainRangePushEx", "nvtxDomainRangePop",
};

/* docs/INTERFACE.md `phase`: the innermost open range that matches a rule gives
 * the phase; rules in this order, substrings of the lowercased name;
 * "other" when ranges are open but none matches, "" when none is open. */
enum { PH_NONE, PH_PREFILL, PH_DECODE, PH_ATTENTION, PH_MLP, PH_NORM, PH_OTHER, NPHASE };
static const char *const phase_name[NPHASE] = {
	"", "prefill", "decode", "attention", "mlp", "norm", "other",
};

#define MAX_CODES 8
struct stream_row {
	uintptr_t handle; /* 0 = default stream */
	uint64_t n[NFN];
	uint64_t memset_bytes;
};
/* Per-thread tallies, merged into the global one at join: no locking. */
struct tally {
	uint64_t calls[NFN];
	struct { int code; uint64_t n; } err[NFN][MAX_CODES];
	struct stream_row *streams;
	size_t nstreams;
	uint64_t memcpy_bytes[5], memcpy_calls[6], p2p_bytes, p2p_calls;
	uint64_t malloc_bytes, free_bytes, managed_bytes, malloc_host_bytes;
	uint64_t launches, grid_blocks, block_threads, shared_bytes; /* cudaLaunchKernel */
	uint64_t api_launches[NLA], api_grid[NLA], api_block[NLA], api_shared[NLA];
	uint64_t kernel_launches[NKERN];
	uint64_t set_device_calls;
	uint64_t phase_launches[NPHASE], nvtx_calls[NNVTX];
	uint64_t nccl_groups; /* --nccl-lib: empty groups made (one ncclGroupStart + one ncclGroupEnd each) */
};

static struct {
	int threads, iters, launches, memcpys, mallocs, graphs, streams, errors;
	int driver, extra, ptsz, nvtx;
	const char *lib, *lib_cuda, *nvtx_lib, *nccl_lib;
	int pause_us, spin_us, park;
} opt = {2, 200, 20, 2, 1, 1, 2, 1, 0, 0, 0, 0, "libcudart.so.12", NULL, NULL, NULL, 0, 0, 0};
static int have_graphs = 1; /* 0 when the library lacks the graph symbols */
static int have_graph_ptsz = 1; /* likewise for cudaGraphLaunch_ptsz */
static struct tally total;

/* What nvcc embeds for __cudaRegisterFatBinary: a wrapper around the fat
 * binary. The stubs never read either. */
static const unsigned long long fatbin_data[] = {0x00100001ba55ed50ULL, 0};
static const struct {
	int magic, version;
	const unsigned long long *data;
	void *filename_or_fatbins;
} fatbin_wrapper = {0x466243b1, 1, fatbin_data, NULL};
/* Images for the driver's module and library loaders (never parsed). */
static const char triton_image[] = "//\n// Generated by Triton (stub PTX)\n.version 8.0\n";
static const char library_image[] = "//\n// paged attention (stub PTX)\n.version 8.0\n";

static void die(const char *msg)
{
	fprintf(stderr, "workload: %s\n", msg);
	exit(1);
}

static struct stream_row *stream_row(struct tally *t, uintptr_t h)
{
	size_t i;
	for (i = 0; i < t->nstreams && t->streams[i].handle != h; i++)
		;
	if (i == t->nstreams) {
		t->streams = realloc(t->streams, (i + 1) * sizeof(*t->streams));
		if (!t->streams)
			die("out of memory");
		memset(&t->streams[i], 0, sizeof(*t->streams));
		t->streams[i].handle = h;
		t->nstreams++;
	}
	return &t->streams[i];
}

static void add_stream(struct tally *t, uintptr_t h, int f, uint64_t n)
{
	stream_row(t, h)->n[f] += n;
}

static void add_err(struct tally *t, int f, int code, uint64_t n)
{
	for (int i = 0; i < MAX_CODES; i++) {
		if (t->err[f][i].n == 0 || t->err[f][i].code == code) {
			t->err[f][i].code = code;
			t->err[f][i].n += n;
			return;
		}
	}
	die("too many distinct error codes");
}

/* Counts one call of f on stream (ignored for stream-less functions). */
static void record(struct tally *t, int f, cudaStream_t stream, int rc)
{
	t->calls[f]++;
	if (fn[f].has_stream)
		add_stream(t, (uintptr_t)stream, f, 1);
	if (rc != cudaSuccess)
		add_err(t, f, rc, 1);
}

/* Call wrappers: each makes exactly one CUDA call and accounts for it.
 * async: 0 for the synchronous function, 1 for its Async variant, 2 for
 * the Async variant's _ptsz. */
static void *dev_malloc(struct tally *t, size_t size, int async, cudaStream_t s)
{
	void *p = NULL;
	cudaError_t rc = async == 2 ? CUDA(cudaMallocAsync_ptsz)(&p, size, s)
			 : async    ? CUDA(cudaMallocAsync)(&p, size, s)
				    : CUDA(cudaMalloc)(&p, size);
	record(t, async == 2 ? F_MALLOC_ASYNC_PTSZ : async ? F_MALLOC_ASYNC : F_MALLOC, s, rc);
	if (rc == cudaSuccess)
		t->malloc_bytes += size;
	return rc == cudaSuccess ? p : NULL;
}

/* Managed memory is device-accessible and freed with cudaFree, so it counts
 * as device allocation too. */
static void *managed_malloc(struct tally *t, size_t size)
{
	void *p = NULL;
	cudaError_t rc = CUDA(cudaMallocManaged)(&p, size, cudaMemAttachGlobal);
	record(t, F_MALLOC_MANAGED, NULL, rc);
	if (rc == cudaSuccess) {
		t->managed_bytes += size;
		t->malloc_bytes += size;
	}
	return rc == cudaSuccess ? p : NULL;
}

/* size is what p was allocated with; freeing NULL frees nothing. */
static void dev_free(struct tally *t, void *p, size_t size, int async, cudaStream_t s)
{
	cudaError_t rc = async == 2 ? CUDA(cudaFreeAsync_ptsz)(p, s)
			 : async    ? CUDA(cudaFreeAsync)(p, s)
				    : CUDA(cudaFree)(p);
	record(t, async == 2 ? F_FREE_ASYNC_PTSZ : async ? F_FREE_ASYNC : F_FREE, s, rc);
	if (rc == cudaSuccess && p)
		t->free_bytes += size;
}

/* Pitched allocations (cudaMallocPitch, cudaMalloc3D: the size is the
 * pitch the runtime writes back x the rows) and one from a pool on stream
 * s, each freed with cudaFree (of NULL when it failed). */
static void pitched_pool_malloc_free(struct tally *t, long i, cudaStream_t s)
{
	void *p = NULL;
	size_t pitch = 0, h = (size_t)(1 + i % 4), size = 0;
	cudaError_t rc = CUDA(cudaMallocPitch)(&p, &pitch, 200 + 100 * (size_t)(i % 5), h);

	record(t, F_MALLOC_PITCH, NULL, rc);
	if (rc == cudaSuccess)
		t->malloc_bytes += size = pitch * h;
	dev_free(t, rc == cudaSuccess ? p : NULL, size, 0, NULL);

	struct cudaPitchedPtr pp = {0};
	struct cudaExtent e = {.width = 96 + 32 * (size_t)(i % 3), .height = 2 + (size_t)(i % 3),
			       .depth = 1 + (size_t)(i % 2)};
	rc = CUDA(cudaMalloc3D)(&pp, e);
	record(t, F_MALLOC_3D, NULL, rc);
	size = 0;
	if (rc == cudaSuccess)
		t->malloc_bytes += size = pp.pitch * e.height * e.depth;
	dev_free(t, rc == cudaSuccess ? pp.ptr : NULL, size, 0, NULL);

	p = NULL, size = 4096 + 64 * (size_t)(i % 7);
	rc = CUDA(cudaMallocFromPoolAsync)(&p, size, (cudaMemPool_t)(uintptr_t)0x9100, s);
	record(t, F_MALLOC_FROM_POOL, s, rc);
	if (rc == cudaSuccess)
		t->malloc_bytes += size;
	dev_free(t, rc == cudaSuccess ? p : NULL, rc == cudaSuccess ? size : 0, 0, NULL);
}

/* From a pool on the per-thread stream variant, freed the same way
 * (cudaFreeAsync_ptsz, of NULL when it failed). */
static void pool_malloc_free_ptsz(struct tally *t, size_t size, cudaStream_t s)
{
	void *p = NULL;
	cudaError_t rc = CUDA(cudaMallocFromPoolAsync_ptsz)(&p, size, (cudaMemPool_t)(uintptr_t)0x9200, s);

	record(t, F_MALLOC_FROM_POOL_PTSZ, s, rc);
	if (rc == cudaSuccess)
		t->malloc_bytes += size;
	dev_free(t, rc == cudaSuccess ? p : NULL, rc == cudaSuccess ? size : 0, 2, s);
}

static void host_alloc_free(struct tally *t, size_t size)
{
	void *p = NULL;
	cudaError_t rc = CUDA(cudaMallocHost)(&p, size);
	record(t, F_MALLOC_HOST, NULL, rc);
	if (rc == cudaSuccess)
		t->malloc_host_bytes += size;
	record(t, F_FREE_HOST, NULL, CUDA(cudaFreeHost)(rc == cudaSuccess ? p : NULL));
}

static void tally_copy(struct tally *t, int kind, size_t bytes, cudaError_t rc)
{
	int k = kind >= 0 && kind <= 4 ? kind : 5;
	t->memcpy_calls[k]++;
	if (rc == cudaSuccess && k < 5)
		t->memcpy_bytes[k] += bytes;
}

/* f: F_MEMCPY, F_MEMCPY_ASYNC, F_MEMCPY_ASYNC_PTSZ or F_MEMCPY_PTDS (s
 * ignored for the synchronous ones). */
static void copy(struct tally *t, int f, void *dst, const void *src, size_t count,
		 int kind, cudaStream_t s)
{
	cudaError_t rc = f == F_MEMCPY	       ? CUDA(cudaMemcpy)(dst, src, count, kind)
			 : f == F_MEMCPY_PTDS  ? CUDA(cudaMemcpy_ptds)(dst, src, count, kind)
			 : f == F_MEMCPY_ASYNC ? CUDA(cudaMemcpyAsync)(dst, src, count, kind, s)
					       : CUDA(cudaMemcpyAsync_ptsz)(dst, src, count, kind, s);
	record(t, f, s, rc);
	tally_copy(t, kind, count, rc);
}

/* f: F_MEMCPY_2D, F_MEMCPY_2D_ASYNC, F_MEMCPY_2D_PTDS or F_MEMCPY_2D_ASYNC_PTSZ. */
static void copy_2d(struct tally *t, int f, void *dst, size_t dpitch, const void *src,
		    size_t spitch, size_t width, size_t height, int kind, cudaStream_t s)
{
	cudaError_t rc;
	switch (f) {
	case F_MEMCPY_2D_ASYNC:
		rc = CUDA(cudaMemcpy2DAsync)(dst, dpitch, src, spitch, width, height, kind, s);
		break;
	case F_MEMCPY_2D_PTDS:
		rc = CUDA(cudaMemcpy2D_ptds)(dst, dpitch, src, spitch, width, height, kind);
		break;
	case F_MEMCPY_2D_ASYNC_PTSZ:
		rc = CUDA(cudaMemcpy2DAsync_ptsz)(dst, dpitch, src, spitch, width, height, kind, s);
		break;
	default:
		rc = CUDA(cudaMemcpy2D)(dst, dpitch, src, spitch, width, height, kind);
	}
	record(t, f, s, rc);
	tally_copy(t, kind, width * height, rc);
}

/* f: one of the F_MEMCPY_3D* copies between linear buffers; width is in
 * bytes, the pitches only space the rows (never counted). Peer copies
 * count as p2p, the others under kind. */
static void copy_3d(struct tally *t, int f, void *dst, const void *src, size_t width,
		    size_t height, size_t depth, int kind, cudaStream_t s)
{
	struct cudaMemcpy3DParms p = {
		.srcPtr = {(void *)src, width + 64, width, height},
		.dstPtr = {dst, width + 128, width, height},
		.extent = {width, height, depth},
		.kind = kind,
	};
	struct cudaMemcpy3DPeerParms pp = {
		.srcPtr = p.srcPtr, .srcDevice = 0, .dstPtr = p.dstPtr, .dstDevice = 1,
		.extent = p.extent,
	};
	size_t bytes = width * height * depth;
	cudaError_t rc;
	switch (f) {
	case F_MEMCPY_3D_ASYNC:
		rc = CUDA(cudaMemcpy3DAsync)(&p, s);
		break;
	case F_MEMCPY_3D_PTDS:
		rc = CUDA(cudaMemcpy3D_ptds)(&p);
		break;
	case F_MEMCPY_3D_ASYNC_PTSZ:
		rc = CUDA(cudaMemcpy3DAsync_ptsz)(&p, s);
		break;
	case F_MEMCPY_3D_PEER:
		rc = CUDA(cudaMemcpy3DPeer)(&pp);
		break;
	case F_MEMCPY_3D_PEER_ASYNC:
		rc = CUDA(cudaMemcpy3DPeerAsync)(&pp, s);
		break;
	case F_MEMCPY_3D_PEER_PTDS:
		rc = CUDA(cudaMemcpy3DPeer_ptds)(&pp);
		break;
	case F_MEMCPY_3D_PEER_ASYNC_PTSZ:
		rc = CUDA(cudaMemcpy3DPeerAsync_ptsz)(&pp, s);
		break;
	default:
		rc = CUDA(cudaMemcpy3D)(&p);
	}
	record(t, f, s, rc);
	if (f == F_MEMCPY_3D_PEER || f == F_MEMCPY_3D_PEER_ASYNC || f == F_MEMCPY_3D_PEER_PTDS ||
	    f == F_MEMCPY_3D_PEER_ASYNC_PTSZ) {
		t->p2p_calls++;
		if (rc == cudaSuccess)
			t->p2p_bytes += bytes;
	} else {
		tally_copy(t, kind, bytes, rc);
	}
}

/* The host-side address of a __device__ variable: the symbol the copies
 * below name (the stub only checks that it is not NULL). */
static char dev_symbol[1 << 16];

/* f: one of the F_*_SYMBOL* copies: count bytes at offset into (To) or out
 * of (From) dev_symbol, in kind's direction. */
static void copy_symbol(struct tally *t, int f, void *host, size_t count, size_t offset,
			int kind, cudaStream_t s)
{
	cudaError_t rc;
	switch (f) {
	case F_TO_SYMBOL:
		rc = CUDA(cudaMemcpyToSymbol)(dev_symbol, host, count, offset, kind);
		break;
	case F_FROM_SYMBOL:
		rc = CUDA(cudaMemcpyFromSymbol)(host, dev_symbol, count, offset, kind);
		break;
	case F_TO_SYMBOL_ASYNC:
		rc = CUDA(cudaMemcpyToSymbolAsync)(dev_symbol, host, count, offset, kind, s);
		break;
	case F_FROM_SYMBOL_ASYNC:
		rc = CUDA(cudaMemcpyFromSymbolAsync)(host, dev_symbol, count, offset, kind, s);
		break;
	case F_TO_SYMBOL_PTDS:
		rc = CUDA(cudaMemcpyToSymbol_ptds)(dev_symbol, host, count, offset, kind);
		break;
	case F_FROM_SYMBOL_PTDS:
		rc = CUDA(cudaMemcpyFromSymbol_ptds)(host, dev_symbol, count, offset, kind);
		break;
	case F_TO_SYMBOL_ASYNC_PTSZ:
		rc = CUDA(cudaMemcpyToSymbolAsync_ptsz)(dev_symbol, host, count, offset, kind, s);
		break;
	default:
		rc = CUDA(cudaMemcpyFromSymbolAsync_ptsz)(host, dev_symbol, count, offset, kind, s);
	}
	record(t, f, s, rc);
	tally_copy(t, kind, count, rc);
}

static void copy_peer(struct tally *t, int async, void *dst, const void *src, size_t count,
		      cudaStream_t s)
{
	cudaError_t rc = async ? CUDA(cudaMemcpyPeerAsync)(dst, 1, src, 0, count, s)
			       : CUDA(cudaMemcpyPeer)(dst, 1, src, 0, count);
	record(t, async ? F_MEMCPY_PEER_ASYNC : F_MEMCPY_PEER, s, rc);
	t->p2p_calls++;
	if (rc == cudaSuccess)
		t->p2p_bytes += count;
}

/* f: F_MEMSET, F_MEMSET_ASYNC, F_MEMSET_PTDS or F_MEMSET_ASYNC_PTSZ; the
 * synchronous ones get s = NULL (their bytes count on the default stream). */
static void set_mem(struct tally *t, int f, void *p, size_t count, cudaStream_t s)
{
	cudaError_t rc = f == F_MEMSET_ASYNC	    ? CUDA(cudaMemsetAsync)(p, 0, count, s)
			 : f == F_MEMSET_ASYNC_PTSZ ? CUDA(cudaMemsetAsync_ptsz)(p, 0, count, s)
			 : f == F_MEMSET_PTDS	    ? CUDA(cudaMemset_ptds)(p, 0, count)
						    : CUDA(cudaMemset)(p, 0, count);
	record(t, f, s, rc);
	if (rc == cudaSuccess)
		stream_row(t, (uintptr_t)s)->memset_bytes += count;
}

/* f: one of the F_MEMSET_2D* sets: width bytes in each of height rows
 * pitch apart; the synchronous ones get s = NULL. */
static void set_mem_2d(struct tally *t, int f, void *p, size_t pitch, size_t width,
		       size_t height, cudaStream_t s)
{
	cudaError_t rc = f == F_MEMSET_2D_ASYNC ? CUDA(cudaMemset2DAsync)(p, pitch, 0, width, height, s)
			 : f == F_MEMSET_2D_ASYNC_PTSZ
				 ? CUDA(cudaMemset2DAsync_ptsz)(p, pitch, 0, width, height, s)
			 : f == F_MEMSET_2D_PTDS ? CUDA(cudaMemset2D_ptds)(p, pitch, 0, width, height)
						 : CUDA(cudaMemset2D)(p, pitch, 0, width, height);
	record(t, f, s, rc);
	if (rc == cudaSuccess)
		stream_row(t, (uintptr_t)s)->memset_bytes += width * height;
}

/* f: one of the F_MEMSET_3D* sets: width bytes in each of height x depth
 * rows pitch apart, the pointer and extent passed by value (the synchronous
 * ones get s = NULL). */
static void set_mem_3d(struct tally *t, int f, void *p, size_t pitch, size_t width,
		       size_t height, size_t depth, cudaStream_t s)
{
	struct cudaPitchedPtr pp = {.ptr = p, .pitch = pitch, .xsize = width, .ysize = height};
	struct cudaExtent e = {.width = width, .height = height, .depth = depth};
	cudaError_t rc = f == F_MEMSET_3D_ASYNC ? CUDA(cudaMemset3DAsync)(pp, 0, e, s)
			 : f == F_MEMSET_3D_ASYNC_PTSZ ? CUDA(cudaMemset3DAsync_ptsz)(pp, 0, e, s)
			 : f == F_MEMSET_3D_PTDS	 ? CUDA(cudaMemset3D_ptds)(pp, 0, e)
						 : CUDA(cudaMemset3D)(pp, 0, e);
	record(t, f, s, rc);
	if (rc == cudaSuccess)
		stream_row(t, (uintptr_t)s)->memset_bytes += width * height * depth;
}

/* NVTX (--nvtx), always through dlsym'd pointers: the library is opened
 * only when asked for, so default runs map no NVTX library at all. */
#define DECLARE_NVTX_PTR(name, ret, params) static ret(*x_##name) params;
PROFI_NVTX_FUNCS(DECLARE_NVTX_PTR)

/* The phase rules: see phase_name. */
static const struct {
	int phase;
	const char *subs[4];
} phase_rules[] = {
	{PH_PREFILL, {"prefill", "prompt", "encode"}}, {PH_DECODE, {"decode", "generate"}},
	{PH_ATTENTION, {"attention", "attn"}}, {PH_MLP, {"mlp", "ffn", "expert"}},
	{PH_NORM, {"norm", "embed"}},
};

/* The thread's open ranges over all domains, innermost last. Pushes and
 * pops are strictly LIFO across domains, so one stack is the truth whether
 * an agent keeps one per thread or one per thread and domain. */
#define MAX_RANGES 16
static _Thread_local struct range {
	nvtxDomainHandle_t domain; /* NULL: the default domain */
	int phase;		   /* the rule the name matches, else PH_OTHER */
} ranges[MAX_RANGES];
static _Thread_local int nranges;

static int current_phase(void)
{
	for (int i = nranges - 1; i >= 0; i--)
		if (ranges[i].phase != PH_OTHER)
			return ranges[i].phase;
	return nranges ? PH_OTHER : PH_NONE;
}

static void tally_launch(struct tally *t, int api, int kernel, uint64_t blocks,
			 uint64_t threads, uint64_t shared, cudaStream_t s, int rc)
{
	record(t, la_fn[api], s, rc);
	t->api_launches[api]++;
	t->api_grid[api] += blocks;
	t->api_block[api] += threads;
	t->api_shared[api] += shared;
	t->kernel_launches[kernel]++;
	t->phase_launches[current_phase()]++;
	if (api == LA_RT) {
		t->launches++;
		t->grid_blocks += blocks;
		t->block_threads += threads;
		t->shared_bytes += shared;
	}
}

/* A runtime launch of a registered kernel, or of NULL for K_NONE. */
static void launch(struct tally *t, int api, int kernel, dim3 grid, dim3 block,
		   void **args, size_t shared, cudaStream_t s)
{
	const void *func = kernel < NRT_KERNELS ? (const void *)kernel_fn[kernel] : NULL;
	cudaError_t rc;
	switch (api) {
	case LA_RT_PTSZ:
		rc = CUDA(cudaLaunchKernel_ptsz)(func, grid, block, args, shared, s);
		break;
	case LA_RT_COOP:
		rc = CUDA(cudaLaunchCooperativeKernel)(func, grid, block, args, shared, s);
		break;
	case LA_RT_COOP_PTSZ:
		rc = CUDA(cudaLaunchCooperativeKernel_ptsz)(func, grid, block, args, shared, s);
		break;
	case LA_RT_EXC: {
		cudaLaunchConfig_t c = {grid, block, shared, s, NULL, 0};
		rc = CUDA(cudaLaunchKernelExC)(&c, func, args);
		break;
	}
	case LA_RT_EXC_PTSZ: {
		cudaLaunchConfig_t c = {grid, block, shared, s, NULL, 0};
		rc = CUDA(cudaLaunchKernelExC_ptsz)(&c, func, args);
		break;
	}
	default:
		rc = CUDA(cudaLaunchKernel)(func, grid, block, args, shared, s);
	}
	tally_launch(t, api, kernel, (uint64_t)grid.x * grid.y * grid.z,
		     (uint64_t)block.x * block.y * block.z, shared, s, rc);
}

/* A driver launch of f, whose name is kernel_name[kernel]. */
static void cu_launch(struct tally *t, int api, CUfunction f, int kernel, dim3 grid,
		      dim3 block, unsigned shared, CUstream s, void **params)
{
	CUresult rc;
	switch (api) {
	case LA_CU_EX: {
		CUlaunchConfig c = {grid.x, grid.y, grid.z, block.x, block.y, block.z,
				    shared, s, NULL, 0};
		rc = CU(cuLaunchKernelEx)(&c, f, params, NULL);
		break;
	}
	case LA_CU_COOP:
		rc = CU(cuLaunchCooperativeKernel)(f, grid.x, grid.y, grid.z, block.x, block.y,
						   block.z, shared, s, params);
		break;
	default:
		rc = CU(cuLaunchKernel)(f, grid.x, grid.y, grid.z, block.x, block.y, block.z,
					shared, s, params, NULL);
	}
	tally_launch(t, api, kernel, (uint64_t)grid.x * grid.y * grid.z,
		     (uint64_t)block.x * block.y * block.z, shared, (cudaStream_t)s, rc);
}

static void graph_launch(struct tally *t, cudaGraphExec_t exec, cudaStream_t s)
{
	record(t, F_GRAPH_LAUNCH, s, CUDA(cudaGraphLaunch)(exec, s));
}

static void graph_launch_ptsz(struct tally *t, cudaGraphExec_t exec, cudaStream_t s)
{
	record(t, F_GRAPH_LAUNCH_PTSZ, s, CUDA(cudaGraphLaunch_ptsz)(exec, s));
}

/* A setup call that must succeed. */
static void must(struct tally *t, int f, CUresult rc)
{
	record(t, f, NULL, rc);
	if (rc != CUDA_SUCCESS) {
		fprintf(stderr, "workload: %s failed: %d\n", fn[f].name, rc);
		exit(1);
	}
}

/* Driver setup a Triton- or library-based server does once per thread:
 * fills f[0..2] for K_TRITON_ADD, K_TRITON_SOFTMAX and K_PAGED. */
static void driver_setup(struct tally *t, CUfunction f[3])
{
	CUmodule mod = NULL;
	CUlibrary lib = NULL;
	CUkernel k = NULL;

	must(t, F_CU_INIT, CU(cuInit)(0));
	must(t, F_CU_MODULE_LOAD, CU(cuModuleLoadData)(&mod, triton_image));
	must(t, F_CU_MODULE_GET_FUNCTION, CU(cuModuleGetFunction)(&f[0], mod, kernel_name[K_TRITON_ADD]));
	must(t, F_CU_MODULE_GET_FUNCTION, CU(cuModuleGetFunction)(&f[1], mod, kernel_name[K_TRITON_SOFTMAX]));
	must(t, F_CU_LIBRARY_LOAD, CU(cuLibraryLoadData)(&lib, library_image, NULL, NULL, 0, NULL, NULL, 0));
	must(t, F_CU_LIBRARY_GET_KERNEL, CU(cuLibraryGetKernel)(&k, lib, kernel_name[K_PAGED]));
	must(t, F_CU_KERNEL_GET_FUNCTION, CU(cuKernelGetFunction)(&f[2], k));
}

/* The rule phase of a range name (ASCII). */
static int name_phase(const char *name)
{
	char low[64];
	size_t n = strlen(name);
	if (n >= sizeof(low))
		die("range name too long");
	for (size_t i = 0; i <= n; i++)
		low[i] = name[i] >= 'A' && name[i] <= 'Z' ? name[i] - 'A' + 'a' : name[i];
	for (size_t r = 0; r < sizeof(phase_rules) / sizeof(phase_rules[0]); r++)
		for (int k = 0; k < 4 && phase_rules[r].subs[k]; k++)
			if (strstr(low, phase_rules[r].subs[k]))
				return phase_rules[r].phase;
	return PH_OTHER;
}

/* Open ranges of domain d: the level NVTX returns for the next push. */
static int domain_depth(nvtxDomainHandle_t d)
{
	int n = 0;
	for (int i = 0; i < nranges; i++)
		n += ranges[i].domain == d;
	return n;
}

/* Checks the library's answer, then records the range; the name is kept
 * ASCII here, whatever encoding the call passes. */
static void pushed(nvtxDomainHandle_t d, const char *name, int level)
{
	if (level != domain_depth(d) || nranges == MAX_RANGES)
		die("NVTX push returned an unexpected level");
	ranges[nranges++] = (struct range){d, name_phase(name)};
}

static void popped(nvtxDomainHandle_t d, int level)
{
	if (nranges == 0 || ranges[nranges - 1].domain != d) {
		if (level != -1 || domain_depth(d) != 0)
			die("NVTX pop with nothing open did not return -1");
		return;
	}
	nranges--;
	if (level != domain_depth(d))
		die("NVTX pop returned an unexpected level");
}

/* --nccl-lib: the group calls, dlsym'd (int: ncclResult_t). */
static int (*x_ncclGroupStart)(void), (*x_ncclGroupEnd)(void);

/* An empty group on this thread; both calls must succeed. */
static void nccl_group(struct tally *t)
{
	if (!x_ncclGroupEnd)
		return;
	if (x_ncclGroupStart() != 0 || x_ncclGroupEnd() != 0)
		die("empty NCCL group failed");
	t->nccl_groups++;
}

/* Copies ASCII name into a wide string of at most 64 characters. */
static const wchar_t *widen(wchar_t *buf, const char *name)
{
	size_t i;
	for (i = 0; name[i] && i < 63; i++)
		buf[i] = (wchar_t)name[i];
	buf[i] = 0;
	return buf;
}

static void push_a(struct tally *t, const char *name)
{
	t->nvtx_calls[N_PUSH_A]++;
	pushed(NULL, name, x_nvtxRangePushA(name));
}

static void push_w(struct tally *t, const char *name)
{
	wchar_t w[64];
	t->nvtx_calls[N_PUSH_W]++;
	pushed(NULL, name, x_nvtxRangePushW(widen(w, name)));
}

static void pop(struct tally *t)
{
	t->nvtx_calls[N_POP]++;
	popped(NULL, x_nvtxRangePop());
}

/* wide: the message as NVTX_MESSAGE_TYPE_UNICODE, else ASCII. */
static void domain_push(struct tally *t, nvtxDomainHandle_t d, const char *name, int wide)
{
	wchar_t w[64];
	nvtxEventAttributes_t a = {
		.version = NVTX_VERSION, .size = NVTX_EVENT_ATTRIB_STRUCT_SIZE,
		.colorType = NVTX_COLOR_ARGB, .color = 0xff76b900,
		.payloadType = NVTX_PAYLOAD_TYPE_UNSIGNED_INT64, .payload.ullValue = 42,
	};
	if (wide) {
		a.messageType = NVTX_MESSAGE_TYPE_UNICODE;
		a.message.unicode = widen(w, name);
	} else {
		a.messageType = NVTX_MESSAGE_TYPE_ASCII;
		a.message.ascii = name;
	}
	t->nvtx_calls[N_DOMAIN_PUSH_EX]++;
	pushed(d, name, x_nvtxDomainRangePushEx(d, &a));
}

static void domain_pop(struct tally *t, nvtxDomainHandle_t d)
{
	t->nvtx_calls[N_DOMAIN_POP]++;
	popped(d, x_nvtxDomainRangePop(d));
}

static nvtxDomainHandle_t domain_create(struct tally *t, const char *name)
{
	t->nvtx_calls[N_DOMAIN_CREATE]++;
	nvtxDomainHandle_t d = x_nvtxDomainCreateA(name);
	if (!d)
		die("nvtxDomainCreateA failed");
	return d;
}

/* One iteration's NVTX-annotated launches (runtime launches on stream s),
 * each commented with its phase: every rule, nesting where the innermost
 * range matches nothing, rule order deciding between two matches, wide and
 * domain ranges, a domain push on the default domain (NULL), and a pop with
 * nothing open. Twelve launches: "" 2, prefill 2, decode 2, attention 1,
 * mlp 2, norm 2, other 1. */
static void nvtx_ranges(struct tally *t, nvtxDomainHandle_t dom, int i, cudaStream_t s,
			void **args)
{
	dim3 grid = {i % 3 + 1, 1, 1}, block = {64, 1, 1};
	int k = i;
#define NVTX_LAUNCH()                                                                              \
	do {                                                                                       \
		nccl_group(t);                                                                     \
		launch(t, LA_RT, k++ % NRT_KERNELS, grid, block, args, 0, s);                      \
	} while (0)
	NVTX_LAUNCH(); /* "" */
	push_a(t, "Prefill");
	NVTX_LAUNCH(); /* prefill */
	push_a(t, "self_attention");
	NVTX_LAUNCH(); /* attention */
	pop(t);
	push_a(t, "misc_io");
	NVTX_LAUNCH(); /* prefill: the innermost range that matches */
	pop(t);
	pop(t);
	push_a(t, "decode_step");
	push_a(t, "MLP");
	NVTX_LAUNCH(); /* mlp */
	pop(t);
	push_a(t, "DecodeAttn");
	NVTX_LAUNCH(); /* decode: its rule comes before attention's */
	pop(t);
	pop(t);
	push_a(t, "misc");
	NVTX_LAUNCH(); /* other */
	pop(t);
	push_w(t, "RMSNorm");
	NVTX_LAUNCH(); /* norm */
	pop(t);
	domain_push(t, dom, "generate", 0);
	domain_push(t, dom, "Expert_FFN", 1);
	NVTX_LAUNCH(); /* mlp */
	domain_pop(t, dom);
	NVTX_LAUNCH(); /* decode */
	domain_pop(t, dom);
	domain_push(t, NULL, "embed_tokens", 0);
	NVTX_LAUNCH(); /* norm */
	domain_pop(t, NULL);
	pop(t); /* nothing open: returns -1 */
	NVTX_LAUNCH(); /* "" */
#undef NVTX_LAUNCH
}

/* A phase run with "run": its workers go on past --iters until main reads
 * "stop" (phase_stop, read after each iteration); main says "running" once
 * each has made its first iteration (phase_started). */
static int phase_until, phase_stop;
static pthread_barrier_t phase_started;

/* Whether a worker makes iteration i of the phase. */
static int phase_goes_on(int i)
{
	return i < opt.iters || (phase_until && !__atomic_load_n(&phase_stop, __ATOMIC_RELAXED));
}

struct worker {
	pthread_t tid;
	int id;
	struct tally t;
	/* --park: its kernel tid, clocks at its start and end (ns). */
	pid_t sys_tid;
	uint64_t wall_start, wall_end, cpu_start, cpu_parked;
};

/* --park: the workers of the last phase, waiting for release_parked(). */
static pthread_barrier_t parked;
static pthread_mutex_t park_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t park_cv = PTHREAD_COND_INITIALIZER;
static int park_released;
static struct worker *parked_w;
static int parked_n;

static uint64_t clock_ns(clockid_t c)
{
	struct timespec ts;
	if (clock_gettime(c, &ts))
		die("clock_gettime failed");
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* Lets the parked workers of the last phase exit, and joins them. */
static void release_parked(void)
{
	if (!parked_w)
		return;
	pthread_mutex_lock(&park_mu);
	park_released = 1;
	pthread_cond_broadcast(&park_cv);
	pthread_mutex_unlock(&park_mu);
	for (int i = 0; i < parked_n; i++)
		pthread_join(parked_w[i].tid, NULL);
	pthread_barrier_destroy(&parked);
	free(parked_w);
	parked_w = NULL;
	park_released = 0;
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	struct tally *t = &w->t;
	int ns = opt.streams + 1;
	cudaStream_t *s = calloc(ns, sizeof(*s)); /* s[0] = NULL: default stream */
	static char host[2][1 << 16]; /* never touched: the stub ignores buffers */
	void *bogus = (void *)(uintptr_t)0xdead0000; /* never allocated */
	cudaEvent_t event = (cudaEvent_t)(uintptr_t)(0xe0000000 + w->id * 0x10); /* fake */
	CUfunction drv_f[3] = {NULL, NULL, NULL};
	nvtxDomainHandle_t dom = opt.nvtx ? domain_create(t, "profi.workload") : NULL;

	w->sys_tid = (pid_t)syscall(SYS_gettid);
	w->wall_start = clock_ns(CLOCK_REALTIME);
	w->cpu_start = clock_ns(CLOCK_THREAD_CPUTIME_ID);
	if (!s)
		die("out of memory");
	for (int i = 1; i < ns; i++)
		if (CUDA(cudaStreamCreate)(&s[i]) != cudaSuccess)
			die("cudaStreamCreate failed");

	/* Resident "weights" and "KV cache", never freed: non-zero active memory. */
	void *weights = dev_malloc(t, 64 << 20, 0, NULL);
	void *kv = dev_malloc(t, 8 << 20, 1, s[ns - 1]);
	dev_free(t, NULL, 0, 0, NULL); /* legal no-op, as frameworks do */
	cudaGraphExec_t exec = NULL;
	if (have_graphs) {
		cudaGraph_t graph = (cudaGraph_t)(uintptr_t)(0x3000 + w->id * 0x10);
		record(t, F_GRAPH_INST, NULL, CUDA(cudaGraphInstantiate)(&exec, graph, 0));
	}
	if (opt.driver)
		driver_setup(t, drv_f);

	int n = 1024;
	void *args[] = {&weights, &kv, &n};
	for (int i = 0; phase_goes_on(i); i++) {
		/*
		 * The rejected runtime launch of the error paths comes first in
		 * its iteration. profi learns a rejection at the thread's next
		 * runtime launch, and once an op is handed over to the driver a
		 * rejection is not seen at all (ARCHITECTURE.md, "One trap per
		 * launch", limits): on every thread the rejection is learned
		 * before any of that thread's launches reaches the driver, so
		 * cudaLaunchKernel is refused before it could be handed over,
		 * whenever profi's handover runs.
		 */
		if (opt.errors && i % 10 == 0) {
			dim3 one = {1, 1, 1};
			launch(t, LA_RT, K_NONE, one, one, args, 0, s[i % ns]); /* 98 */
		}
		for (int j = 0; j < opt.launches; j++) {
			int k = i + j;
			dim3 grid = {k % 7 + 1, 2, 1}, block = {32 * (k % 4 + 1), 2, 1};
			launch(t, LA_RT, k % NRT_KERNELS, grid, block, args, (k % 3) * 1024,
			       s[k % ns]);
		}
		for (int kind = 0; kind <= 4; kind++) {
			/* Host or device side per kind; the stub never looks. */
			void *dst = kind == 0 || kind == 2 ? host[0] : weights;
			void *src = kind == 2 || kind == 3 ? kv : host[1];
			for (int m = 0; m < opt.memcpys; m++) {
				size_t count = 4096 * (kind + 1) + 256 * ((i + m) % 8);
				copy(t, F_MEMCPY, dst, src, count, kind, NULL);
				copy(t, F_MEMCPY_ASYNC, dst, src, count / 2, kind, s[(i + m + kind) % ns]);
			}
		}
		for (int m = 0; m < opt.mallocs; m++) {
			size_t size = (size_t)((i + m) % 4 + 1) << 20;
			cudaStream_t st = s[(i + m) % ns];
			dev_free(t, dev_malloc(t, size, 0, NULL), size, 0, NULL);
			dev_free(t, dev_malloc(t, size / 2, 1, st), size / 2, 1, st);
		}
		for (int g = 0; g < opt.graphs && have_graphs; g++)
			graph_launch(t, exec, s[(i + g) % ns]);

		/* Driver launches cycle over the three APIs; the paged attention
		 * kernel only through cuLaunchKernel. */
		for (int j = 0; j < opt.driver; j++) {
			int k = i + j, api = LA_CU + k % 3;
			int kern = K_TRITON_ADD + (k / 3) % (api == LA_CU ? 3 : 2);
			dim3 grid = {k % 5 + 1, k % 3 + 1, 1}, block = {64 * (k % 2 + 1), 2, 1};
			cu_launch(t, api, drv_f[kern - K_TRITON_ADD], kern, grid, block,
				  (k % 4) * 512, (CUstream)s[(i + 2 * j + 1) % ns], args);
		}

		if (opt.extra) {
			cudaStream_t s1 = s[i % ns], s2 = s[(i + 1) % ns], s3 = s[(i + 2) % ns];
			dim3 grid = {i % 3 + 1, i % 2 + 1, 1}, block = {128, i % 4 + 1, 1};
			launch(t, LA_RT_PTSZ, i % NRT_KERNELS, grid, block, args, 256 * (i % 2), s1);
			launch(t, LA_RT_EXC, (i + 1) % NRT_KERNELS, grid, block, args, 512, s2);
			launch(t, LA_RT_COOP, (i + 2) % NRT_KERNELS, grid, block, args, 0, s3);
			copy(t, F_MEMCPY_ASYNC_PTSZ, weights, host[1], 2048 + 128 * (i % 4), i % 5, s3);
			copy_peer(t, 0, weights, kv, (1 << 16) + 64 * (i % 8), NULL);
			copy_peer(t, 1, weights, kv, 1 << 15, s2);
			copy_2d(t, F_MEMCPY_2D, weights, 512, host[1], 512, 256 + 32 * (i % 4),
				4 + i % 3, (i + 1) % 5, NULL);
			copy_2d(t, F_MEMCPY_2D_ASYNC, host[0], 1024, kv, 512, 384, 2 + i % 5,
				(i + 2) % 5, s1);
			/* 3D copies: one direction and stream each (their series
			 * stay within the process's share of the maps in full mode). */
			copy_3d(t, F_MEMCPY_3D, weights, host[1], 96 + 32 * (i % 3), 3 + i % 4,
				2 + i % 3, cudaMemcpyHostToDevice, NULL);
			copy_3d(t, F_MEMCPY_3D_ASYNC, host[0], kv, 160, 2 + i % 3, 1 + i % 5,
				cudaMemcpyDeviceToHost, s[0]);
			copy_3d(t, F_MEMCPY_3D_PEER, weights, kv, 256 + 16 * (i % 4), 5, 1 + i % 2,
				cudaMemcpyDeviceToDevice, NULL);
			copy_3d(t, F_MEMCPY_3D_PEER_ASYNC, weights, kv, 64, 4 + i % 3, 3,
				cudaMemcpyDeviceToDevice, s[0]);
			copy_symbol(t, F_TO_SYMBOL, host[1], 256 + 64 * (i % 4), 128 * (i % 3),
				    cudaMemcpyHostToDevice, NULL);
			copy_symbol(t, F_FROM_SYMBOL, host[0], 512 + 8 * (i % 5), 0,
				    cudaMemcpyDeviceToHost, NULL);
			copy_symbol(t, F_TO_SYMBOL_ASYNC, host[1], 1024, 64 * (i % 2),
				    cudaMemcpyHostToDevice, s[0]);
			copy_symbol(t, F_FROM_SYMBOL_ASYNC, host[0], 96 + 32 * (i % 3), 16,
				    cudaMemcpyDeviceToHost, s[0]);
			size_t msize = (size_t)(i % 3 + 1) << 16;
			dev_free(t, managed_malloc(t, msize), msize, 0, NULL);
			pitched_pool_malloc_free(t, i, s[0]);
			host_alloc_free(t, (size_t)(i % 2 + 1) << 12);
			set_mem(t, F_MEMSET, weights, 4096 * (i % 3 + 1), NULL);
			set_mem(t, F_MEMSET_ASYNC, kv, 1024 * (i % 5 + 1), s2);
			set_mem_2d(t, F_MEMSET_2D, weights, 1024, 512 + 64 * (i % 4), 3 + i % 3, NULL);
			set_mem_2d(t, F_MEMSET_2D_ASYNC, kv, 256, 200, 1 + i % 7, s[0]);
			set_mem_3d(t, F_MEMSET_3D, weights, 512, 384 + 32 * (i % 3), 2 + i % 3, 1 + i % 4,
				   NULL);
			set_mem_3d(t, F_MEMSET_3D_ASYNC, kv, 256, 96, 3, 2 + i % 5, s[0]);
			record(t, F_STREAM_SYNC, s1, CUDA(cudaStreamSynchronize)(s1));
			record(t, F_EVENT_SYNC, NULL, CUDA(cudaEventSynchronize)(event));
			record(t, F_DEVICE_SYNC, NULL, CUDA(cudaDeviceSynchronize)());
			record(t, F_SET_DEVICE, NULL, CUDA(cudaSetDevice)(w->id % 2));
			t->set_device_calls++;
			int dev = -1;
			record(t, F_GET_DEVICE, NULL, CUDA(cudaGetDevice)(&dev));
			if (dev != w->id % 2)
				die("cudaGetDevice does not return the thread's device");
		}

		/* Each per-thread default stream variant once, on streams and
		 * sizes of its own. */
		if (opt.ptsz) {
			cudaStream_t p1 = s[(i + 1) % ns], p2 = s[(i + 2) % ns], p3 = s[i % ns];
			dim3 grid = {i % 4 + 1, 1, i % 2 + 1}, block = {64, i % 3 + 1, 2};
			copy(t, F_MEMCPY_PTDS, weights, host[1], 1024 + 64 * (i % 8), (i + 3) % 5, NULL);
			copy_2d(t, F_MEMCPY_2D_PTDS, host[0], 256, kv, 256, 128 + 16 * (i % 4),
				2 + i % 3, (i + 4) % 5, NULL);
			copy_2d(t, F_MEMCPY_2D_ASYNC_PTSZ, weights, 1024, kv, 1024, 256, 1 + i % 4,
				i % 5, p1);
			copy_3d(t, F_MEMCPY_3D_PTDS, kv, host[1], 48 + 16 * (i % 5), 2 + i % 2, 3,
				cudaMemcpyDeviceToDevice, NULL);
			copy_3d(t, F_MEMCPY_3D_ASYNC_PTSZ, host[0], weights, 200, 1 + i % 4, 2 + i % 2,
				cudaMemcpyDefault, s[0]);
			copy_3d(t, F_MEMCPY_3D_PEER_PTDS, weights, kv, 128, 3 + i % 5, 2,
				cudaMemcpyDeviceToDevice, NULL);
			copy_3d(t, F_MEMCPY_3D_PEER_ASYNC_PTSZ, kv, weights, 72 + 8 * (i % 3), 2, 2 + i % 4,
				cudaMemcpyDeviceToDevice, s[0]);
			copy_symbol(t, F_TO_SYMBOL_PTDS, host[1], 192 + 16 * (i % 6), 0,
				    cudaMemcpyHostToDevice, NULL);
			copy_symbol(t, F_FROM_SYMBOL_PTDS, host[0], 640, 32 * (i % 4),
				    cudaMemcpyDeviceToHost, NULL);
			copy_symbol(t, F_TO_SYMBOL_ASYNC_PTSZ, host[1], 48 * (i % 5 + 1), 8,
				    cudaMemcpyHostToDevice, s[0]);
			copy_symbol(t, F_FROM_SYMBOL_ASYNC_PTSZ, host[0], 4096, 0,
				    cudaMemcpyDeviceToHost, s[0]);
			set_mem(t, F_MEMSET_PTDS, weights, 2048 * (i % 2 + 1), NULL);
			set_mem(t, F_MEMSET_ASYNC_PTSZ, kv, 512 * (i % 3 + 1), p2);
			set_mem_2d(t, F_MEMSET_2D_PTDS, kv, 512, 300 + 20 * (i % 5), 2 + i % 4, NULL);
			set_mem_2d(t, F_MEMSET_2D_ASYNC_PTSZ, weights, 128, 128, 4 + i % 2, s[0]);
			set_mem_3d(t, F_MEMSET_3D_PTDS, kv, 256, 160 + 16 * (i % 4), 2, 1 + i % 3, NULL);
			set_mem_3d(t, F_MEMSET_3D_ASYNC_PTSZ, weights, 64, 64, 1 + i % 3, 3, s[0]);
			record(t, F_STREAM_SYNC_PTSZ, p3, CUDA(cudaStreamSynchronize_ptsz)(p3));
			if (have_graphs && have_graph_ptsz)
				graph_launch_ptsz(t, exec, p1);
			size_t asize = (size_t)(i % 4 + 1) << 14;
			dev_free(t, dev_malloc(t, asize, 2, p2), asize, 2, p2);
			pool_malloc_free_ptsz(t, asize / 2, p2);
			launch(t, LA_RT_EXC_PTSZ, (i + 3) % NRT_KERNELS, grid, block, args, 256, p3);
			launch(t, LA_RT_COOP_PTSZ, i % NRT_KERNELS, grid, block, args,
			       128 * (i % 3), p1);
		}

		if (opt.nvtx)
			nvtx_ranges(t, dom, i, s[i % ns], args);

		if (opt.errors && i % 10 == 0) {
			/* Deterministic failures, one per error path of the stub. */
			cudaStream_t st = s[i % ns];
			dim3 one = {1, 1, 1};
			dev_malloc(t, 1ULL << 41, 0, NULL);        /* 2 */
			dev_malloc(t, 0, 1, st);                    /* 2 */
			copy(t, F_MEMCPY, host[0], host[1], 64, 7, NULL);   /* 21 */
			copy(t, F_MEMCPY_ASYNC, host[0], host[1], 64, 9, st); /* 21 */
			dev_free(t, bogus, 0, 0, NULL);             /* 1 */
			dev_free(t, bogus, 0, 1, st);               /* 1 */
			if (have_graphs)
				graph_launch(t, NULL, st);          /* 400 */
			if (opt.driver)
				cu_launch(t, LA_CU, NULL, K_NONE, one, one, 0, (CUstream)st, args); /* 500 */
			if (opt.extra) {
				record(t, F_SET_DEVICE, NULL, CUDA(cudaSetDevice)(7)); /* 101 */
				t->set_device_calls++;
			}
			if (opt.ptsz) {
				copy(t, F_MEMCPY_PTDS, host[0], host[1], 64, 7, NULL); /* 21 */
				if (have_graphs && have_graph_ptsz)
					graph_launch_ptsz(t, NULL, st); /* 400 */
			}
		}
		if (phase_until && i == 0)
			pthread_barrier_wait(&phase_started);
		if (opt.pause_us)
			usleep(opt.pause_us);
		if (opt.spin_us) { /* on the CPU between launches, as an interpreter is */
			uint64_t until = clock_ns(CLOCK_MONOTONIC) + (uint64_t)opt.spin_us * 1000;
			while (clock_ns(CLOCK_MONOTONIC) < until)
				;
		}
	}
	free(s);
	w->wall_end = clock_ns(CLOCK_REALTIME);
	if (opt.park) {
		pthread_barrier_wait(&parked);
		pthread_mutex_lock(&park_mu);
		while (!park_released)
			pthread_cond_wait(&park_cv, &park_mu);
		pthread_mutex_unlock(&park_mu);
	}
	return NULL;
}

static void merge(struct tally *dst, const struct tally *src)
{
	for (int f = 0; f < NFN; f++) {
		dst->calls[f] += src->calls[f];
		for (int c = 0; c < MAX_CODES && src->err[f][c].n; c++)
			add_err(dst, f, src->err[f][c].code, src->err[f][c].n);
		for (size_t i = 0; i < src->nstreams; i++)
			if (src->streams[i].n[f])
				add_stream(dst, src->streams[i].handle, f, src->streams[i].n[f]);
	}
	for (size_t i = 0; i < src->nstreams; i++)
		if (src->streams[i].memset_bytes)
			stream_row(dst, src->streams[i].handle)->memset_bytes += src->streams[i].memset_bytes;
	for (int k = 0; k < 6; k++) {
		dst->memcpy_calls[k] += src->memcpy_calls[k];
		if (k < 5)
			dst->memcpy_bytes[k] += src->memcpy_bytes[k];
	}
	dst->p2p_bytes += src->p2p_bytes;
	dst->p2p_calls += src->p2p_calls;
	dst->malloc_bytes += src->malloc_bytes;
	dst->free_bytes += src->free_bytes;
	dst->managed_bytes += src->managed_bytes;
	dst->malloc_host_bytes += src->malloc_host_bytes;
	dst->launches += src->launches;
	dst->grid_blocks += src->grid_blocks;
	dst->block_threads += src->block_threads;
	dst->shared_bytes += src->shared_bytes;
	for (int a = 0; a < NLA; a++) {
		dst->api_launches[a] += src->api_launches[a];
		dst->api_grid[a] += src->api_grid[a];
		dst->api_block[a] += src->api_block[a];
		dst->api_shared[a] += src->api_shared[a];
	}
	for (int k = 0; k < NKERN; k++)
		dst->kernel_launches[k] += src->kernel_launches[k];
	dst->set_device_calls += src->set_device_calls;
	for (int p = 0; p < NPHASE; p++)
		dst->phase_launches[p] += src->phase_launches[p];
	for (int n = 0; n < NNVTX; n++)
		dst->nvtx_calls[n] += src->nvtx_calls[n];
	dst->nccl_groups += src->nccl_groups;
}

static void print_stream_key(int first, uintptr_t handle, uint64_t n)
{
	if (handle)
		printf("%s\"%#" PRIxPTR "\":%" PRIu64, first ? "" : ",", handle, n);
	else
		printf("%s\"default\":%" PRIu64, first ? "" : ",", n);
}

/* A group's functions are listed (0 included) only when its flag is on, so
 * the default output keeps exactly its old keys. */
static int fn_listed(int f)
{
	return fn[f].group == G_CORE || (fn[f].group == G_EXTRA && opt.extra) ||
	       (fn[f].group == G_DRIVER && opt.driver) || (fn[f].group == G_PTSZ && opt.ptsz);
}

static void print_truth(const struct tally *t)
{
	printf("{\"pid\":%d,\"calls\":{", (int)getpid());
	for (int f = 0, first = 1; f < NFN; f++) {
		if (!fn_listed(f))
			continue;
		printf("%s\"%s\":%" PRIu64, first ? "" : ",", fn[f].name, t->calls[f]);
		first = 0;
	}
	printf("},\"calls_by_stream\":{");
	for (int f = 0, first = 1; f < NFN; f++) {
		if (!fn[f].has_stream || !t->calls[f])
			continue;
		printf("%s\"%s\":{", first ? "" : ",", fn[f].name);
		first = 0;
		for (size_t i = 0, sfirst = 1; i < t->nstreams; i++) {
			const struct stream_row *r = &t->streams[i];
			if (!r->n[f])
				continue;
			print_stream_key(sfirst, r->handle, r->n[f]);
			sfirst = 0;
		}
		printf("}");
	}
	printf("},\"errors\":{");
	for (int f = 0, first = 1; f < NFN; f++) {
		if (!t->err[f][0].n)
			continue;
		printf("%s\"%s\":{", first ? "" : ",", fn[f].name);
		first = 0;
		for (int c = 0; c < MAX_CODES && t->err[f][c].n; c++)
			printf("%s\"%d\":%" PRIu64, c ? "," : "", t->err[f][c].code, t->err[f][c].n);
		printf("}");
	}
	printf("},\"memcpy_bytes\":{");
	for (int k = 0; k < 5; k++)
		printf("%s\"%s\":%" PRIu64, k ? "," : "", kind_name[k], t->memcpy_bytes[k]);
	if (opt.extra || opt.ptsz)
		printf(",\"p2p\":%" PRIu64, t->p2p_bytes);
	printf("},\"memcpy_calls\":{");
	for (int k = 0; k < 6; k++)
		printf("%s\"%s\":%" PRIu64, k ? "," : "", kind_name[k], t->memcpy_calls[k]);
	if (opt.extra || opt.ptsz)
		printf(",\"p2p\":%" PRIu64, t->p2p_calls);
	printf("},\"malloc_bytes\":%" PRIu64 ",\"free_bytes\":%" PRIu64
	       ",\"active_bytes\":%" PRIu64 ",\"launches\":%" PRIu64
	       ",\"launch_grid_blocks\":%" PRIu64 ",\"launch_block_threads\":%" PRIu64
	       ",\"launch_shared_bytes\":%" PRIu64,
	       t->malloc_bytes, t->free_bytes, t->malloc_bytes - t->free_bytes,
	       t->launches, t->grid_blocks, t->block_threads, t->shared_bytes);
	printf(",\"launches_by_api\":{");
	for (int a = 0; a < NLA; a++)
		printf("%s\"%s\":%" PRIu64, a ? "," : "", fn[la_fn[a]].name, t->api_launches[a]);
	printf("},\"launches_by_kernel\":{");
	for (int k = 0, first = 1; k < NKERN; k++) {
		if (!t->kernel_launches[k])
			continue;
		printf("%s\"%s\":%" PRIu64, first ? "" : ",", kernel_name[k], t->kernel_launches[k]);
		first = 0;
	}
	printf("},\"launch_geometry_by_api\":{");
	for (int a = 0; a < NLA; a++)
		printf("%s\"%s\":{\"grid_blocks\":%" PRIu64 ",\"block_threads\":%" PRIu64
		       ",\"shared_bytes\":%" PRIu64 "}",
		       a ? "," : "", fn[la_fn[a]].name, t->api_grid[a], t->api_block[a], t->api_shared[a]);
	printf("},\"memset_bytes\":{");
	for (size_t i = 0, first = 1; i < t->nstreams; i++) {
		if (!t->streams[i].memset_bytes)
			continue;
		print_stream_key(first, t->streams[i].handle, t->streams[i].memset_bytes);
		first = 0;
	}
	printf("},\"malloc_host_bytes\":%" PRIu64 ",\"managed_bytes\":%" PRIu64
	       ",\"set_device_calls\":%" PRIu64,
	       t->malloc_host_bytes, t->managed_bytes, t->set_device_calls);
	if (opt.nvtx) {
		printf(",\"launches_by_phase\":{");
		for (int p = 0; p < NPHASE; p++)
			printf("%s\"%s\":%" PRIu64, p ? "," : "", phase_name[p],
			       t->phase_launches[p]);
		printf("},\"nvtx_calls\":{");
		for (int n = 0; n < NNVTX; n++)
			printf("%s\"%s\":%" PRIu64, n ? "," : "", nvtx_name[n], t->nvtx_calls[n]);
		printf("}");
		if (opt.nccl_lib)
			printf(",\"nccl_calls\":{\"ncclGroupStart\":%" PRIu64
			       ",\"ncclGroupEnd\":%" PRIu64 "}",
			       t->nccl_groups, t->nccl_groups);
	}
	if (parked_w) {
		printf(",\"threads\":[");
		for (int i = 0; i < parked_n; i++) {
			const struct worker *w = &parked_w[i];
			printf("%s{\"tid\":%d,\"cpu_start_ns\":%" PRIu64 ",\"cpu_ns\":%" PRIu64
			       ",\"wall_start_ns\":%" PRIu64 ",\"wall_end_ns\":%" PRIu64 "}",
			       i ? "," : "", (int)w->sys_tid, w->cpu_start, w->cpu_parked,
			       w->wall_start, w->wall_end);
		}
		printf("]");
	}
	printf("}\n");
	fflush(stdout);
}

static void run_phase(int until)
{
	struct worker *w = calloc(opt.threads + 1, sizeof(*w)); /* +1: never calloc(0) */
	if (!w)
		die("out of memory");
	phase_until = until;
	phase_stop = 0;
	if (opt.park && pthread_barrier_init(&parked, NULL, (unsigned)opt.threads + 1))
		die("pthread_barrier_init failed");
	if (until && pthread_barrier_init(&phase_started, NULL, (unsigned)opt.threads + 1))
		die("pthread_barrier_init failed");
	for (int i = 0; i < opt.threads; i++) {
		w[i].id = i;
		if (pthread_create(&w[i].tid, NULL, worker_main, &w[i]))
			die("pthread_create failed");
	}
	if (until) {
		char line[64];
		pthread_barrier_wait(&phase_started);
		printf("running\n");
		fflush(stdout);
		if (fgets(line, sizeof(line), stdin) && strncmp(line, "stop", 4) && strncmp(line, "exit", 4))
			die("running: want \"stop\"");
		__atomic_store_n(&phase_stop, 1, __ATOMIC_RELAXED);
	}
	if (opt.park) {
		/* Done with their tallies; their CPU clocks stop once parked. */
		pthread_barrier_wait(&parked);
		for (int i = 0; i < opt.threads; i++) {
			clockid_t c;
			if (pthread_getcpuclockid(w[i].tid, &c))
				die("pthread_getcpuclockid failed");
			merge(&total, &w[i].t);
			free(w[i].t.streams);
			w[i].t.streams = NULL;
			/* Past the barrier it still runs until it sleeps in its
			 * condition wait: read until its clock stands still. */
			uint64_t prev = clock_ns(c);
			for (;;) {
				usleep(2000);
				w[i].cpu_parked = clock_ns(c);
				if (w[i].cpu_parked == prev)
					break;
				prev = w[i].cpu_parked;
			}
		}
		parked_w = w;
		parked_n = opt.threads;
	} else {
		for (int i = 0; i < opt.threads; i++) {
			pthread_join(w[i].tid, NULL);
			merge(&total, &w[i].t);
			free(w[i].t.streams);
		}
		free(w);
	}
	if (until)
		pthread_barrier_destroy(&phase_started);
	print_truth(&total);
}

static void *resolve(void *h, const char *lib, const char *name, int required)
{
	void *p = dlsym(h, name);
	if (!p && required) {
		fprintf(stderr, "workload: dlsym %s in %s: %s\n", name, lib, dlerror());
		exit(1);
	}
	return p;
}

static void *open_lib(const char *path, int flags)
{
	void *h = dlopen(path, flags);
	if (!h) {
		fprintf(stderr, "workload: dlopen %s: %s\n", path, dlerror());
		exit(1);
	}
	return h;
}

static void load_driver(const char *path, int flags)
{
	void *h = open_lib(path, flags);
#define RESOLVE_CU(name, params) *(void **)&d_##name = resolve(h, path, #name, 1);
	PROFI_CU_FUNCS(RESOLVE_CU)
#undef RESOLVE_CU
}

/* What nvcc's generated host code does in a static constructor: one fat
 * binary, one registration per kernel, unregistered at exit. */
#ifdef PROFI_DLOPEN
#define REG(name) p_##name
#else
#define REG(name) name
#endif
static void **fatbin_handle;

static void unregister_kernels(void)
{
	REG(__cudaUnregisterFatBinary)(fatbin_handle);
}

static void register_kernels(void)
{
	fatbin_handle = REG(__cudaRegisterFatBinary)((void *)&fatbin_wrapper);
	for (int k = 0; k < NRT_KERNELS; k++)
		REG(__cudaRegisterFunction)(fatbin_handle, (const char *)kernel_fn[k],
					    (char *)kernel_name[k], kernel_name[k], -1,
					    NULL, NULL, NULL, NULL, NULL);
	atexit(unregister_kernels);
}

#ifdef PROFI_DLOPEN
static const int needs_load = 1;
static void load(void)
{
	void *h = open_lib(opt.lib, RTLD_NOW | RTLD_LOCAL);
#define RESOLVE(name, params) *(void **)&p_##name = resolve(h, opt.lib, #name, 1);
	PROFI_CUDA_CORE_FUNCS(RESOLVE)
	if (opt.extra) {
		PROFI_CUDA_EXTRA_FUNCS(RESOLVE)
	}
	if (opt.ptsz) {
		PROFI_CUDA_PTSZ_FUNCS(RESOLVE)
	}
#undef RESOLVE
	/* Graph symbols are optional: a library lacking them still serves the
	 * rest, and the ground truth then simply has no graph calls. */
	*(void **)&p_cudaGraphLaunch = dlsym(h, "cudaGraphLaunch");
	*(void **)&p_cudaGraphInstantiate = dlsym(h, "cudaGraphInstantiate");
	have_graphs = p_cudaGraphLaunch && p_cudaGraphInstantiate;
	if (!have_graphs)
		fprintf(stderr, "workload: no graph symbols in %s, skipping graphs\n", opt.lib);
	if (opt.ptsz) {
		*(void **)&p_cudaGraphLaunch_ptsz = dlsym(h, "cudaGraphLaunch_ptsz");
		have_graph_ptsz = p_cudaGraphLaunch_ptsz != NULL;
		if (have_graphs && !have_graph_ptsz)
			fprintf(stderr, "workload: no cudaGraphLaunch_ptsz in %s, skipping it\n", opt.lib);
	}

	/* Registration is optional too: unregistered kernels still launch. */
	*(void **)&p___cudaRegisterFatBinary = dlsym(h, "__cudaRegisterFatBinary");
	*(void **)&p___cudaRegisterFunction = dlsym(h, "__cudaRegisterFunction");
	*(void **)&p___cudaUnregisterFatBinary = dlsym(h, "__cudaUnregisterFatBinary");
	if (p___cudaRegisterFatBinary && p___cudaRegisterFunction && p___cudaUnregisterFatBinary)
		register_kernels();
	else
		fprintf(stderr, "workload: no registration symbols in %s, kernels unregistered\n", opt.lib);

	if (opt.driver) {
		/* Default: the libcuda.so.1 next to the runtime. */
		const char *slash = strrchr(opt.lib, '/');
		char *path = NULL;
		if (!opt.lib_cuda && slash) {
			size_t dir = (size_t)(slash - opt.lib) + 1;
			if (!(path = malloc(dir + sizeof("libcuda.so.1"))))
				die("out of memory");
			memcpy(path, opt.lib, dir);
			strcpy(path + dir, "libcuda.so.1");
		}
		load_driver(opt.lib_cuda ? opt.lib_cuda : path ? path : "libcuda.so.1",
			    RTLD_NOW | RTLD_LOCAL);
		free(path);
	}
}

#else
static const int needs_load = 0;
static void load(void) {} /* linked at build time: nothing to do */

/* Before main, as nvcc's code does: a process started before an agent has
 * already registered its kernels. */
__attribute__((constructor)) static void register_at_start(void)
{
	register_kernels();
}
#endif

/* --nvtx: the linked build finds libnvToolsExt.so.1 through its RUNPATH
 * (dlopen searches the caller's), the dlopen build next to --lib. */
static void load_nvtx(void)
{
	static const char base[] = "libnvToolsExt.so.1";
	const char *slash = needs_load ? strrchr(opt.lib, '/') : NULL;
	char *path = NULL;
	if (!opt.nvtx_lib && slash) {
		size_t dir = (size_t)(slash - opt.lib) + 1;
		if (!(path = malloc(dir + sizeof(base))))
			die("out of memory");
		memcpy(path, opt.lib, dir);
		strcpy(path + dir, base);
	}
	const char *lib = opt.nvtx_lib ? opt.nvtx_lib : path ? path : base;
	void *h = open_lib(lib, RTLD_NOW | RTLD_LOCAL);
#define RESOLVE_NVTX(name, ret, params) *(void **)&x_##name = resolve(h, lib, #name, 1);
	PROFI_NVTX_FUNCS(RESOLVE_NVTX)
#undef RESOLVE_NVTX
	free(path);
}

/*
 * The crash breaker's tests: one probed call (cudaMalloc, whose stub calls
 * no driver function: the runtime's probe is the last to trap), then a
 * real fault, SIGSEGV (a store to an address the compiler cannot see is
 * NULL) or SIGILL (an undefined instruction). "nullstore" is the NULL store
 * alone: a crash of the process's own code, no CUDA call just before it (the
 * crash-looping pod of test/e2e/node_test.go).
 */
static void die_of_fault(int segv, int probed)
{
	void *p = NULL;
	volatile int *volatile bad = NULL;

	if (probed)
		CUDA(cudaMalloc)(&p, 64);
	if (segv)
		*bad = 1;
#if defined(__x86_64__)
	__asm__ volatile("ud2");
#elif defined(__aarch64__)
	__asm__ volatile(".inst 0x00000000"); /* udf #0 */
#else
#error "die_of_fault: no undefined instruction for this architecture"
#endif
	die("still alive after the fault");
}

/* The uprobe out-of-line page ([uprobes] in maps): 0 if none yet. */
static uintptr_t uprobes_page(void)
{
	char line[512];
	uintptr_t start = 0;
	FILE *f = fopen("/proc/self/maps", "r");

	if (!f)
		die("open /proc/self/maps");
	while (fgets(line, sizeof(line), f))
		if (strstr(line, "[uprobes]")) {
			start = (uintptr_t)strtoull(line, NULL, 16);
			break;
		}
	fclose(f);
	return start;
}

/*
 * The crash breaker's attributed crashes: one probed call (cudaMalloc,
 * whose return probe makes the kernel create the out-of-line page), then
 * "xol": a jump into that page at an offset no copied instruction uses
 * (its last 16 bytes: zeros, which fault on both architectures; x86-64's
 * "add %al,(%rax)" with rax 0), or "tramp": a call of the return probe
 * trampoline (the page's first bytes) with no return pending, which the
 * kernel answers with SIGILL. Both fault at an address in the page.
 */
static void die_in_uprobes_page(int tramp)
{
	void *p = NULL;
	uintptr_t page;

	CUDA(cudaMalloc)(&p, 64);
	page = uprobes_page();
	if (!page)
		die("no [uprobes] page after a probed call");
	if (tramp) {
		((void (*)(void))page)();
	} else {
		uintptr_t at = page + (uintptr_t)sysconf(_SC_PAGESIZE) - 16;
#if defined(__x86_64__)
		__asm__ volatile("xor %%eax, %%eax\n\tjmp *%0" : : "r"(at) : "rax", "memory");
#else
		((void (*)(void))at)();
#endif
	}
	die("still alive after the jump into [uprobes]");
}

/* The jump of die_in_uprobes_page("xol"), on a thread that made no probed call. */
static void *jump_into_uprobes_page(void *page)
{
	uintptr_t at = (uintptr_t)page + (uintptr_t)sysconf(_SC_PAGESIZE) - 16;

#if defined(__x86_64__)
	__asm__ volatile("xor %%eax, %%eax\n\tjmp *%0" : : "r"(at) : "rax", "memory");
#else
	((void (*)(void))at)();
#endif
	return NULL;
}

/*
 * "xol-thread": the same fault in the [uprobes] page, raised by a thread
 * that never hit a probe (the main thread made the probed call). A probe
 * can only make the thread it trapped fault: the breaker must not count
 * it as the probes' doing.
 */
static void die_in_uprobes_page_other_thread(void)
{
	void *p = NULL;
	uintptr_t page;
	pthread_t tid;

	CUDA(cudaMalloc)(&p, 64);
	page = uprobes_page();
	if (!page)
		die("no [uprobes] page after a probed call");
	if (pthread_create(&tid, NULL, jump_into_uprobes_page, (void *)page))
		die("pthread_create");
	pthread_join(tid, NULL);
	die("still alive after the thread's jump into [uprobes]");
}

/*
 * Fault signals that are not faults: one probed call, then signal sig sent
 * to the process itself with kill, tgkill or sigqueue, or "forge": queued
 * with rt_sigqueueinfo carrying a kernel fault's code (SEGV_MAPERR, which
 * the kernel lets a process queue to itself) and an address in the
 * [uprobes] page. None is raised by the kernel at a probe.
 */
static void die_of_sent_signal(const char *how, int sig)
{
	void *p = NULL;

	CUDA(cudaMalloc)(&p, 64);
	if (!strcmp(how, "kill")) {
		kill(getpid(), sig);
	} else if (!strcmp(how, "tgkill")) {
		syscall(SYS_tgkill, getpid(), (pid_t)syscall(SYS_gettid), sig);
	} else if (!strcmp(how, "sigqueue")) {
		union sigval v = {.sival_int = 0};
		sigqueue(getpid(), sig, v);
	} else if (!strcmp(how, "forge")) {
		siginfo_t si;
		memset(&si, 0, sizeof(si));
		si.si_signo = sig;
		si.si_code = SEGV_MAPERR;
		si.si_addr = (void *)(uprobes_page() + 16);
		if (syscall(SYS_rt_sigqueueinfo, getpid(), sig, &si))
			die("rt_sigqueueinfo");
	} else {
		die("unknown way to send a signal");
	}
	/* Delivered at the return from the system call at the latest. */
	die("still alive after sending itself a fatal signal");
}

int main(int argc, char **argv)
{
	static const struct { const char *name; int *v; long max; } int_opts[] = {
		{"--threads", &opt.threads, 1024}, {"--iters", &opt.iters, 100000000},
		{"--launches", &opt.launches, 100000}, {"--memcpy", &opt.memcpys, 100000},
		{"--mallocs", &opt.mallocs, 100000}, {"--graphs", &opt.graphs, 100000},
		{"--streams", &opt.streams, 64}, {"--driver", &opt.driver, 100000},
		{"--pause-us", &opt.pause_us, 1000000}, {"--spin-us", &opt.spin_us, 1000000},
	};
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		size_t o;
		for (o = 0; o < sizeof(int_opts) / sizeof(int_opts[0]); o++)
			if (!strcmp(a, int_opts[o].name))
				break;
		if (o < sizeof(int_opts) / sizeof(int_opts[0]) && i + 1 < argc) {
			char *end;
			long v = strtol(argv[++i], &end, 10);
			if (*end || end == argv[i] || v < 0 || v > int_opts[o].max)
				die("bad option value");
			*int_opts[o].v = (int)v;
		} else if (!strcmp(a, "--errors") || !strcmp(a, "--no-errors")) {
			opt.errors = a[2] == 'e';
		} else if (!strcmp(a, "--park")) {
			opt.park = 1;
		} else if (!strcmp(a, "--extra")) {
			opt.extra = 1;
		} else if (!strcmp(a, "--ptsz")) {
			opt.ptsz = 1;
		} else if (!strcmp(a, "--lib") && i + 1 < argc) {
			opt.lib = argv[++i];
		} else if (!strcmp(a, "--lib-cuda") && i + 1 < argc) {
			opt.lib_cuda = argv[++i]; /* dlopen build only */
		} else if (!strcmp(a, "--nvtx")) {
			opt.nvtx = 1;
		} else if (!strcmp(a, "--nccl-lib") && i + 1 < argc) {
			opt.nccl_lib = argv[++i];
		} else if (!strcmp(a, "--nvtx-lib") && i + 1 < argc) {
			opt.nvtx = 1;
			opt.nvtx_lib = argv[++i];
		} else {
			fprintf(stderr, "workload: bad argument %s\n", a);
			return 2;
		}
	}
	/* The linked build takes the driver its libcudart loaded (NOLOAD:
	 * never a second copy). */
	if (!needs_load && opt.driver)
		load_driver("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	/* At start in both builds: mapped before "ready", so an agent can
	 * attach before the first range. */
	if (opt.nvtx)
		load_nvtx();
	if (opt.nccl_lib) {
		if (!opt.nvtx)
			die("--nccl-lib needs --nvtx");
		void *h = open_lib(opt.nccl_lib, RTLD_NOW | RTLD_LOCAL);
		*(void **)&x_ncclGroupStart = resolve(h, opt.nccl_lib, "ncclGroupStart", 1);
		*(void **)&x_ncclGroupEnd = resolve(h, opt.nccl_lib, "ncclGroupEnd", 1);
	}

	printf("ready %d\n", (int)getpid());
	fflush(stdout);
	int loaded = 0;
	char line[64];
	while (fgets(line, sizeof(line), stdin)) {
		line[strcspn(line, "\r\n")] = 0;
		release_parked();
		if (!strcmp(line, "load")) {
			if (!loaded)
				load();
			loaded = 1;
			printf("loaded\n");
			fflush(stdout);
		} else if (!strcmp(line, "go") || !strcmp(line, "run")) {
			if (needs_load && !loaded)
				die("\"go\" before \"load\"");
			run_phase(line[0] == 'r');
		} else if (!strcmp(line, "exit")) {
			break;
		} else if (!strcmp(line, "segv") || !strcmp(line, "ill")) {
			if (needs_load && !loaded)
				die("\"segv\"/\"ill\" before \"load\"");
			die_of_fault(line[0] == 's', 1);
		} else if (!strcmp(line, "nullstore")) {
			die_of_fault(1, 0);
		} else if (!strcmp(line, "xol-thread")) {
			if (needs_load && !loaded)
				die("\"xol-thread\" before \"load\"");
			die_in_uprobes_page_other_thread();
		} else if (!strcmp(line, "xol") || !strcmp(line, "tramp")) {
			if (needs_load && !loaded)
				die("\"xol\"/\"tramp\" before \"load\"");
			die_in_uprobes_page(line[0] == 't');
		} else if (!strncmp(line, "send ", 5)) {
			char how[16];
			int sig;

			if (needs_load && !loaded)
				die("\"send\" before \"load\"");
			if (sscanf(line + 5, "%15s %d", how, &sig) != 2)
				die("send: want \"send HOW SIGNAL\"");
			die_of_sent_signal(how, sig);
		} else {
			fprintf(stderr, "workload: unexpected command \"%s\"\n", line);
			return 2;
		}
	}
	return 0;
}
