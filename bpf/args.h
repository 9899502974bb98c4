/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * What timed_entry keeps of a call's arguments, one decoder per argument
 * layout (enum op_args, generated from internal/ops into ops.h): the
 * in-flight record timed_return then reads. Argument slots come from the
 * architecture's header (arg, big_arg, args_ret in arch/); no decoder names
 * a register or a stack offset. A new layout is a decoder here, a case in
 * decode_entry, and its handling at the return (cuda.c, graphs.h).
 */
#pragma once

/* (void **ptr, size_t size): cudaMalloc, cudaMallocHost, cuMemAlloc. */
static __always_inline void decode_alloc(struct pt_regs *ctx, struct inflight_call *in)
{
	in->arg0 = arg(ctx, 1); /* void **ptr */
	in->arg1 = arg(ctx, 2); /* size */
}

/* (void **ptr, size_t size, stream). */
static __always_inline void decode_alloc_async(struct pt_regs *ctx, struct inflight_call *in)
{
	decode_alloc(ctx, in);
	in->stream = arg(ctx, 3);
}

/*
 * (void **ptr, size_t *pitch, width, height, ...): cudaMallocPitch and
 * cuMemAllocPitch. The size is the pitch the call writes back x height, read
 * at the return: the pitch's address waits in launch.func, which no
 * allocation uses otherwise (the in-flight record does not grow).
 */
static __always_inline void decode_alloc_pitch(struct pt_regs *ctx, struct inflight_call *in)
{
	in->arg0 = arg(ctx, 1);
	in->launch.func = arg(ctx, 2);
	in->arg1 = arg(ctx, 4);
}

/*
 * (cudaPitchedPtr *out, cudaExtent extent): the extent (24 bytes) by value
 * (big_arg); the call writes ptr and pitch at out and out + 8. The size is
 * that pitch x height x depth.
 */
static __always_inline void decode_alloc_3d(struct pt_regs *ctx, struct inflight_call *in)
{
	u64 hd[2] = {};

	bpf_probe_read_user(hd, sizeof(hd), (void *)(big_arg(ctx, 2, 0) + 8));
	in->arg0 = arg(ctx, 1);
	in->launch.func = in->arg0 + 8;
	in->arg1 = hd[0] * hd[1];
}

/* (void **ptr, size_t size, pool, stream): from a memory pool. */
static __always_inline void decode_alloc_pool(struct pt_regs *ctx, struct inflight_call *in)
{
	decode_alloc(ctx, in);
	in->stream = arg(ctx, 4);
}

/*
 * (ptr): the size is taken out at entry, while the pointer is still owned
 * by this call: after the return another thread may already have been
 * handed the same address. Put back if the free fails (timed_return).
 */
static __always_inline void decode_free(struct pt_regs *ctx, struct inflight_call *in, u32 pid)
{
	struct alloc_key ak = {.pid = pid, .ptr = arg(ctx, 1)};
	struct alloc_val *av = bpf_map_lookup_elem(&malloc_sizes, &ak);

	in->arg0 = ak.ptr;
	in->dev = DEV_NONE;
	if (av) {
		in->arg1 = av->size;
		in->dev = av->dev;
		if (!bpf_map_delete_elem(&malloc_sizes, &ak))
			untrack_alloc(ak.pid);
	}
}

/* (dst, src, count, kind). */
static __always_inline void decode_copy(struct pt_regs *ctx, struct inflight_call *in)
{
	in->arg1 = arg(ctx, 3);
	in->kind = arg(ctx, 4);
}

/* (dst, src, count, kind, stream). */
static __always_inline void decode_copy_async(struct pt_regs *ctx, struct inflight_call *in)
{
	decode_copy(ctx, in);
	in->stream = arg(ctx, 5);
}

/* (dst, dstDevice, src, srcDevice, count). */
static __always_inline void decode_copy_peer(struct pt_regs *ctx, struct inflight_call *in)
{
	in->arg1 = arg(ctx, 5);
	in->kind = KIND_P2P;
}

/* (dst, dstDevice, src, srcDevice, count, stream). */
static __always_inline void decode_copy_peer_async(struct pt_regs *ctx, struct inflight_call *in)
{
	decode_copy_peer(ctx, in);
	in->stream = arg(ctx, 6);
}

