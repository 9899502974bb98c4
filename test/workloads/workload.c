/* Fake inference server driving the stub libcudart.so.12 and printing exact
 * ground truth, so tests can compare what the agent counted with what
 * happened. Ground truth is tallied from the arguments passed and the codes
 * returned, never from formulas. Built twice (internal/testutil/build.go):
 * linked against the stub, and with -DPROFI_DLOPEN resolving every function
 * with dlsym at runtime, the way frameworks load cudart.
 *
 * stdin protocol: prints "ready <pid>"; "load" -> dlopen -> "loaded" (the
 * linked build just answers); "go" -> one measured phase -> one JSON line of
 * cumulative totals; "exit" or EOF -> exit 0. */
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef PROFI_DLOPEN
#include <dlfcn.h>
#endif

#include "cuda_stub.h"

#ifdef PROFI_DLOPEN
#define DECLARE_PTR(name, params) static cudaError_t(*p_##name) params;
PROFI_CUDA_CORE_FUNCS(DECLARE_PTR)
PROFI_CUDA_GRAPH_FUNCS(DECLARE_PTR)
#define CUDA(name) p_##name
#else
#define CUDA(name) name
#endif

/* The probed functions, in ground-truth order. */
enum { F_MALLOC, F_FREE, F_MEMCPY, F_MEMCPY_ASYNC, F_LAUNCH, F_MALLOC_ASYNC,
       F_FREE_ASYNC, F_GRAPH_LAUNCH, F_GRAPH_INST, NFN };
static const char *const fn_name[NFN] = {
	"cudaMalloc", "cudaFree", "cudaMemcpy", "cudaMemcpyAsync",
	"cudaLaunchKernel", "cudaMallocAsync", "cudaFreeAsync",
	"cudaGraphLaunch", "cudaGraphInstantiate",
};
static const int fn_has_stream[NFN] = {0, 0, 0, 1, 1, 1, 1, 1, 0};
/* Memcpy kinds 0..4, then "unknown" for invalid kinds. */
static const char *const kind_name[6] = {"h2h", "h2d", "d2h", "d2d", "default", "unknown"};

#define MAX_CODES 8
struct stream_row {
	uintptr_t handle; /* 0 = default stream */
	uint64_t n[NFN];
};
/* Per-thread tallies, merged into the global one at join: no locking. */
struct tally {
	uint64_t calls[NFN];
	struct { int code; uint64_t n; } err[NFN][MAX_CODES];
	struct stream_row *streams;
	size_t nstreams;
	uint64_t memcpy_bytes[5], memcpy_calls[6];
	uint64_t malloc_bytes, free_bytes;
	uint64_t launches, grid_blocks, block_threads, shared_bytes;
};

static struct {
	int threads, iters, launches, memcpys, mallocs, graphs, streams, errors;
	const char *lib;
} opt = {2, 200, 20, 2, 1, 1, 2, 1, "libcudart.so.12"};
static int have_graphs = 1; /* 0 when the library lacks the graph symbols */
static struct tally total;

static void die(const char *msg)
{
	fprintf(stderr, "workload: %s\n", msg);
	exit(1);
}

static void add_stream(struct tally *t, uintptr_t h, int fn, uint64_t n)
{
	size_t i;
	for (i = 0; i < t->nstreams && t->streams[i].handle != h; i++)
		;
	if (i == t->nstreams) {
		t->streams = realloc(t->streams, (i + 1) * sizeof(*t->streams));
		if (!t->streams)
			die("out of memory");
		memset(&t->streams[i], 0, sizeof(*t->streams));
		t->streams[i].handle = h;
		t->nstreams++;
	}
	t->streams[i].n[fn] += n;
}

static void add_err(struct tally *t, int fn, int code, uint64_t n)
{
	for (int i = 0; i < MAX_CODES; i++) {
		if (t->err[fn][i].n == 0 || t->err[fn][i].code == code) {
			t->err[fn][i].code = code;
			t->err[fn][i].n += n;
			return;
		}
	}
	die("too many distinct error codes");
}

/* Counts one call of fn on stream (ignored for stream-less functions). */
static void record(struct tally *t, int fn, cudaStream_t stream, cudaError_t rc)
{
	t->calls[fn]++;
	if (fn_has_stream[fn])
		add_stream(t, (uintptr_t)stream, fn, 1);
	if (rc != cudaSuccess)
		add_err(t, fn, rc, 1);
}

