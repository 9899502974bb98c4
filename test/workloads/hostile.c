/* A hostile tenant (issue 17 item 3), linked against its own libcudart.so.12
 * (test/stubs/hostile_cudart.c). It tries to fill profi's node-wide maps:
 *
 *   streams:  N async copies, each on its own fake stream handle (rc 0);
 *   launches: N launches, on the same N stream handles;
 *   mallocs:  N allocations of 4096 bytes, never freed (N live pointers);
 *   errors:   N async copies on the default stream returning the codes 1..N.
 *
 * Besides, against the capture and graph maps (issue 30 item 2):
 *
 *   "captures N": N captures begun, one per fake stream handle, never
 *     ended (N open captures) -> {"captures":N};
 *   "graphids N": N times, a capture into one graph (cudaStreamBeginCaptureToGraph
 *     on one stream and graph handle) ended with cudaStreamEndCapture, which
 *     hands out a new graph handle each time -> {"graphids":N}.
 *
 * And against the device ordinals (issue 47 item 3):
 *
 *   "devices N": for each ordinal 0..N-1, cudaSetDevice (its runtime
 *     accepts any) and one copy on the default stream -> {"devices":N}.
 *
 * stdin protocol: prints "ready <pid>"; "go" -> the four phases, in that
 * order -> one JSON line {"n":N,"streams":N,"launches":N,"mallocs":N,
 * "errors":N}; "exit" or EOF -> exit 0. Usage: hostile [N] (default 3000). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
	unsigned x, y, z;
} hostile_dim3;

void hostile_result(int rc);
int cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, void *stream);
int cudaLaunchKernel(const void *fn, hostile_dim3 grid, hostile_dim3 block, void **args,
		     size_t shmem, void *stream);
int cudaMalloc(void **p, size_t size);
int cudaStreamBeginCapture(void *stream, int mode);
int cudaStreamBeginCaptureToGraph(void *stream, void *graph, const void *deps, const void *edges,
				  size_t n, int mode);
int cudaStreamEndCapture(void *stream, void **graph);
int cudaSetDevice(int device);

/* The i-th fake stream handle: never 0 (default) nor ~0. */
static void *stream_of(long i) { return (void *)(uintptr_t)(0x10000 + 16 * i); }

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 3000, i;
	char line[64];
	char buf[16];
	hostile_dim3 one = {1, 1, 1};

	setvbuf(stdout, NULL, _IOLBF, 0);
	printf("ready %d\n", (int)getpid());
	while (fgets(line, sizeof(line), stdin)) {
		if (!strcmp(line, "exit\n"))
			break;
		if (sscanf(line, "captures %ld", &n) == 1) {
			for (i = 0; i < n; i++)
				cudaStreamBeginCapture(stream_of(i), 0);
			printf("{\"captures\":%ld}\n", n);
			continue;
		}
		if (sscanf(line, "graphids %ld", &n) == 1) {
			for (i = 0; i < n; i++) {
				void *g;

				cudaStreamBeginCaptureToGraph(stream_of(0), (void *)0x4000, NULL, NULL, 0,
							      0);
				cudaStreamEndCapture(stream_of(0), &g);
			}
			printf("{\"graphids\":%ld}\n", n);
			continue;
		}
		if (sscanf(line, "devices %ld", &n) == 1) {
			for (i = 0; i < n; i++) {
				cudaSetDevice((int)i);
				cudaMemcpyAsync(buf, buf, sizeof(buf), 1, NULL);
			}
			printf("{\"devices\":%ld}\n", n);
			continue;
		}
		if (strcmp(line, "go\n")) {
			fprintf(stderr, "unknown command %s", line);
			return 1;
		}
		hostile_result(0);
		for (i = 0; i < n; i++)
			cudaMemcpyAsync(buf, buf, sizeof(buf), 1, stream_of(i));
		for (i = 0; i < n; i++)
			cudaLaunchKernel((void *)main, one, one, NULL, 0, stream_of(i));
		for (i = 0; i < n; i++) {
			void *p;

			cudaMalloc(&p, 4096);
		}
		for (i = 0; i < n; i++) {
			hostile_result((int)(i + 1));
			cudaMemcpyAsync(buf, buf, sizeof(buf), 1, NULL);
		}
		hostile_result(0);
		printf("{\"n\":%ld,\"streams\":%ld,\"launches\":%ld,\"mallocs\":%ld,\"errors\":%ld}\n",
		       n, n, n, n, n);
	}
	return 0;
}
