// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//go:build ignore

/*
 * profi's uprobe programs: count and time CUDA Runtime API calls and
 * aggregate them in per-CPU maps. Nothing leaves the kernel per call: Go
 * reads the cumulative map values, so no ring buffer sits on the hot path.
 *
 * Programs:
 *   timed_entry/timed_return  entry+return pair of every timed operation;
 *                             the BPF cookie carries the enum op.
 *   launch_entry              cudaLaunchKernel, entry only (anonymous mode):
 *                             one trap per launch, no in-flight state.
 */

#include "common.h"
#include "types.h"

char __license[] SEC("license") = "Dual BSD/GPL";

/* Map sizes are placeholders: Go sets max_entries from the flags before loading. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 2048);
	__type(key, struct agg_key);
	__type(value, struct agg_val);
} aggregated SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 8192);
	__type(key, struct launch_key);
	__type(value, struct launch_val);
} launch_agg SEC(".maps");

/* LRU so that threads dying mid-call cannot leak entries. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 10240);
	__type(key, u64); /* pid_tgid */
	__type(value, struct inflight_call);
} inflight SEC(".maps");

/* Live allocations, so that frees know their size. Not LRU: eviction would be silent loss. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 131072);
	__type(key, struct alloc_key);
	__type(value, u64);
} malloc_sizes SEC(".maps");

/*
 * One library file can be attached twice under two (dev, inode) keys: two
 * overlayfs mounts of one image layer show different inodes in
 * /proc/PID/maps, while the uprobe lands on the one real inode beneath.
 * Every call would then run the programs of both attachments. pid_files
 * (written by userspace from /proc/PID/maps) says which attachments are a
 * process's own; a process userspace has not seen yet is claimed by the
 * first attachment that fires for it (pid_claim).
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct pid_file);
	__type(value, u8);
} pid_files SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, u32);
	__type(value, u32);
} pid_claim SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, DROP_MAX);
	__type(key, u32);
	__type(value, u64);
} drops SEC(".maps");

/* Inclusive upper bounds of the CUDA API latency buckets, nanoseconds. */
/* clang-format off */
static const u64 lat_bounds_ns[LAT_BUCKETS - 1] = {
	1000, 5000,                  /* 1 us, 5 us */
	10000, 50000,                /* 10 us, 50 us */
	100000, 500000,              /* 100 us, 500 us */
	1000000, 5000000,            /* 1 ms, 5 ms */
	10000000, 50000000,          /* 10 ms, 50 ms */
	100000000, 500000000,        /* 100 ms, 500 ms */
	1000000000,                  /* 1 s */
};
/* clang-format on */

/* Force the generated Go types for the enums and shared structs. */
const enum op unused_op __attribute__((unused));
const enum drop unused_drop __attribute__((unused));

static __always_inline void count_drop(u32 idx)
{
	u64 *v = bpf_map_lookup_elem(&drops, &idx);

	if (v)
		__sync_fetch_and_add(v, 1);
}

/*
 * Returns this CPU's value for key, inserting a zero value first. A full
 * map is counted as a drop of that map; the call is then lost, never
 * folded into another key.
 */
static __always_inline void *lookup_or_init(void *map, const void *key, const void *zero,
					    u32 drop_idx)
{
	void *v = bpf_map_lookup_elem(map, key);

	if (v)
		return v;
	/* -EEXIST just means another CPU inserted the key first. */
	bpf_map_update_elem(map, key, zero, BPF_NOEXIST);
	v = bpf_map_lookup_elem(map, key);
	if (!v)
		count_drop(drop_idx);
	return v;
}

/* Whether this attachment (file) counts the current hit of process pid. */
static __always_inline bool owns_hit(u32 pid, u32 file)
{
	struct pid_file k = {.pid = pid};
	u32 *owner;

	if (bpf_map_lookup_elem(&pid_files, &k)) {
		k.file = file;
		return bpf_map_lookup_elem(&pid_files, &k) != NULL;
	}
	owner = bpf_map_lookup_elem(&pid_claim, &pid);
	if (!owner) {
		bpf_map_update_elem(&pid_claim, &pid, &file, BPF_NOEXIST);
		owner = bpf_map_lookup_elem(&pid_claim, &pid);
		if (!owner) {
			count_drop(DROP_PID_CLAIM);
			return true;
		}
	}
	return *owner == file;
}

