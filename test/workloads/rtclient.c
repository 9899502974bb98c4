/* Calls every CUDA Runtime function profi probes through a runtime it
 * dlopens by path, as an application linked against NVIDIA's libcudart
 * does, a known number of times each, and prints what each call returned.
 * Made for NVIDIA's own libcudart.so.11.8 on a machine without a GPU:
 * every call fails cleanly (cudaErrorNoDevice, 100, when the driver library
 * is found; cudaErrorInsufficientDriver, 35, when it is not), so the
 * arguments only need to be well-formed. Functions the runtime does not
 * export are skipped and not reported. With an NVTX library, the launches
 * run inside an nvtxRangePushA("decode")/nvtxRangePop range.
 *
 * Usage: rtclient LIBCUDART NVTX_LIB|- ITERS. stdin protocol: prints
 * "ready <pid>"; "go" -> the calls -> one JSON line
 * {"calls":{fn:{rc:n}},"ranges":n}; EOF -> exit 0. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_stub.h"

/* A host function standing in for a kernel's host stub. */
void _Z12rtclient_nopv(void);
void _Z12rtclient_nopv(void) {}

static void *rt;
static const char *sep = "";

/* Function types of the calls made, by argument shape. */
typedef cudaError_t (*alloc_fn)(void **, size_t);
typedef cudaError_t (*alloc_async_fn)(void **, size_t, cudaStream_t);
typedef cudaError_t (*alloc_managed_fn)(void **, size_t, unsigned);
typedef cudaError_t (*ptr_fn)(void *);
typedef cudaError_t (*ptr_stream_fn)(void *, cudaStream_t);
typedef cudaError_t (*copy_fn)(void *, const void *, size_t, enum cudaMemcpyKind);
typedef cudaError_t (*copy_async_fn)(void *, const void *, size_t, enum cudaMemcpyKind, cudaStream_t);
typedef cudaError_t (*peer_fn)(void *, int, const void *, int, size_t);
typedef cudaError_t (*peer_async_fn)(void *, int, const void *, int, size_t, cudaStream_t);
typedef cudaError_t (*copy2d_fn)(void *, size_t, const void *, size_t, size_t, size_t, enum cudaMemcpyKind);
typedef cudaError_t (*copy2d_async_fn)(void *, size_t, const void *, size_t, size_t, size_t,
				       enum cudaMemcpyKind, cudaStream_t);
typedef cudaError_t (*set_fn)(void *, int, size_t);
typedef cudaError_t (*set_async_fn)(void *, int, size_t, cudaStream_t);
typedef cudaError_t (*stream_fn)(cudaStream_t);
typedef cudaError_t (*void_fn)(void);
typedef cudaError_t (*int_fn)(int);
typedef cudaError_t (*launch_fn)(const void *, dim3, dim3, void **, size_t, cudaStream_t);
typedef cudaError_t (*launch_ex_fn)(const cudaLaunchConfig_t *, const void *, void **);
typedef cudaError_t (*graph_launch_fn)(cudaGraphExec_t, cudaStream_t);
typedef cudaError_t (*graph_inst_fn)(cudaGraphExec_t *, cudaGraph_t, unsigned long long);
typedef int (*push_fn)(const char *);
typedef int (*pop_fn)(void);

/* Return codes seen per function, printed as "fn":{"rc":n,...}. */
#define MAX_RC 8
struct tally {
	int rc[MAX_RC];
	unsigned long n[MAX_RC];
	int used;
};

static void count(struct tally *t, int rc)
{
	for (int i = 0; i < t->used; i++)
		if (t->rc[i] == rc) {
			t->n[i]++;
			return;
		}
	if (t->used == MAX_RC) {
		fprintf(stderr, "rtclient: too many return codes\n");
		exit(1);
	}
	t->rc[t->used] = rc;
	t->n[t->used++] = 1;
}

static void print(const char *name, const struct tally *t)
{
	if (!t->used)
		return;
	printf("%s\"%s\":{", sep, name);
	for (int i = 0; i < t->used; i++)
		printf("%s\"%d\":%lu", i ? "," : "", t->rc[i], t->n[i]);
	printf("}");
	sep = ",";
}

