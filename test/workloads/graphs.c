/* Uses CUDA graphs the way PyTorch (torch.cuda.graphs) and vLLM/SGLang
 * (one graph per batch size, replayed for every decode step) do, against the
 * stub libcudart.so.13 and libcuda.so.1, and prints its exact ground truth.
 *
 * After "go": eager warm-up launches through the runtime (cudaLaunchKernel),
 * CUDA 13's __cudaLaunchKernel[_ptsz] and the driver (cuLaunchKernel), and
 * copies; then one graph per batch size, captured on a side stream that
 * forks a second stream through an event and joins it back (launches
 * through all three APIs, an H2D cudaMemcpyAsync and a cudaMemsetAsync
 * recorded inside), instantiated with flags; one capture through the driver
 * API; one graph built node by node, with a child graph; a second
 * executable graph of one graph (cudaGraphInstantiateWithParams); REPLAYS
 * replays of every executable graph on a replay stream, through
 * cudaGraphLaunch[_ptsz] and cuGraphLaunch[_ptsz]; an update of one
 * executable graph to a graph of the same topology with other kernels (it
 * succeeds; the replays after it run the new kernels) and one to a graph of
 * another topology (910: the replays after it run the old graph); failed
 * captures (capture on the legacy stream: 900; a stream synchronised while
 * capturing: 900, then 901 for the launch and the copy after it and for
 * cudaStreamEndCapture; a forked stream not joined back: 904, after which
 * neither stream captures); then everything is destroyed. Every return
 * code is checked against what CUDA returns; the graphs' node types and the
 * stub driver's own tally of what graph launches ran (its private export
 * table) are checked against the workload's model.
 *
 * Usage: graphs REPLAYS [early]. With "early", before "ready" one graph is
 * captured, instantiated and replayed once (an executable graph built before
 * any agent attached); after "go" it is replayed REPLAYS more times: those
 * replays are counted in "unknown_graph_replays", their kernels in
 * "unknown_graph_kernels", not in "graph_kernels" (the early graph moves no
 * bytes).
 *
 * Ground truth (one JSON line), everything after "go":
 *   calls: calls by exported function name, of every function in profi's
 *     operation table or among the capture and graph functions (not
 *     cudaStreamCreate, cudaEventCreate*, cudaEventDestroy,
 *     cudaStreamIsCapturing, cuGraphGetNodes, cuGraphNodeGetType,
 *     cuGetExportTable); calls_by_stream: the same by stream argument
 *     ("default" for 0 or a function without one); errors: by function and
 *     return code;
 *   launches: kernel launches that ran (eager), by kernel symbol;
 *   captured: launch calls made on a capturing stream (including those of
 *     the failed captures), by kernel symbol;
 *   graph_kernels: kernels run by replays of graphs built after "go";
 *   memcpy ("DIRECTION|STREAM") and memset ("STREAM"): bytes that moved,
 *     eager copies and sets plus the graph replays' (on the replay stream);
 *   malloc_bytes, active_bytes; grid_blocks, block_threads, shared_bytes of
 *     the eager launches; the streams' labels.
 * Stream labels are profi's: "default" for 0, else 0x%x.
 *
 * stdin protocol: prints "ready <pid>"; "go" -> the above -> the JSON line;
 * EOF -> exit 0. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_drv_stub.h"
#include "cuda_stub.h"

static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "graphs: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	exit(1);
}

/* ---- Kernels ----------------------------------------------------------- */

/* Runtime kernels: host stubs named like nvcc's (-rdynamic puts them in
 * .dynsym), registered from a constructor as nvcc's code does. Driver
 * kernels: Triton's plain names, looked up with cuModuleGetFunction. */
enum { K_GEMM, K_GEMM_FP8, K_ATTN, K_NORM, K_EARLY, NRT, K_POI = NRT, K_RED, NK };
static const char *const kname[NK] = {
	"_Z9gemm_bf16PfS_",	      /* gemm_bf16(float*, float*) */
	"_Z8gemm_fp8PfS_",	      /* gemm_fp8(float*, float*) */
	"_Z14flash_decodingPfS_i",    /* flash_decoding(float*, float*, int) */
	"_Z14rms_norm_fusedPf",	      /* rms_norm_fused(float*) */
	"_Z10early_stepPf",	      /* early_step(float*) */
	"triton_poi_fused_add_mul_0", /* driver */
	"triton_red_fused_sum_1",     /* driver */
};

static volatile int kernel_sink;
#define KERNEL_STUB(c_name, mangled, n)     \
	void c_name(void) __asm__(mangled); \
	void c_name(void) { kernel_sink = n; }
KERNEL_STUB(k_gemm, "_Z9gemm_bf16PfS_", 1)
KERNEL_STUB(k_gemm_fp8, "_Z8gemm_fp8PfS_", 2)
KERNEL_STUB(k_attn, "_Z14flash_decodingPfS_i", 3)
KERNEL_STUB(k_norm, "_Z14rms_norm_fusedPf", 4)
KERNEL_STUB(k_early, "_Z10early_stepPf", 5)
static void (*const host_stub[NRT])(void) = {k_gemm, k_gemm_fp8, k_attn, k_norm, k_early};

static const unsigned long long fatbin_data[] = {0x00100001ba55ed50ULL, 0};
static const struct {
	int magic, version;
	const unsigned long long *data;
	void *filename_or_fatbins;
} fatbin_wrapper = {0x466243b1, 1, fatbin_data, NULL};
static const char triton_image[] = "//\n// Generated by Triton (stub PTX)\n.version 8.0\n";
static void **fatbin_handle;

static void unregister_kernels(void)
{
	__cudaUnregisterFatBinary(fatbin_handle);
}