static __always_inline u32 lat_bucket(u64 ns)
{
	u32 i;

#pragma unroll
	for (i = 0; i < LAT_BUCKETS - 1; i++) {
		if (ns <= lat_bounds_ns[i])
			return i;
	}
	return LAT_BUCKETS - 1;
}

/*
 * Stack argument n (7, 8, ...) at a probe on the function's first
 * instruction, where sp points at the return address.
 */
static __always_inline u64 stack_arg(struct pt_regs *ctx, u32 n)
{
	u64 v = 0;

	bpf_probe_read_user(&v, sizeof(v), (void *)(PT_REGS_SP(ctx) + 8 * (n - 6)));
	return v;
}

static __always_inline u64 dim3_volume(u64 xy, u64 z)
{
	return (xy & 0xffffffff) * (xy >> 32) * (z & 0xffffffff);
}

SEC("uprobe")
int timed_entry(struct pt_regs *ctx)
{
	u64 cookie = bpf_get_attach_cookie(ctx);
	u64 id = bpf_get_current_pid_tgid();
	struct inflight_call *cur;
	struct inflight_call in = {};

	if (!owns_hit(id >> 32, COOKIE_FILE(cookie)))
		return 0;
	cur = bpf_map_lookup_elem(&inflight, &id);
	/*
	 * A probed call nested in another one on this thread (the library
	 * calling its own exported API): keep the outer call intact and let the
	 * matching return just unwind the depth.
	 */
	if (cur) {
		cur->depth++;
		count_drop(DROP_NESTED);
		return 0;
	}

	in.op = COOKIE_OP(cookie);
	switch (in.op) {
	case OP_CUDA_MALLOC:
		in.arg0 = PT_REGS_PARM1(ctx);
		in.arg1 = PT_REGS_PARM2(ctx);
		break;
	case OP_CUDA_MALLOC_ASYNC:
		in.arg0 = PT_REGS_PARM1(ctx);
		in.arg1 = PT_REGS_PARM2(ctx);
		in.stream = PT_REGS_PARM3(ctx);
		break;
	case OP_CUDA_FREE:
	case OP_CUDA_FREE_ASYNC: {
		/*
		 * Take the size out at entry, while the pointer is still owned by
		 * this call: after the return another thread may already have
		 * been handed the same address. Put back if the free fails.
		 */
		struct alloc_key ak = {.pid = id >> 32, .ptr = PT_REGS_PARM1(ctx)};
		u64 *size = bpf_map_lookup_elem(&malloc_sizes, &ak);

		in.arg0 = ak.ptr;
		if (size) {
			in.arg1 = *size;
			bpf_map_delete_elem(&malloc_sizes, &ak);
		}
		if (in.op == OP_CUDA_FREE_ASYNC)
			in.stream = PT_REGS_PARM2(ctx);
		break;
	}
	case OP_CUDA_MEMCPY:
		in.arg1 = PT_REGS_PARM3(ctx);
		in.kind = (u32)PT_REGS_PARM4(ctx);
		break;
	case OP_CUDA_MEMCPY_ASYNC:
		in.arg1 = PT_REGS_PARM3(ctx);
		in.kind = (u32)PT_REGS_PARM4(ctx);
		in.stream = PT_REGS_PARM5(ctx);
		break;
	case OP_CUDA_GRAPH_LAUNCH:
		in.stream = PT_REGS_PARM2(ctx);
		break;
	default:
		break;
	}

	in.start_ns = bpf_ktime_get_ns();
	if (bpf_map_update_elem(&inflight, &id, &in, BPF_ANY))
		count_drop(DROP_INFLIGHT);
	return 0;
}

