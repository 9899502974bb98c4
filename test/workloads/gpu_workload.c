/*
 * GPU attribution workload: one thread per ordinal given with --ordinals
 * calls cudaSetDevice(ordinal), then makes --calls cudaMemcpy and
 * cudaLaunchKernel calls and one cudaMalloc; the main thread, which never
 * calls cudaSetDevice (CUDA's default device), makes --calls cudaMemcpy
 * calls and frees every thread's allocation, so each free runs on another
 * device than its allocation.
 *
 * stdin protocol (as workload.c): prints "ready <pid>"; "go" runs one phase
 * and prints the cumulative ground truth as one JSON line, by ordinal
 * ("-1": no cudaSetDevice); "exit" or EOF ends.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_stub.h"

#define MAX_THREADS 16
#define ALLOC_BYTES 4096

struct thread {
	pthread_t t;
	int ordinal;
	void *alloc;
	uint64_t memcpy, launches, set_device, malloc_bytes, frees;
};

static struct thread threads[MAX_THREADS];
static int nthreads;
static long calls = 100;
static uint64_t main_memcpy;

static void die(const char *msg)
{
	fprintf(stderr, "gpu_workload: %s\n", msg);
	exit(1);
}

static void kernel(void)
{
}

static void *work(void *arg)
{
	struct thread *th = arg;
	static char buf[64];
	dim3 one = {1, 1, 1};

	if (cudaSetDevice(th->ordinal) != cudaSuccess)
		die("cudaSetDevice failed");
	th->set_device++;
	for (long i = 0; i < calls; i++) {
		if (cudaMemcpy(buf, buf + 32, 32, cudaMemcpyDeviceToDevice) != cudaSuccess)
			die("cudaMemcpy failed");
		th->memcpy++;
		cudaLaunchKernel((const void *)kernel, one, one, NULL, 0, NULL);
		th->launches++;
	}
	if (cudaMalloc(&th->alloc, ALLOC_BYTES) != cudaSuccess)
		die("cudaMalloc failed");
	th->malloc_bytes += ALLOC_BYTES;
	return NULL;
}

static void run_phase(void)
{
	static char buf[64];

	for (int i = 0; i < nthreads; i++)
		if (pthread_create(&threads[i].t, NULL, work, &threads[i]))
			die("pthread_create failed");
	for (int i = 0; i < nthreads; i++)
		pthread_join(threads[i].t, NULL);
	for (long i = 0; i < calls; i++) {
		if (cudaMemcpy(buf, buf + 32, 32, cudaMemcpyDeviceToDevice) != cudaSuccess)
			die("cudaMemcpy failed");
		main_memcpy++;
	}
	/* Frees on the main thread count on each allocation's device. */
	for (int i = 0; i < nthreads; i++) {
		if (cudaFree(threads[i].alloc) != cudaSuccess)
			die("cudaFree failed");
		threads[i].frees++;
	}

	printf("{\"pid\":%d,\"threads\":[", (int)getpid());
	for (int i = 0; i < nthreads; i++) {
		struct thread *th = &threads[i];
		printf("%s{\"ordinal\":%d,\"set_device\":%" PRIu64 ",\"memcpy\":%" PRIu64
		       ",\"launches\":%" PRIu64 ",\"malloc_bytes\":%" PRIu64 ",\"frees\":%" PRIu64 "}",
		       i ? "," : "", th->ordinal, th->set_device, th->memcpy, th->launches,
		       th->malloc_bytes, th->frees);
	}
	printf("],\"main_memcpy\":%" PRIu64 "}\n", main_memcpy);
	fflush(stdout);
}

int main(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--calls") && i + 1 < argc) {
			calls = strtol(argv[++i], NULL, 10);
		} else if (!strcmp(argv[i], "--ordinals") && i + 1 < argc) {
			char *s = argv[++i], *tok, *save = NULL;

			for (tok = strtok_r(s, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
				if (nthreads == MAX_THREADS)
					die("too many ordinals");
				threads[nthreads++].ordinal = atoi(tok);
			}
		} else {
			die("usage: gpu_workload [--calls N] [--ordinals a,b,...]");
		}
	}
	printf("ready %d\n", (int)getpid());
	fflush(stdout);
	char line[64];
	while (fgets(line, sizeof(line), stdin)) {
		line[strcspn(line, "\r\n")] = 0;
		if (!strcmp(line, "go")) {
			run_phase();
		} else if (!strcmp(line, "exit")) {
			break;
		} else {
			fprintf(stderr, "gpu_workload: unexpected command \"%s\"\n", line);
			return 2;
		}
	}
	return 0;
}
