/* Launches the way nvcc 13-built code does: __cudaGetKernel once per
 * kernel, then __cudaLaunchKernel (and __cudaLaunchKernel_ptsz for
 * --default-stream per-thread code) per launch, against the stub
 * libcudart.so.12 (which exports the CUDA 13 entry points). Prints its exact
 * ground truth.
 *
 * Usage: launch13 LAUNCHES PTSZ_LAUNCHES. stdin protocol: prints
 * "ready <pid>"; "go" -> the launches -> one JSON line of what it called;
 * EOF -> exit 0. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_stub.h"

/* Host stubs: only their addresses and names matter (exported, so the
 * agent's ELF fallback names them; nothing registers them). */
void launch13_gemm(void);
void launch13_softmax(void);
void launch13_rmsnorm(void);
void launch13_gemm(void) {}
void launch13_softmax(void) {}
void launch13_rmsnorm(void) {}
static const char *const stub_names[3] = {"launch13_gemm", "launch13_softmax", "launch13_rmsnorm"};

static void die(const char *msg)
{
	fprintf(stderr, "launch13: %s\n", msg);
	exit(1);
}

int main(int argc, char **argv)
{
	if (argc != 3)
		die("usage: launch13 LAUNCHES PTSZ_LAUNCHES");
	long n = strtol(argv[1], NULL, 10), m = strtol(argv[2], NULL, 10);
	void (*stubs[3])(void) = {launch13_gemm, launch13_softmax, launch13_rmsnorm};
	uint64_t per_kernel[3] = {0, 0, 0};
	cudaKernel_t k[3];
	uint64_t grid_blocks = 0, block_threads = 0, shared = 0;
	char line[64];

	printf("ready %d\n", (int)getpid());
	fflush(stdout);
	if (!fgets(line, sizeof(line), stdin) || strncmp(line, "go", 2))
		return 0;
	for (int i = 0; i < 3; i++)
		if (__cudaGetKernel(&k[i], (const void *)stubs[i]) != cudaSuccess ||
		    (uintptr_t)k[i] == (uintptr_t)stubs[i])
			die("__cudaGetKernel failed or returned the stub");
	for (long i = 0; i < n + m; i++) {
		dim3 grid = {(unsigned)(i % 4 + 1), 2, 1}, block = {128, 1, 1};
		size_t shm = (size_t)(i % 2) * 1024;
		cudaError_t rc = i < n ? __cudaLaunchKernel(k[i % 3], grid, block, NULL, shm, NULL)
				       : __cudaLaunchKernel_ptsz(k[i % 3], grid, block, NULL, shm, NULL);
		if (rc != cudaSuccess)
			die("launch failed");
		per_kernel[i % 3]++;
		grid_blocks += grid.x * grid.y * grid.z;
		block_threads += block.x * block.y * block.z;
		shared += shm;
	}
	printf("{\"calls\":{\"__cudaGetKernel\":3,\"__cudaLaunchKernel\":%ld,\"__cudaLaunchKernel_ptsz\":%ld},"
	       "\"grid_blocks\":%llu,\"block_threads\":%llu,\"shared_bytes\":%llu,\"launches_by_kernel\":{",
	       n, m, (unsigned long long)grid_blocks, (unsigned long long)block_threads,
	       (unsigned long long)shared);
	for (int i = 0; i < 3; i++)
		printf("%s\"%s\":%llu", i ? "," : "", stub_names[i], (unsigned long long)per_kernel[i]);
	printf("}}\n");
	fflush(stdout);
	while (fgets(line, sizeof(line), stdin))
		;
	return 0;
}