/* (dst, dpitch, src, spitch, width, height, kind). */
static __always_inline void decode_copy_2d(struct pt_regs *ctx, struct inflight_call *in)
{
	in->arg1 = arg(ctx, 5) * arg(ctx, 6);
	in->kind = arg(ctx, 7);
}

/* (dst, dpitch, src, spitch, width, height, kind, stream). */
static __always_inline void decode_copy_2d_async(struct pt_regs *ctx, struct inflight_call *in)
{
	decode_copy_2d(ctx, in);
	in->stream = arg(ctx, 8);
}

/*
 * (const cudaMemcpy3DParms *p): extent {width (bytes for linear memory),
 * height, depth} at 128, kind at 152 (offsets checked against the stub
 * header's struct, test/stubs/cuda_stub.h). One bounded read; an
 * unreadable struct counts the call without bytes.
 */
static __always_inline void decode_copy_3d(struct pt_regs *ctx, struct inflight_call *in)
{
	struct {
		u64 extent[3];
		u32 kind;
	} p = {};

	bpf_probe_read_user(&p, sizeof(p), (void *)(arg(ctx, 1) + 128));
	in->arg1 = p.extent[0] * p.extent[1] * p.extent[2];
	in->kind = p.kind;
}

/* (const cudaMemcpy3DParms *p, stream). */
static __always_inline void decode_copy_3d_async(struct pt_regs *ctx, struct inflight_call *in)
{
	decode_copy_3d(ctx, in);
	in->stream = arg(ctx, 2);
}

/* (const cudaMemcpy3DPeerParms *p): extent at 144, a peer copy. */
static __always_inline void decode_copy_3d_peer(struct pt_regs *ctx, struct inflight_call *in)
{
	u64 extent[3] = {};

	bpf_probe_read_user(extent, sizeof(extent), (void *)(arg(ctx, 1) + 144));
	in->arg1 = extent[0] * extent[1] * extent[2];
	in->kind = KIND_P2P;
}

/* (const cudaMemcpy3DPeerParms *p, stream). */
static __always_inline void decode_copy_3d_peer_async(struct pt_regs *ctx, struct inflight_call *in)
{
	decode_copy_3d_peer(ctx, in);
	in->stream = arg(ctx, 2);
}

/*
 * (symbol, src, count, offset, kind) and (dst, symbol, count, offset,
 * kind): cudaMemcpyToSymbol and cudaMemcpyFromSymbol alike.
 */
static __always_inline void decode_copy_symbol(struct pt_regs *ctx, struct inflight_call *in)
{
	in->arg1 = arg(ctx, 3);
	in->kind = arg(ctx, 5);
}

/* (..., count, offset, kind, stream). */
static __always_inline void decode_copy_symbol_async(struct pt_regs *ctx, struct inflight_call *in)
{
	decode_copy_symbol(ctx, in);
	in->stream = arg(ctx, 6);
}

/*
 * The cudaMemcpyKind of a driver copy between CUmemorytypes (1 host, 2 device,
 * 3 array, 4 unified): an array is device memory; unified (or an unknown
 * type) is the default kind, as cudaMemcpyDefault.
 */
static __always_inline u32 cu_copy_kind(u32 src, u32 dst)
{
	if (src < 1 || src > 3 || dst < 1 || dst > 3)
		return 4;
	if (src == 1)
		return dst == 1 ? 0 : 1;
	return dst == 1 ? 2 : 3;
}

/*
 * (const CUDA_MEMCPY2D *p): srcMemoryType at 16, dstMemoryType at 72,
 * WidthInBytes and Height at 112 (offsets checked against the stub header's
 * struct, test/stubs/cuda_drv_stub.h). An unreadable struct counts the call
 * without bytes.
 */
static __always_inline void decode_cu_copy_2d(struct pt_regs *ctx, struct inflight_call *in)
{
	u64 p = arg(ctx, 1), wh[2] = {};
	u32 src = 0, dst = 0;

	bpf_probe_read_user(&src, sizeof(src), (void *)(p + 16));
	bpf_probe_read_user(&dst, sizeof(dst), (void *)(p + 72));
	bpf_probe_read_user(wh, sizeof(wh), (void *)(p + 112));
	in->arg1 = wh[0] * wh[1];
	in->kind = cu_copy_kind(src, dst);
}

