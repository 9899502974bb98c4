/* Drives the driver API of the stub libcuda.so.1 directly, as Triton, NCCL
 * and statically linked runtimes do. Memory: allocations (plain, async,
 * managed, pitched, from a pool, VMM physical allocations), copies of every direction (sync,
 * async, per-thread stream; 2D and 3D), peer copies (linear and 3D), sets of 1, 2 and 4-byte elements
 * (linear and pitched), VMM mapping calls, and one failing free. Launches: every launch entry
 * point and its per-thread-stream (_ptsz) variant, and graph launches.
 * Prints its exact ground truth, tallied from the arguments passed and the
 * codes returned.
 *
 * Usage: drvapi ITERS LAUNCHES. stdin protocol: prints "ready <pid>"; "go"
 * -> ITERS memory iterations, LAUNCHES launch iterations -> one JSON line;
 * EOF -> exit 0. */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_drv_stub.h"

enum { NFN = 47 };
static const char *const fn_name[NFN] = {
#define NAME(name, params) #name,
	PROFI_CU_MEM_FUNCS(NAME) PROFI_CU_LAUNCH_FUNCS(NAME)
#undef NAME
};
enum {
#define ID(name, params) F_##name,
	PROFI_CU_MEM_FUNCS(ID) PROFI_CU_LAUNCH_FUNCS(ID)
#undef ID
};
_Static_assert(F_cuGraphLaunch_ptsz == NFN - 1, "NFN");

static uint64_t calls[NFN], errors[NFN];
static uint64_t memcpy_bytes[5]; /* cudaMemcpyKind: h2h h2d d2h d2d default */
static uint64_t p2p_bytes, memset_bytes, stream_set_bytes, malloc_bytes, freed_bytes;
static uint64_t kernel_launches, grid_blocks, block_threads, shared_bytes;

static void tally(int f, CUresult rc)
{
	calls[f]++;
	if (rc)
		errors[f]++;
}

#define CALL(f, ...) tally(F_##f, f(__VA_ARGS__))

static void copied(int kind, uint64_t n) { memcpy_bytes[kind] += n; }

/* Prints the non-zero counts by function name as a JSON object. */
static void print_counts(const uint64_t *n)
{
	const char *sep = "";

	printf("{");
	for (int f = 0; f < NFN; f++)
		if (n[f]) {
			printf("%s\"%s\":%" PRIu64, sep, fn_name[f], n[f]);
			sep = ",";
		}
	printf("}");
}

/* launched: one kernel launch of this geometry. */
static void launched(unsigned gx, unsigned bx, unsigned shm)
{
	kernel_launches++;
	grid_blocks += gx;
	block_threads += bx;
	shared_bytes += shm;
}

/* launch_all: each launch entry point once, on stream s. */
static void launch_all(long i, CUstream s)
{
	CUfunction f = (CUfunction)(uintptr_t)0x7a0100; /* a fake function handle */
	CUgraphExec g = (CUgraphExec)(uintptr_t)0x6a0100;
	unsigned gx = (unsigned)(i % 8 + 1), bx = 128, shm = (unsigned)(i % 2) * 512;
	CUlaunchConfig c = {.gridDimX = gx, .gridDimY = 1, .gridDimZ = 1, .blockDimX = bx,
			    .blockDimY = 1, .blockDimZ = 1, .sharedMemBytes = shm, .hStream = s};

	CALL(cuLaunchKernel, f, gx, 1, 1, bx, 1, 1, shm, s, NULL, NULL);
	CALL(cuLaunchKernel_ptsz, f, gx, 1, 1, bx, 1, 1, shm, s, NULL, NULL);
	CALL(cuLaunchKernelEx, &c, f, NULL, NULL);
	CALL(cuLaunchKernelEx_ptsz, &c, f, NULL, NULL);
	CALL(cuLaunchCooperativeKernel, f, gx, 1, 1, bx, 1, 1, shm, s, NULL);
	CALL(cuLaunchCooperativeKernel_ptsz, f, gx, 1, 1, bx, 1, 1, shm, s, NULL);
	for (int k = 0; k < 6; k++)
		launched(gx, bx, shm);
	CALL(cuGraphLaunch, g, s);
	CALL(cuGraphLaunch_ptsz, g, s);
}

