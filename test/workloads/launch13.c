/* Launches the way nvcc 13-built code does, against the stub
 * libcudart.so.13 (or a runtime linked into the executable: the static
 * builds). For each __global__ function K nvcc emits a host function K (the
 * kernel's mangled name: the "host stub" whose address identifies the
 * kernel) that calls __device_stub_K, which fetches K's cudaKernel_t once
 * with __cudaGetKernel (a function-local static) and launches it with
 * __cudaLaunchKernel, or __cudaLaunchKernel_ptsz for --default-stream
 * per-thread code. Prints its exact ground truth.
 *
 * Usage: launch13 LAUNCHES PTSZ_LAUNCHES [early]. With "early" every kernel
 * is launched once before "ready" (its handle fetched before any agent
 * attached, as in a process started before the agent); those launches are
 * not in the ground truth. LAUNCH13_SPREAD_MS=T in the environment spreads
 * the launches over about T milliseconds (a pause of 1 ms between equal
 * batches), so that the agent changes how it probes them while they run.
 * LAUNCH13_PAUSE_AT=I,J,... stops before launch I (counting from 0), J...:
 * prints "paused I" and waits for "go" (EOF ends the process), so that a
 * test can look at the agent between two launches.
 *
 * stdin protocol: prints "ready <pid>"; "go" -> the launches -> one JSON
 * line of what it called; EOF -> exit 0. "run" instead of "go": prints
 * "running" and launches until it has made at least LAUNCHES +
 * PTSZ_LAUNCHES launches and read "stop" (or EOF), in rounds of LAUNCHES
 * __cudaLaunchKernel then PTSZ_LAUNCHES __cudaLaunchKernel_ptsz launches, so
 * that a test's adversary, not the clock, decides how many it makes; the
 * JSON line says how many it made. LAUNCH13_PACE=K pauses 1 ms after
 * every K launches: how long the adversary takes then bounds how many. */
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_stub.h"

static void die(const char *msg)
{
	fprintf(stderr, "launch13: %s\n", msg);
	exit(1);
}

/* The launch being made: its index (geometry) and API; ground truth. */
static long cur;
static int cur_ptsz;
static uint64_t get_kernel_calls, grid_blocks, block_threads, shared;

/* KERNEL(mangled): the host function and its __device_stub_ launcher, as
 * nvcc generates them (noinline: the launch's call site must be the
 * device stub, as in nvcc's output). */