/* (const CUDA_MEMCPY2D *p, stream). */
static __always_inline void decode_cu_copy_2d_async(struct pt_regs *ctx, struct inflight_call *in)
{
	decode_cu_copy_2d(ctx, in);
	in->stream = arg(ctx, 2);
}

/*
 * (const CUDA_MEMCPY3D *p): srcMemoryType at 32, dstMemoryType at 120,
 * WidthInBytes, Height and Depth at 176.
 */
static __always_inline void decode_cu_copy_3d(struct pt_regs *ctx, struct inflight_call *in)
{
	u64 p = arg(ctx, 1), whd[3] = {};
	u32 src = 0, dst = 0;

	bpf_probe_read_user(&src, sizeof(src), (void *)(p + 32));
	bpf_probe_read_user(&dst, sizeof(dst), (void *)(p + 120));
	bpf_probe_read_user(whd, sizeof(whd), (void *)(p + 176));
	in->arg1 = whd[0] * whd[1] * whd[2];
	in->kind = cu_copy_kind(src, dst);
}

/*
 * cuGraphAddMemcpyNode(node *out, graph, deps, n, const CUDA_MEMCPY3D *p,
 * ctx): the descriptor read as cuMemcpy3D_v2's; bytes in arg0, the graph
 * in arg1, as the runtime's memcpy nodes (graph_return).
 */
static __always_inline void decode_cu_memcpy_node(struct pt_regs *ctx, struct inflight_call *in)
{
	u64 p = arg(ctx, 5), whd[3] = {};
	u32 src = 0, dst = 0;

	bpf_probe_read_user(&src, sizeof(src), (void *)(p + 32));
	bpf_probe_read_user(&dst, sizeof(dst), (void *)(p + 120));
	bpf_probe_read_user(whd, sizeof(whd), (void *)(p + 176));
	in->arg0 = whd[0] * whd[1] * whd[2];
	in->arg1 = arg(ctx, 2);
	in->kind = cu_copy_kind(src, dst);
}

/* (const CUDA_MEMCPY3D *p, stream). */
static __always_inline void decode_cu_copy_3d_async(struct pt_regs *ctx, struct inflight_call *in)
{
	decode_cu_copy_3d(ctx, in);
	in->stream = arg(ctx, 2);
}

/*
 * (const CUDA_MEMCPY3D_PEER *p): WidthInBytes, Height and Depth at 176, as in
 * CUDA_MEMCPY3D (CUDA 12.4's cuda.h: the peer struct's srcContext and
 * dstContext sit where CUDA_MEMCPY3D has reserved0 and reserved1; the stub
 * header asserts the offsets, test/stubs/cuda_drv_stub.h). A copy between
 * contexts: "p2p", as cuMemcpyPeer, whatever the two ends' memory types.
 */
static __always_inline void decode_cu_copy_3d_peer(struct pt_regs *ctx, struct inflight_call *in)
{
	u64 whd[3] = {};

	bpf_probe_read_user(whd, sizeof(whd), (void *)(arg(ctx, 1) + 176));
	in->arg1 = whd[0] * whd[1] * whd[2];
	in->kind = KIND_P2P;
}

/* (const CUDA_MEMCPY3D_PEER *p, stream). */
static __always_inline void decode_cu_copy_3d_peer_async(struct pt_regs *ctx,
							 struct inflight_call *in)
{
	decode_cu_copy_3d_peer(ctx, in);
	in->stream = arg(ctx, 2);
}

/* (dst, value, count): count elements of the op's unit (cuMemsetD16/D32). */
static __always_inline void decode_set(struct pt_regs *ctx, struct inflight_call *in)
{
	in->arg1 = arg(ctx, 3) * unit_of(in->op);
}

/*
 * (dst, pitch, value, width, height): width elements of the op's unit in each
 * of height rows (cudaMemset2D: bytes; cuMemsetD2D16/D2D32: 2 and 4 bytes).
 */
static __always_inline void decode_set_2d(struct pt_regs *ctx, struct inflight_call *in)
{
	in->arg1 = arg(ctx, 4) * arg(ctx, 5) * unit_of(in->op);
}