/* Call wrappers: each makes exactly one CUDA call and accounts for it. */
static void *dev_malloc(struct tally *t, size_t size, int async, cudaStream_t s)
{
	void *p = NULL;
	cudaError_t rc = async ? CUDA(cudaMallocAsync)(&p, size, s) : CUDA(cudaMalloc)(&p, size);
	record(t, async ? F_MALLOC_ASYNC : F_MALLOC, s, rc);
	if (rc == cudaSuccess)
		t->malloc_bytes += size;
	return rc == cudaSuccess ? p : NULL;
}

/* size is what p was allocated with; freeing NULL frees nothing. */
static void dev_free(struct tally *t, void *p, size_t size, int async, cudaStream_t s)
{
	cudaError_t rc = async ? CUDA(cudaFreeAsync)(p, s) : CUDA(cudaFree)(p);
	record(t, async ? F_FREE_ASYNC : F_FREE, s, rc);
	if (rc == cudaSuccess && p)
		t->free_bytes += size;
}

static void copy(struct tally *t, void *dst, const void *src, size_t count,
		 int kind, int async, cudaStream_t s)
{
	cudaError_t rc = async ? CUDA(cudaMemcpyAsync)(dst, src, count, kind, s)
			       : CUDA(cudaMemcpy)(dst, src, count, kind);
	record(t, async ? F_MEMCPY_ASYNC : F_MEMCPY, s, rc);
	int k = kind >= 0 && kind <= 4 ? kind : 5;
	t->memcpy_calls[k]++;
	if (rc == cudaSuccess && k < 5)
		t->memcpy_bytes[k] += count;
}

static void launch(struct tally *t, const void *func, dim3 grid, dim3 block,
		   void **args, size_t shared, cudaStream_t s)
{
	cudaError_t rc = CUDA(cudaLaunchKernel)(func, grid, block, args, shared, s);
	record(t, F_LAUNCH, s, rc);
	t->launches++;
	t->grid_blocks += (uint64_t)grid.x * grid.y * grid.z;
	t->block_threads += (uint64_t)block.x * block.y * block.z;
	t->shared_bytes += shared;
}

static void graph_launch(struct tally *t, cudaGraphExec_t exec, cudaStream_t s)
{
	record(t, F_GRAPH_LAUNCH, s, CUDA(cudaGraphLaunch)(exec, s));
}

/* Host-side kernel stubs: real code passes such addresses as func. Distinct
 * bodies so the linker cannot fold them into one address. */
static volatile int kernel_sink;
static void k_gemm(void) { kernel_sink = 1; }
static void k_softmax(void) { kernel_sink = 2; }
static void k_layernorm(void) { kernel_sink = 3; }
static void (*const kernels[3])(void) = {k_gemm, k_softmax, k_layernorm};

struct worker {
	pthread_t tid;
	int id;
	struct tally t;
};

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	struct tally *t = &w->t;
	int ns = opt.streams + 1;
	cudaStream_t *s = calloc(ns, sizeof(*s)); /* s[0] = NULL: default stream */
	static char host[2][1 << 16]; /* never touched: the stub ignores buffers */
	void *bogus = (void *)(uintptr_t)0xdead0000; /* never allocated */

	if (!s)
		die("out of memory");
	for (int i = 1; i < ns; i++)
		if (CUDA(cudaStreamCreate)(&s[i]) != cudaSuccess)
			die("cudaStreamCreate failed");

	/* Resident "weights" and "KV cache", never freed: non-zero active memory. */
	void *weights = dev_malloc(t, 64 << 20, 0, NULL);
	void *kv = dev_malloc(t, 8 << 20, 1, s[ns - 1]);
	dev_free(t, NULL, 0, 0, NULL); /* legal no-op, as frameworks do */
	cudaGraphExec_t exec = NULL;
	if (have_graphs) {
		cudaGraph_t graph = (cudaGraph_t)(uintptr_t)(0x3000 + w->id * 0x10);
		record(t, F_GRAPH_INST, NULL, CUDA(cudaGraphInstantiate)(&exec, graph, 0));
	}

	int n = 1024;
	void *args[] = {&weights, &kv, &n};
	for (int i = 0; i < opt.iters; i++) {
		for (int j = 0; j < opt.launches; j++) {
			int k = i + j;
			dim3 grid = {k % 7 + 1, 2, 1}, block = {32 * (k % 4 + 1), 2, 1};
			launch(t, (const void *)kernels[k % 3], grid, block, args,
			       (k % 3) * 1024, s[k % ns]);
		}
		for (int kind = 0; kind <= 4; kind++) {
			/* Host or device side per kind; the stub never looks. */
			void *dst = kind == 0 || kind == 2 ? host[0] : weights;
			void *src = kind == 2 || kind == 3 ? kv : host[1];
			for (int m = 0; m < opt.memcpys; m++) {
				size_t count = 4096 * (kind + 1) + 256 * ((i + m) % 8);
				copy(t, dst, src, count, kind, 0, NULL);
				copy(t, dst, src, count / 2, kind, 1, s[(i + m + kind) % ns]);
			}
		}
		for (int m = 0; m < opt.mallocs; m++) {
			size_t size = (size_t)((i + m) % 4 + 1) << 20;
			cudaStream_t st = s[(i + m) % ns];
			dev_free(t, dev_malloc(t, size, 0, NULL), size, 0, NULL);
			dev_free(t, dev_malloc(t, size / 2, 1, st), size / 2, 1, st);
		}
		for (int g = 0; g < opt.graphs && have_graphs; g++)
			graph_launch(t, exec, s[(i + g) % ns]);

		if (opt.errors && i % 10 == 0) {
			/* Deterministic failures, one per error path of the stub. */
			cudaStream_t st = s[i % ns];
			dim3 one = {1, 1, 1};
			dev_malloc(t, 1ULL << 41, 0, NULL);        /* 2 */
			dev_malloc(t, 0, 1, st);                    /* 2 */
			copy(t, host[0], host[1], 64, 7, 0, NULL);  /* 21 */
			copy(t, host[0], host[1], 64, 9, 1, st);    /* 21 */
			dev_free(t, bogus, 0, 0, NULL);             /* 1 */
			dev_free(t, bogus, 0, 1, st);               /* 1 */
			launch(t, NULL, one, one, args, 0, st);     /* 98 */
			if (have_graphs)
				graph_launch(t, NULL, st);          /* 400 */
		}
	}
	free(s);
	return NULL;
}

