//go:build ignore

/* (The constraint above keeps the go tool from taking this for cgo source.)
 *
 * Driver of the userspace cost benchmark (bench/scale_test.go, which builds
 * it with gcc, linked against the stub libcuda.so.1; never commit the
 * binary). It makes driver launches (cuLaunchKernel: one trap per call in
 * profi's default anonymous mode) on STREAMS distinct stream handles, so the
 * agent exports one profi_cuda_calls_total series per stream (labels
 * operation, pid, stream), at RATE calls per second.
 *
 * Stream i (0-based) is the handle STREAM_BASE + i * STREAM_STEP, printed by
 * the benchmark as 0x... . Call j (0-based, over the whole run) goes to
 * stream j mod STREAMS, so after N calls stream i has made
 * N / STREAMS + (i < N mod STREAMS) calls: exact per-series ground truth.
 *
 * stdin protocol (one command per line, one answer line each):
 *
 *   prints "ready pid=PID"
 *   go     -> one call on every stream (the series exist from now on), then
 *             "warm calls=STREAMS"; then calls at RATE/s on a second
 *             thread (absolute schedule: a late call is made up at once)
 *   count  -> "count calls=N"    calls made so far (warm-up included)
 *   rate R -> "rate R": from now on R calls/s (the schedule restarts)
 *   stop   -> stops calling; "stopped calls=N failed=F"
 *   exit   -> exit 0 (EOF too); exit 1 if any call failed
 *
 * Usage: scale STREAMS RATE */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda_drv_stub.h"

#define STREAM_BASE 0x5ca1e0000ULL
#define STREAM_STEP 0x10ULL

static void kernel(void)
{
}

static long streams;
static double rate;	  /* guarded by rate_mu, with rate_gen */
static unsigned rate_gen; /* bumped at every change */
static pthread_mutex_t rate_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t calls, failed; /* written by the caller thread, read atomically */
static int stop;

static long long now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Makes call number `calls` (on stream calls mod streams). */
static void call_one(void)
{
	uint64_t n = __atomic_load_n(&calls, __ATOMIC_RELAXED);
	CUstream s = (CUstream)(uintptr_t)(STREAM_BASE + (n % (uint64_t)streams) * STREAM_STEP);
	CUfunction f = (CUfunction)(void *)kernel; /* the stub driver only checks non-NULL */

	if (cuLaunchKernel(f, 2, 1, 1, 128, 1, 1, 0, s, NULL, NULL) != CUDA_SUCCESS)
		__atomic_add_fetch(&failed, 1, __ATOMIC_RELAXED);
	__atomic_store_n(&calls, n + 1, __ATOMIC_RELEASE);
}

static void *paced(void *arg)
{
	long long t0 = 0;
	uint64_t done = 0;
	unsigned gen = 0;
	double r = 0;

	(void)arg;
	while (!__atomic_load_n(&stop, __ATOMIC_ACQUIRE)) {
		pthread_mutex_lock(&rate_mu);
		if (r == 0 || gen != rate_gen) { /* start, or a new rate: restart the schedule */
			r = rate;
			gen = rate_gen;
			t0 = now_ns();
			done = 0;
		}
		pthread_mutex_unlock(&rate_mu);

		long long elapsed = now_ns() - t0;
		uint64_t due = (uint64_t)((double)elapsed * r / 1e9);

		if (done < due) {
			/* Catch up in bounded bursts, so stop and rate are seen promptly. */
			for (int k = 0; k < 256 && done < due; k++, done++)
				call_one();
			continue;
		}
		/* Sleep until the next call is due, at most 5 ms at a time. */
		long long next = t0 + (long long)((double)(done + 1) * 1e9 / r);
		long long wait = next - now_ns();
		if (wait > 5000000)
			wait = 5000000;
		if (wait > 0) {
			struct timespec ts = {.tv_sec = 0, .tv_nsec = wait};
			nanosleep(&ts, NULL);
		}
	}
	return NULL;
}

int main(int argc, char **argv)
{
	pthread_t th;
	int running = 0;
	char line[64];

	if (argc != 3) {
		fprintf(stderr, "usage: %s STREAMS RATE\n", argv[0]);
		return 2;
	}
	streams = atol(argv[1]);
	rate = atof(argv[2]);
	if (streams <= 0 || rate <= 0) {
		fprintf(stderr, "STREAMS and RATE must be > 0\n");
		return 2;
	}
	printf("ready pid=%d\n", (int)getpid());
	fflush(stdout);
	while (fgets(line, sizeof(line), stdin)) {
		if (strncmp(line, "go", 2) == 0 && !running) {
			for (long i = 0; i < streams; i++)
				call_one();
			printf("warm calls=%ld\n", streams);
			if (pthread_create(&th, NULL, paced, NULL) != 0) {
				fprintf(stderr, "pthread_create failed\n");
				return 1;
			}
			running = 1;
		} else if (strncmp(line, "count", 5) == 0) {
			printf("count calls=%llu\n",
			       (unsigned long long)__atomic_load_n(&calls, __ATOMIC_ACQUIRE));
		} else if (strncmp(line, "rate ", 5) == 0 && atof(line + 5) > 0) {
			pthread_mutex_lock(&rate_mu);
			rate = atof(line + 5);
			rate_gen++;
			pthread_mutex_unlock(&rate_mu);
			printf("rate %s", line + 5);
		} else if (strncmp(line, "stop", 4) == 0) {
			__atomic_store_n(&stop, 1, __ATOMIC_RELEASE);
			if (running)
				pthread_join(th, NULL);
			running = 0;
			printf("stopped calls=%llu failed=%llu\n", (unsigned long long)calls,
			       (unsigned long long)failed);
		} else if (strncmp(line, "exit", 4) == 0) {
			break;
		} else {
			printf("error %s", line);
		}
		fflush(stdout);
	}
	__atomic_store_n(&stop, 1, __ATOMIC_RELEASE);
	if (running)
		pthread_join(th, NULL);
	return failed != 0;
}