/* CALL(type, name, args...): ITERS calls of name if the runtime exports it. */
#define CALL(type, name, ...)                                        \
	do {                                                         \
		type f_ = (type)dlsym(rt, #name);                    \
		struct tally t_ = {0};                               \
		for (long i_ = 0; f_ && i_ < iters; i_++)            \
			count(&t_, f_(__VA_ARGS__));                 \
		print(#name, &t_);                                   \
	} while (0)

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: rtclient LIBCUDART NVTX_LIB|- ITERS\n");
		return 2;
	}
	rt = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (!rt) {
		fprintf(stderr, "rtclient: %s\n", dlerror());
		return 1;
	}
	void *nvtx = strcmp(argv[2], "-") ? dlopen(argv[2], RTLD_NOW | RTLD_LOCAL) : NULL;
	if (strcmp(argv[2], "-") && !nvtx) {
		fprintf(stderr, "rtclient: %s\n", dlerror());
		return 1;
	}
	push_fn push = nvtx ? (push_fn)dlsym(nvtx, "nvtxRangePushA") : NULL;
	pop_fn pop = nvtx ? (pop_fn)dlsym(nvtx, "nvtxRangePop") : NULL;
	long iters = strtol(argv[3], NULL, 10), ranges = 0;
	static char host[4096], host2[4096];
	void *p = NULL;
	cudaGraphExec_t exec = NULL;
	const void *fn = (const void *)_Z12rtclient_nopv;
	dim3 grid = {2, 1, 1}, block = {64, 1, 1};
	cudaLaunchConfig_t cfg = {.gridDim = grid, .blockDim = block};
	char line[64];

	printf("ready %d\n", (int)getpid());
	fflush(stdout);
	if (!fgets(line, sizeof(line), stdin) || strncmp(line, "go", 2))
		return 0;
	printf("{\"calls\":{");
	CALL(alloc_fn, cudaMalloc, &p, 4096);
	CALL(ptr_fn, cudaFree, NULL);
	CALL(copy_fn, cudaMemcpy, host, host2, 512, cudaMemcpyHostToHost);
	CALL(copy_async_fn, cudaMemcpyAsync, host, host2, 512, cudaMemcpyHostToHost, NULL);
	CALL(alloc_async_fn, cudaMallocAsync, &p, 4096, NULL);
	CALL(ptr_stream_fn, cudaFreeAsync, NULL, NULL);
	CALL(graph_inst_fn, cudaGraphInstantiate, &exec, NULL, 0);
	CALL(graph_launch_fn, cudaGraphLaunch, NULL, NULL);
	CALL(copy_async_fn, cudaMemcpyAsync_ptsz, host, host2, 512, cudaMemcpyHostToHost, NULL);
	CALL(peer_fn, cudaMemcpyPeer, host, 0, host2, 0, 512);
	CALL(peer_async_fn, cudaMemcpyPeerAsync, host, 0, host2, 0, 512, NULL);
	CALL(copy2d_fn, cudaMemcpy2D, host, 64, host2, 64, 64, 8, cudaMemcpyHostToHost);
	CALL(copy2d_async_fn, cudaMemcpy2DAsync, host, 64, host2, 64, 64, 8, cudaMemcpyHostToHost, NULL);
	CALL(alloc_managed_fn, cudaMallocManaged, &p, 4096, cudaMemAttachGlobal);
	CALL(alloc_fn, cudaMallocHost, &p, 4096);
	CALL(ptr_fn, cudaFreeHost, NULL);
	CALL(set_fn, cudaMemset, host, 0, 512);
	CALL(set_async_fn, cudaMemsetAsync, host, 0, 512, NULL);
	CALL(stream_fn, cudaStreamSynchronize, NULL);
	CALL(stream_fn, cudaEventSynchronize, NULL);
	CALL(void_fn, cudaDeviceSynchronize);
	CALL(int_fn, cudaSetDevice, 0);
	CALL(copy_fn, cudaMemcpy_ptds, host, host2, 512, cudaMemcpyHostToHost);
	CALL(copy2d_fn, cudaMemcpy2D_ptds, host, 64, host2, 64, 64, 8, cudaMemcpyHostToHost);
	CALL(copy2d_async_fn, cudaMemcpy2DAsync_ptsz, host, 64, host2, 64, 64, 8, cudaMemcpyHostToHost, NULL);
	CALL(set_fn, cudaMemset_ptds, host, 0, 512);
	CALL(set_async_fn, cudaMemsetAsync_ptsz, host, 0, 512, NULL);
	CALL(stream_fn, cudaStreamSynchronize_ptsz, NULL);
	CALL(graph_launch_fn, cudaGraphLaunch_ptsz, NULL, NULL);
	CALL(alloc_async_fn, cudaMallocAsync_ptsz, &p, 4096, NULL);
	CALL(ptr_stream_fn, cudaFreeAsync_ptsz, NULL, NULL);
	if (push) {
		push("decode"); /* returns the nesting level, or < 0 with no tool attached */
		ranges++;
	}
	CALL(launch_fn, cudaLaunchKernel, fn, grid, block, NULL, 0, NULL);
	CALL(launch_fn, cudaLaunchKernel_ptsz, fn, grid, block, NULL, 0, NULL);
	CALL(launch_ex_fn, cudaLaunchKernelExC, &cfg, fn, NULL);
	CALL(launch_ex_fn, cudaLaunchKernelExC_ptsz, &cfg, fn, NULL);
	CALL(launch_fn, cudaLaunchCooperativeKernel, fn, grid, block, NULL, 0, NULL);
	CALL(launch_fn, cudaLaunchCooperativeKernel_ptsz, fn, grid, block, NULL, 0, NULL);
	if (pop)
		pop();
	printf("},\"ranges\":%ld}\n", ranges);
	fflush(stdout);
	while (fgets(line, sizeof(line), stdin))
		;
	return 0;
}