static void merge(struct tally *dst, const struct tally *src)
{
	for (int f = 0; f < NFN; f++) {
		dst->calls[f] += src->calls[f];
		for (int c = 0; c < MAX_CODES && src->err[f][c].n; c++)
			add_err(dst, f, src->err[f][c].code, src->err[f][c].n);
		for (size_t i = 0; i < src->nstreams; i++)
			if (src->streams[i].n[f])
				add_stream(dst, src->streams[i].handle, f, src->streams[i].n[f]);
	}
	for (int k = 0; k < 6; k++) {
		dst->memcpy_calls[k] += src->memcpy_calls[k];
		if (k < 5)
			dst->memcpy_bytes[k] += src->memcpy_bytes[k];
	}
	dst->malloc_bytes += src->malloc_bytes;
	dst->free_bytes += src->free_bytes;
	dst->launches += src->launches;
	dst->grid_blocks += src->grid_blocks;
	dst->block_threads += src->block_threads;
	dst->shared_bytes += src->shared_bytes;
}

static void print_truth(const struct tally *t)
{
	printf("{\"pid\":%d,\"calls\":{", (int)getpid());
	for (int f = 0; f < NFN; f++)
		printf("%s\"%s\":%" PRIu64, f ? "," : "", fn_name[f], t->calls[f]);
	printf("},\"calls_by_stream\":{");
	for (int f = 0, first = 1; f < NFN; f++) {
		if (!fn_has_stream[f] || !t->calls[f])
			continue;
		printf("%s\"%s\":{", first ? "" : ",", fn_name[f]);
		first = 0;
		for (size_t i = 0, sfirst = 1; i < t->nstreams; i++) {
			const struct stream_row *r = &t->streams[i];
			if (!r->n[f])
				continue;
			if (r->handle)
				printf("%s\"%#" PRIxPTR "\":%" PRIu64, sfirst ? "" : ",", r->handle, r->n[f]);
			else
				printf("%s\"default\":%" PRIu64, sfirst ? "" : ",", r->n[f]);
			sfirst = 0;
		}
		printf("}");
	}
	printf("},\"errors\":{");
	for (int f = 0, first = 1; f < NFN; f++) {
		if (!t->err[f][0].n)
			continue;
		printf("%s\"%s\":{", first ? "" : ",", fn_name[f]);
		first = 0;
		for (int c = 0; c < MAX_CODES && t->err[f][c].n; c++)
			printf("%s\"%d\":%" PRIu64, c ? "," : "", t->err[f][c].code, t->err[f][c].n);
		printf("}");
	}
	printf("},\"memcpy_bytes\":{");
	for (int k = 0; k < 5; k++)
		printf("%s\"%s\":%" PRIu64, k ? "," : "", kind_name[k], t->memcpy_bytes[k]);
	printf("},\"memcpy_calls\":{");
	for (int k = 0; k < 6; k++)
		printf("%s\"%s\":%" PRIu64, k ? "," : "", kind_name[k], t->memcpy_calls[k]);
	printf("},\"malloc_bytes\":%" PRIu64 ",\"free_bytes\":%" PRIu64
	       ",\"active_bytes\":%" PRIu64 ",\"launches\":%" PRIu64
	       ",\"launch_grid_blocks\":%" PRIu64 ",\"launch_block_threads\":%" PRIu64
	       ",\"launch_shared_bytes\":%" PRIu64 "}\n",
	       t->malloc_bytes, t->free_bytes, t->malloc_bytes - t->free_bytes,
	       t->launches, t->grid_blocks, t->block_threads, t->shared_bytes);
	fflush(stdout);
}

