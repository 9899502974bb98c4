//go:build ignore

/* (The constraint above keeps the go tool from taking this for cgo source.)
 *
 * Short process of the attach latency benchmark (bench/attach_test.go,
 * which builds it with gcc; never commit the binary). It starts without any
 * CUDA library, then dlopens LIB (a libcudart.so.12) and records
 * CLOCK_MONOTONIC right after dlopen returns: the moment the process maps
 * the library. Then it calls cudaLaunchKernel every PERIOD_US microseconds
 * (absolute deadlines, so the calls do not drift) for DURATION_MS
 * milliseconds, recording CLOCK_MONOTONIC just before each call. Then it
 * prints
 *
 *   done pid=PID t_before=NS t_map=NS calls=N failed=F
 *
 * (t_before: just before dlopen) and stays alive, mapping the library, so
 * the benchmark can read the agent's count of its calls. Commands on stdin:
 *
 *   t I    -> "t I NS": the time recorded before call I (0-based)
 *   exit   -> exit 0 (EOF too)
 *
 * Every call's return code is checked (F must be 0): a broken stub cannot
 * pass for a fast attach.
 *
 * Usage: attach LIB PERIOD_US DURATION_MS */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda_stub.h"

typedef cudaError_t (*launch_fn)(const void *, dim3, dim3, void **, size_t, cudaStream_t);

static void kernel(void)
{
}

static long long now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void sleep_until(long long ns)
{
	struct timespec ts = {.tv_sec = ns / 1000000000LL, .tv_nsec = ns % 1000000000LL};

	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0)
		;
}

int main(int argc, char **argv)
{
	dim3 grid = {2, 1, 1}, block = {128, 1, 1};
	long long t_before, t_map, *t;
	long period_us, duration_ms, max_calls, calls = 0, failed = 0;
	launch_fn launch;
	char line[64];
	void *h;

	if (argc != 4) {
		fprintf(stderr, "usage: %s LIB PERIOD_US DURATION_MS\n", argv[0]);
		return 2;
	}
	period_us = atol(argv[2]);
	duration_ms = atol(argv[3]);
	if (period_us <= 0 || duration_ms <= 0) {
		fprintf(stderr, "PERIOD_US and DURATION_MS must be > 0\n");
		return 2;
	}
	max_calls = duration_ms * 1000 / period_us + 2;
	t = calloc(max_calls, sizeof(*t));
	if (!t) {
		fprintf(stderr, "out of memory\n");
		return 1;
	}

	t_before = now_ns();
	h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	t_map = now_ns();
	if (!h) {
		fprintf(stderr, "dlopen %s: %s\n", argv[1], dlerror());
		return 1;
	}
	launch = (launch_fn)dlsym(h, "cudaLaunchKernel");
	if (!launch) {
		fprintf(stderr, "dlsym cudaLaunchKernel: %s\n", dlerror());
		return 1;
	}

	for (long long next = t_map; calls < max_calls; next += period_us * 1000LL) {
		long long now = now_ns();

		if (now - t_map >= duration_ms * 1000000LL)
			break;
		t[calls++] = now;
		failed += launch((const void *)kernel, grid, block, NULL, 0, NULL) != cudaSuccess;
		sleep_until(next + period_us * 1000LL);
	}

	printf("done pid=%d t_before=%lld t_map=%lld calls=%ld failed=%ld\n", (int)getpid(),
	       t_before, t_map, calls, failed);
	fflush(stdout);
	while (fgets(line, sizeof(line), stdin)) {
		long i;

		if (strncmp(line, "exit", 4) == 0)
			break;
		if (sscanf(line, "t %ld", &i) == 1 && i >= 0 && i < calls)
			printf("t %ld %lld\n", i, t[i]);
		else
			printf("error %s", line);
		fflush(stdout);
	}
	return 0;
}