#define KERNEL(mangled)                                                              \
	void mangled(float *p);                                                      \
	__attribute__((noinline)) void __device_stub_##mangled(float *p)             \
	{                                                                            \
		static cudaKernel_t h;                                               \
		void *args[] = {&p};                                                 \
		dim3 grid = {(unsigned)(cur % 4 + 1), 2, 1}, block = {128, 1, 1};    \
		size_t shm = (size_t)(cur % 2) * 1024;                               \
		if (!h) {                                                            \
			get_kernel_calls++;                                          \
			if (__cudaGetKernel(&h, (const void *)mangled) != cudaSuccess || \
			    (uintptr_t)h == (uintptr_t)mangled)                      \
				die("__cudaGetKernel failed or returned the stub");  \
		}                                                                    \
		if ((cur_ptsz ? __cudaLaunchKernel_ptsz : __cudaLaunchKernel)(       \
			h, grid, block, args, shm, NULL) != cudaSuccess)             \
			die("launch failed");                                        \
		grid_blocks += grid.x * grid.y * grid.z;                             \
		block_threads += block.x * block.y * block.z;                        \
		shared += shm;                                                       \
	}                                                                            \
	__attribute__((noinline)) void mangled(float *p) { __device_stub_##mangled(p); }

/* launch13_gemm(float*), launch13_softmax(float*), launch13_rmsnorm(float*) */
KERNEL(_Z13launch13_gemmPf)
KERNEL(_Z16launch13_softmaxPf)
KERNEL(_Z16launch13_rmsnormPf)

static void (*const kernels[3])(float *) = {_Z13launch13_gemmPf, _Z16launch13_softmaxPf,
					    _Z16launch13_rmsnormPf};
static const char *const kernel_names[3] = {"_Z13launch13_gemmPf", "_Z16launch13_softmaxPf",
					    "_Z16launch13_rmsnormPf"};

/* Whether i is in the comma-separated list (LAUNCH13_PAUSE_AT). */
static int pause_here(const char *list, long i)
{
	for (char *end; *list; list = *end ? end + 1 : end) {
		if (strtol(list, &end, 10) == i)
			return 1;
		if (end == list)
			die("LAUNCH13_PAUSE_AT: a list of launch indices, comma-separated");
	}
	return 0;
}

/* Whether "stop" (or EOF) has come on stdin while running. stdio holds
 * nothing unread then: the test writes "stop" only after "running". */
static int stop_read(void)
{
	struct pollfd p = {.fd = 0, .events = POLLIN};
	char line[64];

	if (poll(&p, 1, 0) <= 0)
		return 0;
	if (fgets(line, sizeof(line), stdin) && strncmp(line, "stop", 4))
		die("running: want \"stop\"");
	return 1;
}

int main(int argc, char **argv)
{
	if (argc != 3 && !(argc == 4 && !strcmp(argv[3], "early")))
		die("usage: launch13 LAUNCHES PTSZ_LAUNCHES [early]");
	long n = strtol(argv[1], NULL, 10), m = strtol(argv[2], NULL, 10);
	uint64_t per_kernel[3] = {0, 0, 0}, made[2] = {0, 0};
	float buf[4];
	char line[64];

	if (argc == 4) {
		for (int i = 0; i < 3; i++)
			kernels[i](buf);
		get_kernel_calls = grid_blocks = block_threads = shared = 0;
	}
	printf("ready %d\n", (int)getpid());
	fflush(stdout);
	if (!fgets(line, sizeof(line), stdin) || (strncmp(line, "go", 2) && strncmp(line, "run", 3)))
		return 0;
	int stopped = line[0] == 'g';
	if (!stopped) {
		if (n + m <= 0)
			die("\"run\" needs launches");
		printf("running\n");
		fflush(stdout);
	}
	const char *pace = getenv("LAUNCH13_PACE");
	long pace_every = pace ? strtol(pace, NULL, 10) : 0;
	const char *spread = getenv("LAUNCH13_SPREAD_MS");
	long pauses = spread ? strtol(spread, NULL, 10) : 0;
	long batch = pauses > 0 ? (n + m) / pauses + 1 : n + m + 1;
	const char *pause_at = getenv("LAUNCH13_PAUSE_AT");
	for (long i = 0; i < n + m || !stopped; i++) {
		if (!stopped && i % 64 == 0)
			stopped = stop_read();
		if (i && ((pauses > 0 && i % batch == 0) || (pace_every > 0 && i % pace_every == 0)))
			usleep(1000);
		if (pause_at && pause_here(pause_at, i)) {
			printf("paused %ld\n", i);
			fflush(stdout);
			if (!fgets(line, sizeof(line), stdin) || strncmp(line, "go", 2))
				return 0;
		}
		cur = i;
		cur_ptsz = i % (n + m) >= n;
		kernels[i % 3](buf);
		per_kernel[i % 3]++;
		made[cur_ptsz]++;
	}
	printf("{\"calls\":{\"__cudaLaunchKernel\":%llu,\"__cudaLaunchKernel_ptsz\":%llu",
	       (unsigned long long)made[0], (unsigned long long)made[1]);
	if (get_kernel_calls)
		printf(",\"__cudaGetKernel\":%llu", (unsigned long long)get_kernel_calls);
	printf("},\"grid_blocks\":%llu,\"block_threads\":%llu,\"shared_bytes\":%llu,\"launches_by_kernel\":{",
	       (unsigned long long)grid_blocks, (unsigned long long)block_threads,
	       (unsigned long long)shared);
	for (int i = 0; i < 3; i++)
		printf("%s\"%s\":%llu", i ? "," : "", kernel_names[i], (unsigned long long)per_kernel[i]);
	printf("}}\n");
	fflush(stdout);
	while (fgets(line, sizeof(line), stdin))
		;
	return 0;
}