int main(int argc, char **argv)
{
	if (argc != 3)
		return 2;
	long iters = strtol(argv[1], NULL, 10), launches = strtol(argv[2], NULL, 10);
	static char host[1 << 16];
	CUstream s = (CUstream)(uintptr_t)0x5100; /* a fake stream handle */
	char line[64];

	printf("ready %d\n", (int)getpid());
	fflush(stdout);
	if (!fgets(line, sizeof(line), stdin) || strncmp(line, "go", 2))
		return 0;
	for (long i = 0; i < iters; i++) {
		size_t n = 4096 * (size_t)(i % 4 + 1);
		CUdeviceptr a = 0, b = 0, m = 0, va = 0;
		CUmemGenericAllocationHandle h = 0;

		CALL(cuMemAlloc_v2, &a, n);
		CALL(cuMemAllocAsync, &b, 2 * n, s);
		CALL(cuMemAllocManaged, &m, 3 * n, 1);
		CALL(cuMemCreate, &h, 1 << 21, NULL, 0);
		malloc_bytes += n + 2 * n + 3 * n + (1 << 21);
		/* Pitched: the pitch the driver writes back x the rows; every 10th
		 * asks for 2-byte elements (CUDA_ERROR_INVALID_VALUE). From a pool:
		 * on drvapi's stream. */
		CUdeviceptr pa = 0, pp = 0;
		size_t pitch = 0, prow = 300 + 100 * (size_t)(i % 4), prows = (size_t)(i % 5 + 1);
		CUresult arc = cuMemAllocPitch_v2(&pa, &pitch, prow, prows, i % 10 ? 4 : 2);
		tally(F_cuMemAllocPitch_v2, arc);
		if (arc == CUDA_SUCCESS)
			malloc_bytes += pitch * prows;
		CALL(cuMemAllocFromPoolAsync, &pp, 5000 + 8 * (size_t)i, (CUmemoryPool)(uintptr_t)0x9100, s);
		malloc_bytes += 5000 + 8 * (size_t)i;

		CALL(cuMemcpyHtoD_v2, a, host, n);
		copied(1, n);
		CALL(cuMemcpyDtoH_v2, host, a, n / 2);
		copied(2, n / 2);
		CALL(cuMemcpyDtoD_v2, b, a, n);
		copied(3, n);
		CALL(cuMemcpy, b, a, 100);
		copied(4, 100);
		CALL(cuMemcpyAsync, b, a, 200, s);
		copied(4, 200);
		CALL(cuMemcpyHtoDAsync_v2, a, host, 300, s);
		copied(1, 300);
		CALL(cuMemcpyDtoHAsync_v2, host, a, 400, s);
		copied(2, 400);
		CALL(cuMemcpyDtoDAsync_v2, b, a, 500, s);
		copied(3, 500);
		CALL(cuMemcpyHtoDAsync_v2_ptsz, a, host, 600, s);
		copied(1, 600);
		CALL(cuMemcpyAsync_ptsz, b, a, 700, s);
		copied(4, 700);
		CALL(cuMemcpyPeer, b, NULL, a, NULL, 800);
		p2p_bytes += 800;
		/* Pitched: WidthInBytes in each of Height (x Depth) rows; the
		 * direction from the two ends' memory types. */
		size_t w = 100 * (size_t)(i % 5 + 1), hh = (size_t)(i % 4 + 1);
		CUDA_MEMCPY2D c2 = {.srcMemoryType = CU_MEMORYTYPE_HOST, .srcHost = host,
				    .srcPitch = 512, .dstMemoryType = CU_MEMORYTYPE_DEVICE,
				    .dstDevice = a, .dstPitch = 1024, .WidthInBytes = w,
				    .Height = hh};
		CALL(cuMemcpy2D_v2, &c2);
		copied(1, w * hh);
		c2.srcMemoryType = CU_MEMORYTYPE_DEVICE, c2.srcDevice = b;
		CALL(cuMemcpy2DUnaligned_v2, &c2);
		copied(3, w * hh);
		c2.dstMemoryType = CU_MEMORYTYPE_HOST, c2.dstHost = host;
		CALL(cuMemcpy2DAsync_v2, &c2, s);
		copied(2, w * hh);
		CUDA_MEMCPY3D c3 = {.srcMemoryType = CU_MEMORYTYPE_DEVICE, .srcDevice = a,
				    .srcPitch = 512, .dstMemoryType = CU_MEMORYTYPE_HOST,
				    .dstHost = host, .dstPitch = 512, .WidthInBytes = 256,
				    .Height = hh, .Depth = 3};
		CALL(cuMemcpy3D_v2, &c3);
		copied(2, 256 * hh * 3);
		c3.dstMemoryType = CU_MEMORYTYPE_UNIFIED, c3.dstDevice = b;
		CALL(cuMemcpy3DAsync_v2, &c3, s);
		copied(4, 256 * hh * 3);
		/* Between contexts: "p2p" whatever the ends' memory types; every
		 * 10th row wider than its pitch fails (CUDA_ERROR_INVALID_VALUE). */
		CUDA_MEMCPY3D_PEER cp = {.srcMemoryType = CU_MEMORYTYPE_DEVICE, .srcDevice = a,
					 .srcContext = (CUcontext)(uintptr_t)0xc1, .srcPitch = 512,
					 .dstMemoryType = CU_MEMORYTYPE_DEVICE, .dstDevice = b,
					 .dstContext = (CUcontext)(uintptr_t)0xc2, .dstPitch = 512,
					 .WidthInBytes = i % 10 ? 128 * (size_t)(i % 3 + 1) : 1024,
					 .Height = hh, .Depth = 2};
		CUresult prc = cuMemcpy3DPeer(&cp);
		tally(F_cuMemcpy3DPeer, prc);
		if (prc == CUDA_SUCCESS)
			p2p_bytes += cp.WidthInBytes * hh * 2;
		cp.WidthInBytes = 64, cp.Depth = 5, cp.dstMemoryType = CU_MEMORYTYPE_HOST, cp.dstHost = host;
		CALL(cuMemcpy3DPeerAsync, &cp, s);
		p2p_bytes += 64 * hh * 5;

		CALL(cuMemsetD8_v2, a, 0, 1000);
		CALL(cuMemsetD16_v2, a, 0, 1000);
		CALL(cuMemsetD32_v2, a, 0, 1000);
		CALL(cuMemsetD32Async, b, 0, 500, s);
		memset_bytes += 1000 + 2 * 1000 + 4 * 1000 + 4 * 500;
		stream_set_bytes += 4 * 500;
		/* Pitched: width elements in each of height rows pitch bytes apart. */
		size_t rows = (size_t)(i % 3 + 1);
		CALL(cuMemsetD2D8_v2, a, 512, 0, 300, rows);
		CALL(cuMemsetD2D16_v2, a, 512, 0, 200, rows);
		CALL(cuMemsetD2D32_v2, a, 512, 0, 100, rows + 1);
		CALL(cuMemsetD2D32Async, b, 1024, 0, 250, rows, s);
		memset_bytes += 300 * rows + 2 * 200 * rows + 4 * 100 * (rows + 1) + 4 * 250 * rows;
		stream_set_bytes += 4 * 250 * rows;

		CALL(cuMemAddressReserve, &va, 1 << 21, 0, 0, 0);
		CALL(cuMemMap, va, 1 << 21, 0, h, 0);
		CALL(cuMemUnmap, va, 1 << 21);
		CALL(cuMemAddressFree, va, 1 << 21);

		CALL(cuMemFree_v2, a);
		CALL(cuMemFreeAsync, b, s);
		CALL(cuMemRelease, h);
		freed_bytes += n + 2 * n + (1 << 21); /* the managed allocation stays */
		if (arc == CUDA_SUCCESS) {
			CALL(cuMemFree_v2, pa);
			freed_bytes += pitch * prows;
		}
		CALL(cuMemFreeAsync, pp, s);
		freed_bytes += 5000 + 8 * (size_t)i;
		CALL(cuMemFree_v2, 0);		      /* fails: CUDA_ERROR_INVALID_VALUE */
	}
	for (long i = 0; i < launches; i++)
		launch_all(i, s);
	printf("{\"calls\":");
	print_counts(calls);
	printf(",\"errors\":");
	print_counts(errors);
	printf(",\"memcpy_bytes\":{\"h2d\":%" PRIu64 ",\"d2h\":%" PRIu64 ",\"d2d\":%" PRIu64
	       ",\"default\":%" PRIu64 ",\"p2p\":%" PRIu64 "},\"memset_bytes\":%" PRIu64 ",\"stream_memset_bytes\":%" PRIu64
	       ",\"malloc_bytes\":%" PRIu64 ",\"active_bytes\":%" PRIu64 ",\"kernel_launches\":%" PRIu64
	       ",\"grid_blocks\":%" PRIu64 ",\"block_threads\":%" PRIu64 ",\"shared_bytes\":%" PRIu64 "}\n",
	       memcpy_bytes[1], memcpy_bytes[2], memcpy_bytes[3], memcpy_bytes[4], p2p_bytes,
	       memset_bytes, stream_set_bytes, malloc_bytes, malloc_bytes - freed_bytes, kernel_launches, grid_blocks,
	       block_threads, shared_bytes);
	fflush(stdout);
	while (fgets(line, sizeof(line), stdin))
		;
	return 0;
}
