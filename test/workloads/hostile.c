/* A hostile tenant (issue 17 item 3), linked against its own libcudart.so.12
 * (test/stubs/hostile_cudart.c). It tries to fill profi's node-wide maps:
 *
 *   streams:  N async copies, each on its own fake stream handle (rc 0);
 *   launches: N launches, on the same N stream handles;
 *   mallocs:  N allocations of 4096 bytes, never freed (N live pointers);
 *   errors:   N async copies on the default stream returning the codes 1..N.
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
