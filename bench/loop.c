//go:build ignore

/* (The constraint above keeps the go tool from taking this for cgo source.)
 *
 * Driver of the overhead benchmark (bench/overhead_test.go, which builds it
 * with gcc; never commit the binary). Calls one stub CUDA function CALLS
 * times through the PLT, after WARMUP untimed calls that resolve the PLT
 * slots and fault the pages in. The functions:
 *
 *   cudaLaunchKernel  runtime launch; the stub runtime launches through
 *                     cuLaunchKernel in the stub driver, as the real one does
 *   cuLaunchKernel    driver launch, called directly (no runtime on the path)
 *   cudaMemcpyAsync   runtime copy, timed by profi in every mode
 *   cudaGraphLaunch   a replay of one executable graph (instantiated after
 *                     the go-ahead from a graph handle profi never saw
 *                     built: the stub hands out fake handles), timed by profi
 *                     in every mode; the stub runtime replays through
 *                     cuGraphLaunch, as the real one does
 *
 * The benchmark also runs it against the CET build of the runtime (whose
 * cudaMemcpyAsync starts with endbr64) and with bench/interpose.c preloaded,
 * which adds its own count of cuLaunchKernel calls to stderr at exit.
 *
 * The loop first prints
 *
 *   ready pid=PID
 *
 * and waits for a line on stdin, so that the benchmark can attach its probes
 * to this very process (as profi's discovery does for running processes).
 * Then it runs the warm-up and the timed calls and prints
 *
 *   pid=PID calls=CALLS warmup=WARMUP elapsed_ns=NS
 *
 * where NS covers the CALLS timed calls only. Exits 1 if any call fails, so
 * a broken stub cannot pass for a fast one, and 3 if stdin ends before the
 * go-ahead line.
 *
 * Usage: loop cudaLaunchKernel|cuLaunchKernel|cudaMemcpyAsync|cudaGraphLaunch CALLS WARMUP */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda_drv_stub.h"
#include "cuda_stub.h"
#include "loop.h"

static void kernel(void) {}

static long calls_launch(long n)
{
	dim3 grid = {2, 1, 1}, block = {128, 1, 1};
	long failed = 0;

	for (long i = 0; i < n; i++)
		failed += cudaLaunchKernel((const void *)kernel, grid, block, NULL, 0, NULL) != cudaSuccess;
	return failed;
}

static long calls_cu_launch(long n)
{
	CUfunction f = (CUfunction)(void *)kernel; /* the stub driver only checks non-NULL */
	long failed = 0;

	for (long i = 0; i < n; i++)
		failed += cuLaunchKernel(f, 2, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL) != CUDA_SUCCESS;
	return failed;
}

static long calls_memcpy_async(long n)
{
	static char src[64], dst[64];
	long failed = 0;

	for (long i = 0; i < n; i++)
		failed += cudaMemcpyAsync(dst, src, sizeof(src), cudaMemcpyHostToDevice, NULL) != cudaSuccess;
	return failed;
}

static cudaGraphExec_t exec;

static int prepare_graph(void)
{
	/* Any non-NULL graph handle: the stub never dereferences it. */
	return cudaGraphInstantiate(&exec, (cudaGraph_t)(void *)0x6a00, 0) != cudaSuccess;
}

static long calls_graph_launch(long n)
{
	long failed = 0;

	for (long i = 0; i < n; i++)
		failed += cudaGraphLaunch(exec, NULL) != cudaSuccess;
	return failed;
}

int main(int argc, char **argv)
{
	static const struct {
		const char *name;
		long (*run)(long);
		int (*prepare)(void);
	} fns[] = {
		{"cudaLaunchKernel", calls_launch, NULL},
		{"cuLaunchKernel", calls_cu_launch, NULL},
		{"cudaMemcpyAsync", calls_memcpy_async, NULL},
		{"cudaGraphLaunch", calls_graph_launch, prepare_graph},
	};

	if (argc != 4) {
		fprintf(stderr,
			"usage: %s cudaLaunchKernel|cuLaunchKernel|cudaMemcpyAsync|cudaGraphLaunch CALLS WARMUP\n",
			argv[0]);
		return 2;
	}
	for (size_t i = 0; i < sizeof(fns) / sizeof(fns[0]); i++)
		if (strcmp(argv[1], fns[i].name) == 0)
			return bench_loop(argv[1], argv[2], argv[3], fns[i].prepare, fns[i].run);
	fprintf(stderr, "unknown function %s\n", argv[1]);
	return 2;
}