static void run_phase(void)
{
	struct worker *w = calloc(opt.threads + 1, sizeof(*w)); /* +1: never calloc(0) */
	if (!w)
		die("out of memory");
	for (int i = 0; i < opt.threads; i++) {
		w[i].id = i;
		if (pthread_create(&w[i].tid, NULL, worker_main, &w[i]))
			die("pthread_create failed");
	}
	for (int i = 0; i < opt.threads; i++) {
		pthread_join(w[i].tid, NULL);
		merge(&total, &w[i].t);
		free(w[i].t.streams);
	}
	free(w);
	print_truth(&total);
}

#ifdef PROFI_DLOPEN
static const int needs_load = 1;
static void load(void)
{
	void *h = dlopen(opt.lib, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		fprintf(stderr, "workload: dlopen %s: %s\n", opt.lib, dlerror());
		exit(1);
	}
#define RESOLVE(name, params)                                              \
	if (!(*(void **)&p_##name = dlsym(h, #name))) {                    \
		fprintf(stderr, "workload: dlsym %s: %s\n", #name, dlerror()); \
		exit(1);                                                   \
	}
	PROFI_CUDA_CORE_FUNCS(RESOLVE)
#undef RESOLVE
	/* Graph symbols are optional: a library lacking them still serves the
	 * rest, and the ground truth then simply has no graph calls. */
	*(void **)&p_cudaGraphLaunch = dlsym(h, "cudaGraphLaunch");
	*(void **)&p_cudaGraphInstantiate = dlsym(h, "cudaGraphInstantiate");
	have_graphs = p_cudaGraphLaunch && p_cudaGraphInstantiate;
	if (!have_graphs)
		fprintf(stderr, "workload: no graph symbols in %s, skipping graphs\n", opt.lib);
}

#else
static const int needs_load = 0;
static void load(void) {} /* linked at build time: nothing to do */
#endif

int main(int argc, char **argv)
{
	static const struct { const char *name; int *v; long max; } int_opts[] = {
		{"--threads", &opt.threads, 1024}, {"--iters", &opt.iters, 100000000},
		{"--launches", &opt.launches, 100000}, {"--memcpy", &opt.memcpys, 100000},
		{"--mallocs", &opt.mallocs, 100000}, {"--graphs", &opt.graphs, 100000},
		{"--streams", &opt.streams, 64},
	};
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		size_t o;
		for (o = 0; o < sizeof(int_opts) / sizeof(int_opts[0]); o++)
			if (!strcmp(a, int_opts[o].name))
				break;
		if (o < sizeof(int_opts) / sizeof(int_opts[0]) && i + 1 < argc) {
			char *end;
			long v = strtol(argv[++i], &end, 10);
			if (*end || end == argv[i] || v < 0 || v > int_opts[o].max)
				die("bad option value");
			*int_opts[o].v = (int)v;
		} else if (!strcmp(a, "--errors") || !strcmp(a, "--no-errors")) {
			opt.errors = a[2] == 'e';
		} else if (!strcmp(a, "--lib") && i + 1 < argc) {
			opt.lib = argv[++i];
		} else {
			fprintf(stderr, "workload: bad argument %s\n", a);
			return 2;
		}
	}

	printf("ready %d\n", (int)getpid());
	fflush(stdout);
	int loaded = 0;
	char line[64];
	while (fgets(line, sizeof(line), stdin)) {
		line[strcspn(line, "\r\n")] = 0;
		if (!strcmp(line, "load")) {
			if (!loaded)
				load();
			loaded = 1;
			printf("loaded\n");
			fflush(stdout);
		} else if (!strcmp(line, "go")) {
			if (needs_load && !loaded)
				die("\"go\" before \"load\"");
			run_phase();
		} else if (!strcmp(line, "exit")) {
			break;
		} else {
			fprintf(stderr, "workload: unexpected command \"%s\"\n", line);
			return 2;
		}
	}
	return 0;
}