SEC("uretprobe")
int timed_return(struct pt_regs *ctx)
{
	u64 now = bpf_ktime_get_ns();
	u64 id = bpf_get_current_pid_tgid();
	struct inflight_call *cur;
	struct inflight_call in;
	struct agg_key key = {};
	struct agg_val zero = {};
	struct agg_val *val;
	u64 bytes = 0;
	s32 ret;

	if (!owns_hit(id >> 32, COOKIE_FILE(bpf_get_attach_cookie(ctx))))
		return 0;
	cur = bpf_map_lookup_elem(&inflight, &id);
	if (!cur) {
		count_drop(DROP_ORPHAN_RETURN);
		return 0;
	}
	if (cur->depth) {
		cur->depth--;
		return 0;
	}
	in = *cur;
	bpf_map_delete_elem(&inflight, &id);

	ret = (s32)PT_REGS_RC(ctx);
	key.pid = id >> 32;
	key.op = in.op;
	key.kind = in.kind;
	key.err = ret;
	key.stream = in.stream;

	switch (in.op) {
	case OP_CUDA_MALLOC:
	case OP_CUDA_MALLOC_ASYNC:
		if (ret == 0) {
			struct alloc_key ak = {.pid = key.pid};

			bytes = in.arg1;
			if (bpf_probe_read_user(&ak.ptr, sizeof(ak.ptr), (void *)in.arg0) ||
			    bpf_map_update_elem(&malloc_sizes, &ak, &in.arg1, BPF_ANY))
				count_drop(DROP_MALLOC_SIZES);
		}
		break;
	case OP_CUDA_FREE:
	case OP_CUDA_FREE_ASYNC:
		if (ret == 0) {
			bytes = in.arg1;
		} else if (in.arg1) {
			/* The free failed: the allocation is still live. */
			struct alloc_key ak = {.pid = key.pid, .ptr = in.arg0};

			if (bpf_map_update_elem(&malloc_sizes, &ak, &in.arg1, BPF_NOEXIST))
				count_drop(DROP_MALLOC_SIZES);
		}
		break;
	case OP_CUDA_MEMCPY:
	case OP_CUDA_MEMCPY_ASYNC:
		if (ret == 0)
			bytes = in.arg1;
		break;
	default:
		break;
	}

	val = lookup_or_init(&aggregated, &key, &zero, DROP_AGGREGATED);
	if (!val)
		return 0;
	u64 dur = now - in.start_ns;
	u32 b = lat_bucket(dur);

	__sync_fetch_and_add(&val->count, 1);
	__sync_fetch_and_add(&val->duration_ns, dur);
	if (bytes)
		__sync_fetch_and_add(&val->bytes, bytes);
	if (b < LAT_BUCKETS)
		__sync_fetch_and_add(&val->buckets[b], 1);
	return 0;
}

/*
 * cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args,
 *                  size_t sharedMem, cudaStream_t stream)
 * Each dim3 (12 bytes by value) takes two registers: grid in rsi (x, y) and
 * rdx (z), block in rcx (x, y) and r8 (z), args in r9; sharedMem and stream
 * are the 7th and 8th integer arguments, on the stack.
 */
SEC("uprobe")
int launch_entry(struct pt_regs *ctx)
{
	u64 cookie = bpf_get_attach_cookie(ctx);
	struct launch_key key = {};
	struct launch_val zero = {};
	struct launch_val *val;

	key.pid = bpf_get_current_pid_tgid() >> 32;
	if (!owns_hit(key.pid, COOKIE_FILE(cookie)))
		return 0;
	key.op = COOKIE_OP(cookie);
	key.stream = stack_arg(ctx, 8);

	val = lookup_or_init(&launch_agg, &key, &zero, DROP_LAUNCH_AGG);
	if (!val)
		return 0;
	__sync_fetch_and_add(&val->count, 1);
	__sync_fetch_and_add(&val->grid_blocks,
			     dim3_volume(PT_REGS_PARM2(ctx), PT_REGS_PARM3(ctx)));
	__sync_fetch_and_add(&val->block_threads,
			     dim3_volume(PT_REGS_PARM4(ctx), PT_REGS_PARM5(ctx)));
	__sync_fetch_and_add(&val->shared_bytes, stack_arg(ctx, 7));
	return 0;
}