__attribute__((constructor)) static void register_kernels(void)
{
	fatbin_handle = __cudaRegisterFatBinary((void *)&fatbin_wrapper);
	for (int k = 0; k < NRT; k++)
		__cudaRegisterFunction(fatbin_handle, (const char *)host_stub[k], (char *)kname[k],
				       kname[k], -1, NULL, NULL, NULL, NULL, NULL);
	atexit(unregister_kernels);
}

/* ---- Ground truth ------------------------------------------------------ */

#define FUNCS(X)                                                                                \
	X(cudaMalloc) X(cudaFree) X(cuModuleLoadData) X(cuModuleGetFunction) X(__cudaGetKernel) \
	X(cudaLaunchKernel) X(__cudaLaunchKernel) X(__cudaLaunchKernel_ptsz) X(cuLaunchKernel)  \
	X(cuLaunchKernelEx) X(cudaMemcpy) X(cudaMemcpyAsync) X(cudaMemsetAsync)                 \
	X(cudaStreamSynchronize) X(cuMemcpyHtoDAsync_v2) X(cudaStreamBeginCapture)              \
	X(cudaStreamBeginCapture_ptsz) X(cudaStreamBeginCaptureToGraph) X(cudaStreamEndCapture) \
	X(cudaStreamEndCapture_ptsz) X(cudaEventRecord) X(cudaEventRecordWithFlags)             \
	X(cudaStreamWaitEvent) X(cudaGraphCreate) X(cudaGraphInstantiate)                       \
	X(cudaGraphInstantiateWithFlags) X(cudaGraphInstantiateWithParams)                      \
	X(cudaGraphExecUpdate) X(cudaGraphExecDestroy) X(cudaGraphDestroy)                      \
	X(cudaGraphAddKernelNode) X(cudaGraphAddMemcpyNode) X(cudaGraphAddMemcpyNode1D)         \
	X(cudaGraphAddMemsetNode) X(cudaGraphAddChildGraphNode) X(cudaGraphLaunch)              \
	X(cudaGraphLaunch_ptsz) X(cuStreamBeginCapture_v2) X(cuStreamEndCapture)                \
	X(cuGraphInstantiateWithFlags) X(cuGraphAddKernelNode) X(cuGraphAddKernelNode_v2)       \
	X(cuGraphAddMemsetNode) X(cuGraphExecDestroy) X(cuGraphDestroy) X(cuGraphLaunch)        \
	X(cuGraphLaunch_ptsz) X(cuGraphAddMemcpyNode)
enum {
#define ID(name) F_##name,
	FUNCS(ID)
#undef ID
	NFN
};
static const char *const fn_name[NFN] = {
#define NAME(name) #name,
	FUNCS(NAME)
#undef NAME
};

#define NSTREAMS 8
#define NCODES 4
static uintptr_t stream_handle[NSTREAMS] = {0}; /* [0]: the default stream */
static int nstreams = 1;
static int counting; /* after "go" */
static uint64_t calls[NFN][NSTREAMS];
static struct {
	int code;
	uint64_t n;
} errs[NFN][NCODES];
static uint64_t launches[NK], captured[NK], graph_kernels[NK];
static uint64_t unknown_replays, unknown_kernels;
static uint64_t memcpy_bytes[5][NSTREAMS], memset_bytes[NSTREAMS];
static uint64_t malloc_bytes, freed_bytes, grid_blocks, block_threads, shared_bytes;
static uint64_t launch_seq;
static const char *const dir_name[5] = {"h2h", "h2d", "d2h", "d2d", "default"};

static int stream_index(uintptr_t s)
{
	for (int i = 0; i < nstreams; i++)
		if (stream_handle[i] == s)
			return i;
	if (nstreams == NSTREAMS)
		die("too many streams");
	stream_handle[nstreams] = s;
	return nstreams++;
}

static void stream_label(uintptr_t s, char *buf, size_t n)
{
	if (s)
		snprintf(buf, n, "0x%" PRIxPTR, s);
	else
		snprintf(buf, n, "default");
}

/* Checks a call's return code against CUDA's and tallies it. */
static int tally(int f, uintptr_t stream, int want, int rc)
{
	if (rc != want)
		die("%s: returned %d, want %d", fn_name[f], rc, want);
	if (!counting)
		return rc;
	calls[f][stream_index(stream)]++;
	if (rc) {
		int i;
		for (i = 0; i < NCODES && errs[f][i].n && errs[f][i].code != rc; i++)
			;
		if (i == NCODES)
			die("too many error codes");
		errs[f][i].code = rc;
		errs[f][i].n++;
	}
	return rc;
}

/* CALL(fn, stream, expected return code, args...). */
#define CALL(fn, s, want, ...) tally(F_##fn, (uintptr_t)(s), want, (int)fn(__VA_ARGS__))

/* ---- The workload's model of its graphs ------------------------------- */

#define MAX_NODES 32
#define MAX_KERNELS 64
struct model {
	int ntypes, types[MAX_NODES]; /* top-level node types, in order */
	int nk, k[MAX_KERNELS];	      /* kernels one launch runs (child graphs' too) */
	uint64_t copy[5], set;	      /* bytes one launch copies and sets */
};

static void model_node(struct model *m, int type)
{
	if (m->ntypes == MAX_NODES)
		die("graph too big");
	m->types[m->ntypes++] = type;
}

static void model_kernel(struct model *m, int k)
{
	if (m->nk == MAX_KERNELS)
		die("graph too big");
	m->k[m->nk++] = k;
}

static void model_child(struct model *m, const struct model *c)
{
	model_node(m, CU_GRAPH_NODE_TYPE_GRAPH);
	for (int i = 0; i < c->nk; i++)
		model_kernel(m, c->k[i]);
	for (int d = 0; d < 5; d++)
		m->copy[d] += c->copy[d];
	m->set += c->set;
}