/* (dst, pitch, value, width, height, stream). */
static __always_inline void decode_set_2d_async(struct pt_regs *ctx, struct inflight_call *in)
{
	decode_set_2d(ctx, in);
	in->stream = arg(ctx, 6);
}

/*
 * (cudaPitchedPtr p, int value, cudaExtent extent): both structs by value,
 * 32 and 24 bytes (big_arg: on the stack on x86-64, by reference on arm64);
 * the extent's width (bytes) x height x depth. An unreadable extent counts
 * the call without bytes.
 */
static __always_inline void decode_set_3d(struct pt_regs *ctx, struct inflight_call *in)
{
	u64 whd[3] = {};

	bpf_probe_read_user(whd, sizeof(whd), (void *)big_arg(ctx, 2 + BIG_ARG_SLOTS, 32));
	in->arg1 = whd[0] * whd[1] * whd[2];
}

/* (cudaPitchedPtr p, int value, cudaExtent extent, stream). */
static __always_inline void decode_set_3d_async(struct pt_regs *ctx, struct inflight_call *in)
{
	decode_set_3d(ctx, in);
	in->stream = arg(ctx, 2 + 2 * BIG_ARG_SLOTS);
}

/* (dst, value, count, stream). */
static __always_inline void decode_set_async(struct pt_regs *ctx, struct inflight_call *in)
{
	decode_set(ctx, in);
	in->stream = arg(ctx, 4);
}

/* (dst, src, bytes): the direction is the function's. */
static __always_inline void decode_cu_copy(struct pt_regs *ctx, struct inflight_call *in)
{
	in->arg1 = arg(ctx, 3);
	in->kind = copy_kind_of(in->op);
}

/* (dst, src, bytes, stream). */
static __always_inline void decode_cu_copy_async(struct pt_regs *ctx, struct inflight_call *in)
{
	decode_cu_copy(ctx, in);
	in->stream = arg(ctx, 4);
}

/* (stream): stream calls and cudaStreamBeginCapture. */
static __always_inline void decode_stream(struct pt_regs *ctx, struct inflight_call *in)
{
	in->stream = arg(ctx, 1);
}

/* (handle): cudaSetDevice's device, a destroyed graph or executable graph. */
static __always_inline void decode_handle(struct pt_regs *ctx, struct inflight_call *in)
{
	in->arg0 = arg(ctx, 1);
}

/*
 * (first, second): an out pointer or handle and what it is made from
 * (instantiate: exec *out, graph; update: exec, graph; __cudaGetKernel:
 * cudaKernel_t *out, hostFun; cuKernelGetFunction: CUfunction *out, CUkernel).
 */
static __always_inline void decode_pair(struct pt_regs *ctx, struct inflight_call *in)
{
	in->arg0 = arg(ctx, 1);
	in->arg1 = arg(ctx, 2);
}

/* (handle, stream): a graph launch (exec, stream) or an event record (event, stream). */
static __always_inline void decode_handle_stream(struct pt_regs *ctx, struct inflight_call *in)
{
	in->arg0 = arg(ctx, 1);
	in->stream = arg(ctx, 2);
}

/* (stream, handle): end capture (stream, graph *out), capture to graph, wait on an event. */
static __always_inline void decode_stream_handle(struct pt_regs *ctx, struct inflight_call *in)
{
	in->stream = arg(ctx, 1);
	in->arg0 = arg(ctx, 2);
}

/* (out handle, module or library, const char *name). */
static __always_inline void decode_get_function(struct pt_regs *ctx, struct inflight_call *in)
{
	in->arg0 = arg(ctx, 1);
	in->arg1 = arg(ctx, 3);
}

/*
 * (node *out, graph, deps, n, params): cudaKernelNodeParams and
 * CUDA_KERNEL_NODE_PARAMS alike, the function, six unsigned dims from
 * offset 8, shared memory at 32.
 */