/* The graph's nodes, as the stub driver has them, are the model's. */
static void check_nodes(CUgraph g, const struct model *m, const char *what)
{
	CUgraphNode nodes[MAX_NODES];
	size_t n = MAX_NODES;
	if (cuGraphGetNodes(g, nodes, &n) != CUDA_SUCCESS || n != (size_t)m->ntypes)
		die("%s: %zu nodes, want %d", what, n, m->ntypes);
	for (size_t i = 0; i < n; i++) {
		CUgraphNodeType t;
		if (cuGraphNodeGetType(nodes[i], &t) != CUDA_SUCCESS || (int)t != m->types[i])
			die("%s: node %zu has type %d, want %d", what, i, (int)t, m->types[i]);
	}
}

/* Which capture (model) each stream records into, as CUDA does it. */
static struct {
	uintptr_t s;
	struct model *m;
} capturing[NSTREAMS];

static struct model *capture_of(uintptr_t s)
{
	for (int i = 0; i < NSTREAMS; i++)
		if (capturing[i].m && capturing[i].s == s)
			return capturing[i].m;
	return NULL;
}

static void set_capture(uintptr_t s, struct model *m)
{
	for (int i = 0; i < NSTREAMS; i++)
		if (capturing[i].s == s || !capturing[i].m) {
			capturing[i].s = s;
			capturing[i].m = m;
			return;
		}
	die("too many capturing streams");
}

static void end_capture(struct model *m)
{
	for (int i = 0; i < NSTREAMS; i++)
		if (capturing[i].m == m)
			capturing[i].m = NULL;
}

/* ---- Launches, copies, sets, replays ----------------------------------- */

enum { API_RT, API_K13, API_K13_PTSZ, API_CU, API_CU_EX };
static CUfunction cufn[NK];
static float kernel_arg[4];

/* One launch of kernel k on s through api; want: the expected code. */
static void launch(int api, int k, uintptr_t s, int want)
{
	static cudaKernel_t handle[NRT];
	unsigned gx = (unsigned)(launch_seq % 4 + 1), shm = (unsigned)(launch_seq % 2) * 256;
	dim3 grid = {gx, 2, 1}, block = {128, 1, 1};
	void *p = kernel_arg, *args[] = {&p};
	cudaStream_t cs = (cudaStream_t)s;
	launch_seq++;
	switch (api) {
	case API_RT:
		CALL(cudaLaunchKernel, s, want, (const void *)host_stub[k], grid, block, args, shm, cs);
		break;
	case API_K13:
	case API_K13_PTSZ:
		/* nvcc 13's __device_stub_: the handle fetched on first use. */
		if (!handle[k])
			CALL(__cudaGetKernel, 0, cudaSuccess, &handle[k], (const void *)host_stub[k]);
		if (api == API_K13)
			CALL(__cudaLaunchKernel, s, want, handle[k], grid, block, args, shm, cs);
		else
			CALL(__cudaLaunchKernel_ptsz, s, want, handle[k], grid, block, args, shm, cs);
		break;
	case API_CU:
		CALL(cuLaunchKernel, s, want, cufn[k], gx, 2, 1, 128, 1, 1, shm, (CUstream)s, args, NULL);
		break;
	default: {
		CUlaunchConfig c = {gx, 2, 1, 128, 1, 1, shm, (CUstream)s, NULL, 0};
		CALL(cuLaunchKernelEx, s, want, &c, cufn[k], args, NULL);
	}
	}
	struct model *m = capture_of(s);
	if (m) {
		if (counting)
			captured[k]++;
		if (want == cudaSuccess) {
			model_kernel(m, k);
			model_node(m, CU_GRAPH_NODE_TYPE_KERNEL);
		}
	} else if (counting && want == cudaSuccess) {
		launches[k]++;
		grid_blocks += (uint64_t)gx * 2;
		block_threads += 128;
		shared_bytes += shm;
	}
}

/* A copy through the runtime; async copies on a capturing stream are recorded. */
static void copy(int async, void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
		 uintptr_t s, int want)
{
	if (async)
		CALL(cudaMemcpyAsync, s, want, dst, src, n, kind, (cudaStream_t)s);
	else
		CALL(cudaMemcpy, 0, want, dst, src, n, kind);
	struct model *m = async ? capture_of(s) : NULL;
	if (m && want == cudaSuccess) {
		m->copy[kind] += n;
		model_node(m, CU_GRAPH_NODE_TYPE_MEMCPY);
	} else if (!m && counting && want == cudaSuccess) {
		memcpy_bytes[kind][stream_index(s)] += n;
	}
}

static void set(void *dst, size_t n, uintptr_t s, int want)
{
	CALL(cudaMemsetAsync, s, want, dst, 0, n, (cudaStream_t)s);
	struct model *m = capture_of(s);
	if (m && want == cudaSuccess) {
		m->set += n;
		model_node(m, CU_GRAPH_NODE_TYPE_MEMSET);
	} else if (!m && counting && want == cudaSuccess) {
		memset_bytes[stream_index(s)] += n;
	}
}

/* An executable graph and what it runs (known: built after "go"). */
struct xgraph {
	CUgraphExec x;
	const struct model *m;
	int known;
};

enum { R_RT, R_CU, R_RT_PTSZ, R_CU_PTSZ };

static void replay(const struct xgraph *g, int api, uintptr_t s)
{
	switch (api) {
	case R_RT:
		CALL(cudaGraphLaunch, s, cudaSuccess, (cudaGraphExec_t)g->x, (cudaStream_t)s);
		break;
	case R_CU:
		CALL(cuGraphLaunch, s, CUDA_SUCCESS, g->x, (CUstream)s);
		break;
	case R_RT_PTSZ:
		CALL(cudaGraphLaunch_ptsz, s, cudaSuccess, (cudaGraphExec_t)g->x, (cudaStream_t)s);
		break;
	default:
		CALL(cuGraphLaunch_ptsz, s, CUDA_SUCCESS, g->x, (CUstream)s);
	}
	if (!counting)
		return;
	if (!g->known) {
		unknown_replays++;
		unknown_kernels += (uint64_t)g->m->nk;
		return;
	}
	for (int i = 0; i < g->m->nk; i++)
		graph_kernels[g->m->k[i]]++;
	for (int d = 0; d < 5; d++)
		memcpy_bytes[d][stream_index(s)] += g->m->copy[d];
	memset_bytes[stream_index(s)] += g->m->set;
}

/* ---- The graphs -------------------------------------------------------- */

static cudaStream_t S, S2, R, D, E; /* capture, forked, replay, driver capture, early */
static cudaEvent_t fork_ev, join_ev;
static void *d_in, *d_out;
static char host[1 << 16];

/* One batch size's graph, captured on S with S2 forked and joined back,
 * the way torch.cuda.graph captures on its side stream: bs = 1 << i; the
 * variants of begin, end and record differ per batch size. update: same
 * topology as i's, other kernels and copy size (an exec update's target). */
static CUgraph capture_batch(int i, int update, struct model *m)
{
	uintptr_t s = (uintptr_t)S, s2 = (uintptr_t)S2;
	CUgraph g = NULL, into = NULL;
	memset(m, 0, sizeof(*m));
	if (i == 1) {
		CALL(cudaStreamBeginCapture_ptsz, s, cudaSuccess, S, cudaStreamCaptureModeGlobal);
	} else if (i == 3) {
		CALL(cudaGraphCreate, 0, cudaSuccess, (cudaGraph_t *)&into, 0);
		CALL(cudaStreamBeginCaptureToGraph, s, cudaSuccess, S, (cudaGraph_t)into, NULL, NULL, 0,
		     cudaStreamCaptureModeGlobal);
	} else {
		CALL(cudaStreamBeginCapture, s, cudaSuccess, S,
		     i == 2 ? cudaStreamCaptureModeThreadLocal : cudaStreamCaptureModeGlobal);
	}
	set_capture(s, m);
	if (i == 2)
		CALL(cudaEventRecordWithFlags, s, cudaSuccess, fork_ev, S, 0);
	else
		CALL(cudaEventRecord, s, cudaSuccess, fork_ev, S);
	CALL(cudaStreamWaitEvent, s2, cudaSuccess, S2, fork_ev, 0);
	set_capture(s2, m);
	for (int j = 0; j <= i; j++)
		launch(API_RT, update ? K_GEMM_FP8 : K_GEMM, s, cudaSuccess);
	launch(API_K13, K_ATTN, s2, cudaSuccess);
	copy(1, d_in, host, update ? 3000 : (size_t)4096 << i, cudaMemcpyHostToDevice, s, cudaSuccess);
	set(d_out, (size_t)1024 << i, s2, cudaSuccess);
	for (int j = 0; j < i % 2 + 1; j++)
		launch(API_CU, K_POI, s2, cudaSuccess);
	launch(API_K13_PTSZ, K_NORM, s, cudaSuccess);
	CALL(cudaEventRecord, s2, cudaSuccess, join_ev, S2);
	CALL(cudaStreamWaitEvent, s, cudaSuccess, S, join_ev, 0);
	if (i == 1)
		CALL(cudaStreamEndCapture_ptsz, s, cudaSuccess, S, (cudaGraph_t *)&g);
	else
		CALL(cudaStreamEndCapture, s, cudaSuccess, S, (cudaGraph_t *)&g);
	end_capture(m);
	if (!g || (i == 3 && g != into))
		die("batch %d: captured graph %p", i, (void *)g);
	check_nodes(g, m, "batch graph");
	return g;
}