static __always_inline void decode_kernel_node(struct pt_regs *ctx, struct inflight_call *in)
{
	struct {
		u64 func;
		u32 grid[3];
		u32 block[3];
		u32 shmem;
	} p = {};

	bpf_probe_read_user(&p, sizeof(p), (void *)arg(ctx, 5));
	in->arg1 = arg(ctx, 2);
	in->launch.func = p.func;
	in->launch.grid_blocks = vol3(p.grid[0], p.grid[1], p.grid[2]);
	in->launch.block_threads = vol3(p.block[0], p.block[1], p.block[2]);
	in->launch.shared_bytes = p.shmem;
}

/* (node *out, graph, deps, n, cudaMemcpy3DParms *): extent at 128, kind at 152. */
static __always_inline void decode_memcpy_node(struct pt_regs *ctx, struct inflight_call *in)
{
	struct {
		u64 extent[3];
		u32 kind;
	} p = {};

	bpf_probe_read_user(&p, sizeof(p), (void *)(arg(ctx, 5) + 128));
	in->arg1 = arg(ctx, 2);
	in->arg0 = p.extent[0] * p.extent[1] * p.extent[2];
	in->kind = p.kind;
}

/* (node *out, graph, deps, n, dst, src, count, kind). */
static __always_inline void decode_memcpy_node_1d(struct pt_regs *ctx, struct inflight_call *in)
{
	in->arg1 = arg(ctx, 2);
	in->arg0 = arg(ctx, 7);
	in->kind = arg(ctx, 8);
}

/*
 * (node *out, graph, deps, n, params): cudaMemsetParams and
 * CUDA_MEMSET_NODE_PARAMS, dst, pitch, then value and elementSize (u32) at
 * 16, width and height at 24.
 */
static __always_inline void decode_memset_node(struct pt_regs *ctx, struct inflight_call *in)
{
	struct {
		u32 value;
		u32 element;
		u64 width;
		u64 height;
	} p = {};

	bpf_probe_read_user(&p, sizeof(p), (void *)(arg(ctx, 5) + 16));
	in->arg1 = arg(ctx, 2);
	in->arg0 = p.element * p.width * p.height;
}

/* (node *out, graph, deps, n, child graph). */
static __always_inline void decode_child_node(struct pt_regs *ctx, struct inflight_call *in)
{
	in->arg1 = arg(ctx, 2);
	in->arg0 = arg(ctx, 5); /* the child graph */
}

/* A timed launch (full mode): geometry and stream (decode_launch); a handle's call site. */
static __always_inline void decode_timed_launch(struct pt_regs *ctx, struct inflight_call *in,
						u32 pid)
{
	u64 ret;

	decode_launch(ctx, in->op, &in->launch, &ret);
	in->stream = in->launch.stream;
	if (flags_of(in->op) & OPF_KERNEL_HANDLE)
		send_launch_site(ctx, pid, in->launch.func);
}