/* The driver API's own capture (a Triton-only piece of a model). */
static CUgraph capture_driver(struct model *m)
{
	uintptr_t s = (uintptr_t)D;
	CUgraph g = NULL;
	memset(m, 0, sizeof(*m));
	CALL(cuStreamBeginCapture_v2, s, CUDA_SUCCESS, (CUstream)D, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
	set_capture(s, m);
	launch(API_CU, K_POI, s, CUDA_SUCCESS);
	launch(API_CU, K_POI, s, CUDA_SUCCESS);
	CALL(cuMemcpyHtoDAsync_v2, s, CUDA_SUCCESS, (CUdeviceptr)(uintptr_t)d_in, host, 512, (CUstream)D);
	m->copy[cudaMemcpyHostToDevice] += 512;
	model_node(m, CU_GRAPH_NODE_TYPE_MEMCPY);
	launch(API_CU_EX, K_RED, s, CUDA_SUCCESS);
	CALL(cuStreamEndCapture, s, CUDA_SUCCESS, (CUstream)D, &g);
	end_capture(m);
	check_nodes(g, m, "driver graph");
	return g;
}

static struct cudaKernelNodeParams kernel_params(int k)
{
	static void *p, *args[] = {&p};
	p = kernel_arg;
	return (struct cudaKernelNodeParams){(void *)host_stub[k], {4, 1, 1}, {256, 1, 1}, 0, args, NULL};
}

/* A graph built node by node, with a child graph, through the runtime
 * and the driver. */
static CUgraph build_graph(struct model *m, struct model *cm, CUgraph *child)
{
	cudaGraph_t g, c;
	cudaGraphNode_t n, prev;
	memset(m, 0, sizeof(*m));
	memset(cm, 0, sizeof(*cm));

	CALL(cudaGraphCreate, 0, cudaSuccess, &c, 0);
	struct cudaKernelNodeParams kp = kernel_params(K_NORM);
	CALL(cudaGraphAddKernelNode, 0, cudaSuccess, &prev, c, NULL, 0, &kp);
	CALL(cudaGraphAddKernelNode, 0, cudaSuccess, &n, c, &prev, 1, &kp);
	model_kernel(cm, K_NORM);
	model_kernel(cm, K_NORM);
	CUDA_KERNEL_NODE_PARAMS_v1 v1 = {cufn[K_RED], 8, 1, 1, 64, 1, 1, 0, NULL, NULL};
	CALL(cuGraphAddKernelNode, 0, CUDA_SUCCESS, (CUgraphNode *)&n, (CUgraph)c,
	     (const CUgraphNode *)&prev, 1, &v1);
	model_kernel(cm, K_RED);
	CUDA_MEMSET_NODE_PARAMS ms = {(CUdeviceptr)(uintptr_t)d_out, 0, 0, 2, 512, 1};
	CALL(cuGraphAddMemsetNode, 0, CUDA_SUCCESS, (CUgraphNode *)&n, (CUgraph)c,
	     (const CUgraphNode *)&prev, 1, &ms, NULL);
	cm->set += 2 * 512;
	/* A copy node the driver adds from a CUDA_MEMCPY3D descriptor. */
	CUDA_MEMCPY3D c3 = {.srcMemoryType = CU_MEMORYTYPE_HOST, .srcHost = host,
			    .dstMemoryType = CU_MEMORYTYPE_DEVICE,
			    .dstDevice = (CUdeviceptr)(uintptr_t)d_in,
			    .WidthInBytes = 128, .Height = 4, .Depth = 2};
	CALL(cuGraphAddMemcpyNode, 0, CUDA_SUCCESS, (CUgraphNode *)&n, (CUgraph)c,
	     (const CUgraphNode *)&prev, 1, &c3, NULL);
	cm->copy[cudaMemcpyHostToDevice] += 128 * 4 * 2;
	for (int t = 0; t < 3; t++)
		model_node(cm, CU_GRAPH_NODE_TYPE_KERNEL);
	model_node(cm, CU_GRAPH_NODE_TYPE_MEMSET);
	model_node(cm, CU_GRAPH_NODE_TYPE_MEMCPY);
	check_nodes((CUgraph)c, cm, "child graph");

	CALL(cudaGraphCreate, 0, cudaSuccess, &g, 0);
	kp = kernel_params(K_GEMM);
	CALL(cudaGraphAddKernelNode, 0, cudaSuccess, &prev, g, NULL, 0, &kp);
	CALL(cudaGraphAddKernelNode, 0, cudaSuccess, &prev, g, &prev, 1, &kp);
	for (int i = 0; i < 2; i++) {
		model_kernel(m, K_GEMM);
		model_node(m, CU_GRAPH_NODE_TYPE_KERNEL);
	}
	CUDA_KERNEL_NODE_PARAMS v2 = {.func = cufn[K_POI], .gridDimX = 16, .gridDimY = 1, .gridDimZ = 1,
				      .blockDimX = 128, .blockDimY = 1, .blockDimZ = 1};
	CALL(cuGraphAddKernelNode_v2, 0, CUDA_SUCCESS, (CUgraphNode *)&prev, (CUgraph)g,
	     (const CUgraphNode *)&prev, 1, &v2);
	model_kernel(m, K_POI);
	model_node(m, CU_GRAPH_NODE_TYPE_KERNEL);
	CALL(cudaGraphAddMemcpyNode1D, 0, cudaSuccess, &prev, g, &prev, 1, d_in, host, 8192,
	     cudaMemcpyHostToDevice);
	m->copy[cudaMemcpyHostToDevice] += 8192;
	model_node(m, CU_GRAPH_NODE_TYPE_MEMCPY);
	struct cudaMemcpy3DParms p3 = {
		.srcPtr = {d_out, 256, 256, 4}, .dstPtr = {host, 256, 256, 4},
		.extent = {256, 4, 2}, .kind = cudaMemcpyDeviceToHost,
	};
	CALL(cudaGraphAddMemcpyNode, 0, cudaSuccess, &prev, g, &prev, 1, &p3);
	m->copy[cudaMemcpyDeviceToHost] += 256 * 4 * 2;
	model_node(m, CU_GRAPH_NODE_TYPE_MEMCPY);
	struct cudaMemsetParams sp = {d_out, 0, 0, 4, 256, 2};
	CALL(cudaGraphAddMemsetNode, 0, cudaSuccess, &prev, g, &prev, 1, &sp);
	m->set += 4 * 256 * 2;
	model_node(m, CU_GRAPH_NODE_TYPE_MEMSET);
	CALL(cudaGraphAddChildGraphNode, 0, cudaSuccess, &n, g, &prev, 1, c);
	model_child(m, cm);
	check_nodes((CUgraph)g, m, "built graph");
	*child = (CUgraph)c;
	return (CUgraph)g;
}

/* Before "ready" (early): a graph captured and replayed before any agent
 * attached; after "go" only its replays are seen. */
static CUgraph early_graph;
static struct model early_model;
static struct xgraph early_exec;

static void build_early(void)
{
	CUmodule mod;
	uintptr_t s;
	if (cudaStreamCreate(&E) != cudaSuccess || cuModuleLoadData(&mod, triton_image) != CUDA_SUCCESS ||
	    cuModuleGetFunction(&cufn[K_POI], mod, kname[K_POI]) != CUDA_SUCCESS)
		die("early setup failed");
	s = (uintptr_t)E;
	CALL(cudaStreamBeginCapture, s, cudaSuccess, E, cudaStreamCaptureModeRelaxed);
	set_capture(s, &early_model);
	launch(API_RT, K_EARLY, s, cudaSuccess);
	launch(API_RT, K_EARLY, s, cudaSuccess);
	launch(API_CU, K_POI, s, CUDA_SUCCESS);
	CALL(cudaStreamEndCapture, s, cudaSuccess, E, (cudaGraph_t *)&early_graph);
	end_capture(&early_model);
	check_nodes(early_graph, &early_model, "early graph");
	CALL(cudaGraphInstantiateWithFlags, 0, cudaSuccess, (cudaGraphExec_t *)&early_exec.x,
	     (cudaGraph_t)early_graph, 0);
	early_exec.m = &early_model;
	replay(&early_exec, R_RT, s);
	cufn[K_POI] = NULL; /* looked up again after "go" */
}

/* ---- Output ------------------------------------------------------------ */

static void print_by_kernel(const char *key, const uint64_t *n)
{
	const char *sep = "";
	printf(",\"%s\":{", key);
	for (int k = 0; k < NK; k++)
		if (n[k]) {
			printf("%s\"%s\":%" PRIu64, sep, kname[k], n[k]);
			sep = ",";
		}
	printf("}");
}

static void print_truth(void)
{
	char lbl[32];
	const char *sep = "";

	printf("{\"calls\":{");
	for (int f = 0; f < NFN; f++) {
		uint64_t n = 0;
		for (int i = 0; i < nstreams; i++)
			n += calls[f][i];
		if (n) {
			printf("%s\"%s\":%" PRIu64, sep, fn_name[f], n);
			sep = ",";
		}
	}
	printf("},\"calls_by_stream\":{");
	sep = "";
	for (int f = 0; f < NFN; f++) {
		const char *sep2 = "";
		int any = 0;
		for (int i = 0; i < nstreams; i++) {
			if (!calls[f][i])
				continue;
			if (!any) {
				printf("%s\"%s\":{", sep, fn_name[f]);
				sep = ",";
				any = 1;
			}
			stream_label(stream_handle[i], lbl, sizeof(lbl));
			printf("%s\"%s\":%" PRIu64, sep2, lbl, calls[f][i]);
			sep2 = ",";
		}
		if (any)
			printf("}");
	}
	printf("},\"errors\":{");
	sep = "";
	for (int f = 0; f < NFN; f++) {
		if (!errs[f][0].n)
			continue;
		printf("%s\"%s\":{", sep, fn_name[f]);
		sep = ",";
		for (int i = 0; i < NCODES && errs[f][i].n; i++)
			printf("%s\"%d\":%" PRIu64, i ? "," : "", errs[f][i].code, errs[f][i].n);
		printf("}");
	}
	printf("}");
	print_by_kernel("launches", launches);
	print_by_kernel("captured", captured);
	print_by_kernel("graph_kernels", graph_kernels);
	printf(",\"unknown_graph_replays\":%" PRIu64 ",\"unknown_graph_kernels\":%" PRIu64
	       ",\"memcpy\":{",
	       unknown_replays, unknown_kernels);
	sep = "";
	for (int d = 0; d < 5; d++)
		for (int i = 0; i < nstreams; i++)
			if (memcpy_bytes[d][i]) {
				stream_label(stream_handle[i], lbl, sizeof(lbl));
				printf("%s\"%s|%s\":%" PRIu64, sep, dir_name[d], lbl, memcpy_bytes[d][i]);
				sep = ",";
			}
	printf("},\"memset\":{");
	sep = "";
	for (int i = 0; i < nstreams; i++)
		if (memset_bytes[i]) {
			stream_label(stream_handle[i], lbl, sizeof(lbl));
			printf("%s\"%s\":%" PRIu64, sep, lbl, memset_bytes[i]);
			sep = ",";
		}
	printf("},\"malloc_bytes\":%" PRIu64 ",\"active_bytes\":%" PRIu64 ",\"grid_blocks\":%" PRIu64
	       ",\"block_threads\":%" PRIu64 ",\"shared_bytes\":%" PRIu64 ",\"streams\":{",
	       malloc_bytes, malloc_bytes - freed_bytes, grid_blocks, block_threads, shared_bytes);
	const char *role[4] = {"capture", "fork", "replay", "driver"};
	cudaStream_t hs[4] = {S, S2, R, D};
	for (int i = 0; i < 4; i++) {
		stream_label((uintptr_t)hs[i], lbl, sizeof(lbl));
		printf("%s\"%s\":\"%s\"", i ? "," : "", role[i], lbl);
	}
	printf("}}\n");
	fflush(stdout);
}

/* The stub driver's own tally agrees with the model: what graph launches
 * ran, what captures recorded, what eager launches reached it. */
static const struct profi_stub_export_table *stub_table(void)
{
	const void *p = NULL;
	CUuuid id;
	memcpy(id.bytes, PROFI_STUB_EXPORT_TABLE_ID, sizeof(id.bytes));
	if (cuGetExportTable(&p, &id) != CUDA_SUCCESS || !p)
		die("not the stub driver: no export table");
	return p;
}

static void check_stats(const struct profi_stub_stats *a, const struct profi_stub_stats *b,
			uint64_t driver_launches)
{
	uint64_t kernels = unknown_kernels, caps = 0, copies[5] = {0}, sets = 0;
	for (int k = 0; k < NK; k++)
		kernels += graph_kernels[k], caps += captured[k];
	for (int d = 0; d < 5; d++)
		for (int i = 0; i < nstreams; i++)
			if (stream_handle[i] == (uintptr_t)R)
				copies[d] += memcpy_bytes[d][i];
	for (int i = 0; i < nstreams; i++)
		if (stream_handle[i] == (uintptr_t)R)
			sets += memset_bytes[i];
#define SAME(field, want)                                                                      \
	if (b->field - a->field != (want))                                                     \
		die("stub " #field ": %llu, the workload's model says %llu", b->field - a->field, \
		    (unsigned long long)(want));
	SAME(graph_kernels, kernels);
	SAME(captured_launches, caps);
	SAME(opaque_graph_launches, 0);
	SAME(graph_set_bytes, sets);
	SAME(driver_launches, driver_launches);
	for (int d = 0; d < 5; d++)
		SAME(graph_copy_bytes[d], copies[d]);
#undef SAME
}

int main(int argc, char **argv)
{
	if (argc < 2 || argc > 3 || (argc == 3 && strcmp(argv[2], "early")))
		die("usage: graphs REPLAYS [early]");
	long replays = strtol(argv[1], NULL, 10);
	int early = argc == 3;
	const char *rt_only = getenv("PROFI_STUB_LAUNCH");
	char line[64];

	if (early)
		build_early();
	printf("ready %d\n", (int)getpid());
	fflush(stdout);
	if (!fgets(line, sizeof(line), stdin) || strncmp(line, "go", 2))
		return 0;
	const struct profi_stub_export_table *t = stub_table();
	struct profi_stub_stats before, after;
	t->stats(&before);
	counting = 1;

	/* Setup: buffers, streams, events, the Triton module. */
	CALL(cudaMalloc, 0, cudaSuccess, &d_in, 1 << 20);
	CALL(cudaMalloc, 0, cudaSuccess, &d_out, 1 << 20);
	malloc_bytes += 2 << 20;
	if (cudaStreamCreate(&S) || cudaStreamCreate(&S2) || cudaStreamCreate(&R) ||
	    cudaStreamCreate(&D) || cudaEventCreateWithFlags(&fork_ev, cudaEventDisableTiming) ||
	    cudaEventCreateWithFlags(&join_ev, cudaEventDisableTiming))
		die("setup failed");
	CUmodule mod;
	CALL(cuModuleLoadData, 0, CUDA_SUCCESS, &mod, triton_image);
	CALL(cuModuleGetFunction, 0, CUDA_SUCCESS, &cufn[K_POI], mod, kname[K_POI]);
	CALL(cuModuleGetFunction, 0, CUDA_SUCCESS, &cufn[K_RED], mod, kname[K_RED]);
	/* The legacy stream cannot capture: nothing changes. */
	CALL(cudaStreamBeginCapture, 0, cudaErrorStreamCaptureUnsupported, (cudaStream_t)0,
	     cudaStreamCaptureModeGlobal);

	/* Eager warm-up, as before any capture. */
	uint64_t eager_rt = 0, eager_drv = 0;
	for (int w = 0; w < 4; w++) {
		launch(API_RT, K_GEMM, (uintptr_t)S, cudaSuccess);
		launch(API_K13, K_ATTN, (uintptr_t)S2, cudaSuccess);
		launch(API_CU, K_POI, 0, CUDA_SUCCESS);
		launch(API_K13_PTSZ, K_NORM, (uintptr_t)S, cudaSuccess);
		eager_rt += 3;
		eager_drv++;
	}
	copy(0, d_in, host, 65536, cudaMemcpyHostToDevice, 0, cudaSuccess);
	copy(1, host, d_out, 32768, cudaMemcpyDeviceToHost, (uintptr_t)S, cudaSuccess);
	set(d_out, 8192, (uintptr_t)S2, cudaSuccess);
	CALL(cudaStreamSynchronize, S, cudaSuccess, S);

	/* One graph per batch size. */
	struct model bm[4], dm, nm, cm, um;
	CUgraph bg[4], dg, ng, cg, ug;
	struct xgraph x[7];
	for (int i = 0; i < 4; i++) {
		bg[i] = capture_batch(i, 0, &bm[i]);
		x[i] = (struct xgraph){NULL, &bm[i], 1};
		CALL(cudaGraphInstantiateWithFlags, 0, cudaSuccess, (cudaGraphExec_t *)&x[i].x,
		     (cudaGraph_t)bg[i], cudaGraphInstantiateFlagAutoFreeOnLaunch);
	}
	dg = capture_driver(&dm);
	x[4] = (struct xgraph){NULL, &dm, 1};
	CALL(cuGraphInstantiateWithFlags, 0, CUDA_SUCCESS, &x[4].x, dg, 0);
	ng = build_graph(&nm, &cm, &cg);
	x[5] = (struct xgraph){NULL, &nm, 1};
	CALL(cudaGraphInstantiate, 0, cudaSuccess, (cudaGraphExec_t *)&x[5].x, (cudaGraph_t)ng, 0);
	/* A second executable graph of batch graph 1, uploaded to R. */
	cudaGraphInstantiateParams ip = {.flags = cudaGraphInstantiateFlagUpload, .uploadStream = R};
	x[6] = (struct xgraph){NULL, &bm[1], 1};
	CALL(cudaGraphInstantiateWithParams, 0, cudaSuccess, (cudaGraphExec_t *)&x[6].x,
	     (cudaGraph_t)bg[1], &ip);
	if (ip.result_out != cudaGraphInstantiateSuccess)
		die("cudaGraphInstantiateWithParams: result %d", (int)ip.result_out);
	/* Not capturing: nothing to end. */
	CALL(cudaStreamEndCapture, R, cudaErrorIllegalState, R, (cudaGraph_t *)&ug);

	/* Decode steps: every executable graph, through every graph launch API. */
	for (long r = 0; r < replays; r++) {
		for (int i = 0; i < 7; i++)
			replay(&x[i], (int)((r + i) % 4), (uintptr_t)R);
		if (early)
			replay(&early_exec, R_RT, (uintptr_t)R);
	}

	/* An update to the same topology with other kernels: later replays run them. */
	cudaGraphExecUpdateResultInfo info;
	ug = capture_batch(0, 1, &um);
	CALL(cudaGraphExecUpdate, 0, cudaSuccess, (cudaGraphExec_t)x[0].x, (cudaGraph_t)ug, &info);
	if (info.result != cudaGraphExecUpdateSuccess)
		die("cudaGraphExecUpdate: result %d", (int)info.result);
	x[0].m = &um;
	for (long r = 0; r < replays / 4; r++)
		replay(&x[0], R_RT, (uintptr_t)R);
	/* One to another topology fails: later replays run the old graph. */
	CALL(cudaGraphExecUpdate, 0, cudaErrorGraphExecUpdateFailure, (cudaGraphExec_t)x[1].x,
	     (cudaGraph_t)bg[3], &info);
	if (info.result != cudaGraphExecUpdateErrorTopologyChanged)
		die("failed cudaGraphExecUpdate: result %d", (int)info.result);
	for (long r = 0; r < replays / 4; r++)
		replay(&x[1], R_CU, (uintptr_t)R);

	/* A capture invalidated by a synchronisation: 900, then 901 for what
	 * follows, the end included; its launch calls were made all the same. */
	struct model failed = {0};
	uintptr_t s = (uintptr_t)S, s2 = (uintptr_t)S2;
	CUgraph fg = (CUgraph)(uintptr_t)1;
	CALL(cudaStreamBeginCapture, s, cudaSuccess, S, cudaStreamCaptureModeGlobal);
	set_capture(s, &failed);
	launch(API_RT, K_GEMM, s, cudaSuccess);
	launch(API_CU, K_POI, s, CUDA_SUCCESS);
	CALL(cudaStreamBeginCapture, s, cudaErrorIllegalState, S, cudaStreamCaptureModeGlobal);
	CALL(cudaStreamSynchronize, s, cudaErrorStreamCaptureUnsupported, S);
	launch(API_K13, K_ATTN, s, cudaErrorStreamCaptureInvalidated);
	copy(1, d_in, host, 4096, cudaMemcpyHostToDevice, s, cudaErrorStreamCaptureInvalidated);
	CALL(cudaStreamEndCapture, s, cudaErrorStreamCaptureInvalidated, S, (cudaGraph_t *)&fg);
	end_capture(&failed);
	if (fg)
		die("invalidated capture returned graph %p", (void *)fg);
	/* A fork not joined back: 904, and neither stream captures after it. */
	memset(&failed, 0, sizeof(failed));
	fg = (CUgraph)(uintptr_t)1;
	CALL(cudaStreamBeginCapture, s, cudaSuccess, S, cudaStreamCaptureModeGlobal);
	set_capture(s, &failed);
	CALL(cudaEventRecord, s, cudaSuccess, fork_ev, S);
	CALL(cudaStreamWaitEvent, s2, cudaSuccess, S2, fork_ev, 0);
	set_capture(s2, &failed);
	launch(API_RT, K_GEMM, s2, cudaSuccess);
	CALL(cudaStreamEndCapture, s, cudaErrorStreamCaptureUnjoined, S, (cudaGraph_t *)&fg);
	end_capture(&failed);
	enum cudaStreamCaptureStatus st;
	if (fg || cudaStreamIsCapturing(S2, &st) || st != cudaStreamCaptureStatusNone ||
	    cudaStreamIsCapturing(S, &st) || st != cudaStreamCaptureStatusNone)
		die("unjoined capture: graph %p, or a stream still captures", (void *)fg);
	launch(API_RT, K_GEMM, s2, cudaSuccess);
	eager_rt++;

	/* Teardown. */
	for (int i = 0; i < 4; i++)
		CALL(cudaGraphExecDestroy, 0, cudaSuccess, (cudaGraphExec_t)x[i].x);
	CALL(cuGraphExecDestroy, 0, CUDA_SUCCESS, x[4].x);
	CALL(cudaGraphExecDestroy, 0, cudaSuccess, (cudaGraphExec_t)x[5].x);
	CALL(cudaGraphExecDestroy, 0, cudaSuccess, (cudaGraphExec_t)x[6].x);
	for (int i = 0; i < 4; i++)
		CALL(cudaGraphDestroy, 0, cudaSuccess, (cudaGraph_t)bg[i]);
	CALL(cudaGraphDestroy, 0, cudaSuccess, (cudaGraph_t)ug);
	CALL(cuGraphDestroy, 0, CUDA_SUCCESS, dg);
	CALL(cudaGraphDestroy, 0, cudaSuccess, (cudaGraph_t)ng);
	CALL(cudaGraphDestroy, 0, cudaSuccess, (cudaGraph_t)cg);
	if (early) {
		CALL(cudaGraphExecDestroy, 0, cudaSuccess, (cudaGraphExec_t)early_exec.x);
		CALL(cudaGraphDestroy, 0, cudaSuccess, (cudaGraph_t)early_graph);
	}
	if (cudaEventDestroy(fork_ev) || cudaEventDestroy(join_ev))
		die("cudaEventDestroy failed");
	CALL(cudaFree, 0, cudaSuccess, d_in);
	CALL(cudaFree, 0, cudaSuccess, d_out);
	freed_bytes += 2 << 20;

	t->stats(&after);
	/* Under PROFI_STUB_LAUNCH=runtime the runtime's launches never reach the driver. */
	check_stats(&before, &after, eager_drv + (rt_only && rt_only[0] == 'r' ? 0 : eager_rt));
	print_truth();
	while (fgets(line, sizeof(line), stdin))
		;
	return 0;
}