/* Fills in from the arguments of in->op's layout; layouts timed_entry does not serve keep none. */
static __always_inline void decode_entry(struct pt_regs *ctx, struct inflight_call *in, u32 pid)
{
	switch (args_of(in->op)) {
	case ARGS_ALLOC:
	case ARGS_ALLOC_HOST:
		decode_alloc(ctx, in);
		break;
	case ARGS_ALLOC_ASYNC:
		decode_alloc_async(ctx, in);
		break;
	case ARGS_ALLOC_PITCH:
		decode_alloc_pitch(ctx, in);
		break;
	case ARGS_ALLOC_3D:
		decode_alloc_3d(ctx, in);
		break;
	case ARGS_ALLOC_POOL:
		decode_alloc_pool(ctx, in);
		break;
	case ARGS_FREE_ASYNC:
		in->stream = arg(ctx, 2); /* (ptr, stream) */
		/* fall through: one copy of the free's lookup serves both */
	case ARGS_FREE:
		decode_free(ctx, in, pid);
		break;
	case ARGS_COPY:
		decode_copy(ctx, in);
		break;
	case ARGS_COPY_ASYNC:
		decode_copy_async(ctx, in);
		break;
	case ARGS_COPY_PEER:
		decode_copy_peer(ctx, in);
		break;
	case ARGS_COPY_PEER_ASYNC:
		decode_copy_peer_async(ctx, in);
		break;
	case ARGS_COPY_2D:
		decode_copy_2d(ctx, in);
		break;
	case ARGS_COPY_2D_ASYNC:
		decode_copy_2d_async(ctx, in);
		break;
	case ARGS_COPY_3D:
		decode_copy_3d(ctx, in);
		break;
	case ARGS_COPY_3D_ASYNC:
		decode_copy_3d_async(ctx, in);
		break;
	case ARGS_COPY_3D_PEER:
		decode_copy_3d_peer(ctx, in);
		break;
	case ARGS_COPY_3D_PEER_ASYNC:
		decode_copy_3d_peer_async(ctx, in);
		break;
	case ARGS_COPY_SYMBOL:
		decode_copy_symbol(ctx, in);
		break;
	case ARGS_COPY_SYMBOL_ASYNC:
		decode_copy_symbol_async(ctx, in);
		break;
	case ARGS_SET:
		decode_set(ctx, in);
		break;
	case ARGS_SET_ASYNC:
		decode_set_async(ctx, in);
		break;
	case ARGS_SET_2D:
		decode_set_2d(ctx, in);
		break;
	case ARGS_CU_COPY_2D:
		decode_cu_copy_2d(ctx, in);
		break;
	case ARGS_CU_COPY_2D_ASYNC:
		decode_cu_copy_2d_async(ctx, in);
		break;
	case ARGS_CU_COPY_3D:
		decode_cu_copy_3d(ctx, in);
		break;
	case ARGS_CU_COPY_3D_ASYNC:
		decode_cu_copy_3d_async(ctx, in);
		break;
	case ARGS_CU_COPY_3D_PEER:
		decode_cu_copy_3d_peer(ctx, in);
		break;
	case ARGS_CU_COPY_3D_PEER_ASYNC:
		decode_cu_copy_3d_peer_async(ctx, in);
		break;
	case ARGS_SET_2D_ASYNC:
		decode_set_2d_async(ctx, in);
		break;
	case ARGS_SET_3D:
		decode_set_3d(ctx, in);
		break;
	case ARGS_SET_3D_ASYNC:
		decode_set_3d_async(ctx, in);
		break;
	case ARGS_CU_COPY:
		decode_cu_copy(ctx, in);
		break;
	case ARGS_CU_COPY_ASYNC:
		decode_cu_copy_async(ctx, in);
		break;
	case ARGS_STREAM:
	case ARGS_CAPTURE_BEGIN:
		decode_stream(ctx, in);
		break;
	case ARGS_SET_DEVICE:
	case ARGS_GRAPH_EXEC_DESTROY:
	case ARGS_GRAPH_DESTROY:
		decode_handle(ctx, in);
		break;
	case ARGS_GRAPH_LAUNCH:
	case ARGS_EVENT_RECORD:
		decode_handle_stream(ctx, in);
		break;
	case ARGS_CAPTURE_TO_GRAPH:
	case ARGS_CAPTURE_END:
	case ARGS_STREAM_WAIT_EVENT:
		decode_stream_handle(ctx, in);
		break;
	case ARGS_GRAPH_INSTANTIATE:
	case ARGS_GRAPH_EXEC_UPDATE:
	case ARGS_GET_KERNEL_HANDLE:
	case ARGS_KERNEL_FUNCTION:
		decode_pair(ctx, in);
		break;
	case ARGS_GET_FUNCTION:
	case ARGS_GET_KERNEL:
		decode_get_function(ctx, in);
		break;
	case ARGS_GRAPH_KERNEL_NODE:
		decode_kernel_node(ctx, in);
		break;
	case ARGS_GRAPH_MEMCPY_NODE:
		decode_memcpy_node(ctx, in);
		break;
	case ARGS_GRAPH_MEMCPY_NODE_1D:
		decode_memcpy_node_1d(ctx, in);
		break;
	case ARGS_CU_GRAPH_MEMCPY_NODE:
		decode_cu_memcpy_node(ctx, in);
		break;
	case ARGS_GRAPH_MEMSET_NODE:
		decode_memset_node(ctx, in);
		break;
	case ARGS_GRAPH_CHILD_NODE:
		decode_child_node(ctx, in);
		break;
	case ARGS_LAUNCH:
	case ARGS_LAUNCH_EXC:
	case ARGS_CU_LAUNCH:
	case ARGS_CU_LAUNCH_EX:
		decode_timed_launch(ctx, in, pid);
		break;
	}
}
