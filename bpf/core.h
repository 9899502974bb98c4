/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * What every program shares: per-CPU adds, drop counting, lookup-or-insert,
 * latency buckets, the operation table's lookups (ops.h), and the device
 * and phase every key carries.
 */
#pragma once

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
/* Inclusive upper bounds of the kernel launch latency buckets (no 5 ms bound). */
static const u64 klat_bounds_ns[KLAT_BUCKETS - 1] = {
	1000, 5000,                  /* 1 us, 5 us */
	10000, 50000,                /* 10 us, 50 us */
	100000, 500000,              /* 100 us, 500 us */
	1000000, 10000000,           /* 1 ms, 10 ms */
};

/* NCCL latency bounds, ns (docs/INTERFACE.md 5.5): 1e-5 .. 1 s. */
static const u64 nlat_bounds_ns[NLAT_BUCKETS - 1] = {
	10000ULL,     50000ULL,	    100000ULL,	  500000ULL,	 1000000ULL,   5000000ULL,
	10000000ULL, 50000000ULL, 100000000ULL, 500000000ULL, 1000000000ULL,
};
/* clang-format on */

/*
 * Zero values inserted by lookup_or_init: read-only globals rather than
 * structs zeroed on the 512-byte stack at every call.
 */
static const struct agg_val zero_agg;
static const struct launch_val zero_launch;
static const struct nccl_val zero_nccl;
static const struct graph_node_val zero_node;
static const struct tenant_quota zero_tenant;
static const u64 zero_u64;

/*
 * Adds to this CPU's value of a per-CPU map. A plain load, add and store:
 * no other CPU writes this memory, and a program is not preempted on
 * kernels whose preemption model is none or voluntary (the default of
 * Debian, Ubuntu and RHEL server kernels; this CI's kernel boots
 * "Dynamic Preempt: none"): programs run with migration disabled, and
 * such kernels preempt kernel code only at explicit points, none of which
 * is inside a BPF program. With preempt=full, lazy or PREEMPT_RT, an
 * interrupt that lands between the load and the store (one or two
 * instructions) may switch to a task that runs a program adding to the
 * same value on this CPU first; that add is then lost. The window is
 * nanoseconds out of a hit of about a microsecond, and needs a reschedule
 * in it and the other task hitting the same key: rare, but a count, not a
 * bound. Atomic adds (lock add) close it at a cost measured in
 * docs/BENCHMARK.md ("Atomic adds on per-CPU values"): about a tenth of a
 * launch_entry run. Build with -DPROFI_PCPU_ATOMIC to get them back on
 * such kernels. Shared (not per-CPU) values always use atomics.
 */
#ifdef PROFI_PCPU_ATOMIC
#define PCPU_ADD(lv, v) __sync_fetch_and_add(&(lv), (v))
#else
#define PCPU_ADD(lv, v) ((lv) += (v))
#endif

static __always_inline void count_drop(u32 idx)
{
	u64 *v = bpf_map_lookup_elem(&drops, &idx);

	if (v)
		PCPU_ADD(*v, 1);
}

/* The current thread's state (threads); NULL while it has none. */
static __always_inline struct thread_state *thread_state(void)
{
	return bpf_task_storage_get(&threads, bpf_get_current_task_btf(), 0, 0);
}

/* A new thread's state: no marker, no device. In .rodata, not on the caller's stack. */
static const struct thread_state new_thread_state = {.dev = DEV_NONE};

/* The current thread's state, created when it has none; NULL without kernel memory for it. */
static __always_inline struct thread_state *thread_state_new(void)
{
	return bpf_task_storage_get(&threads, bpf_get_current_task_btf(), (void *)&new_thread_state,
				    BPF_LOCAL_STORAGE_GET_F_CREATE);
}

/* The device ordinal thread state t last set with cudaSetDevice; DEV_NONE if none. */
static __always_inline u32 dev_of(const struct thread_state *t)
{
	return t ? t->dev : DEV_NONE;
}

/* The device ordinal the current thread last set with cudaSetDevice; DEV_NONE if none. */
static __always_inline u32 thread_dev(void)
{
	return dev_of(thread_state());
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

/* Index of the first inclusive upper bound >= ns among n bounds; n when none (+Inf). */
static __always_inline u32 bucket(u64 ns, const u64 *bounds, u32 n)
{
	u32 i;

	for (i = 0; i < n; i++)
		if (ns <= bounds[i])
			return i;
	return n;
}

/*
 * The operation's argument layout and flags (internal/ops): variants that
 * share a layout (_ptsz/_ptds) are decoded alike and keep their own id in
 * the maps.
 */
/*
 * op's index in the operation tables, masked where it is used. After
 * op < OP_MAX the compiler drops a plain mask as redundant, and an older
 * verifier (6.1's) loses that compare's bound when op is reloaded from a
 * stack slot ("unbounded memory access", docs/KERNELS.md): a mask in asm
 * is emitted as written, right before the read.
 */
static __always_inline u64 op_index(u32 op)
{
	u64 i = op;

	asm volatile("%0 &= %1" : "+r"(i) : "i"(OP_TABLE - 1));
	return i;
}

static __always_inline u32 args_of(u32 op)
{
	return op < OP_MAX ? op_args[op_index(op)] : ARGS_NONE;
}

static __always_inline u32 flags_of(u32 op)
{
	return op < OP_MAX ? op_flags[op_index(op)] : 0;
}

/* cudaMemcpyKind of a copy whose arguments name none (the driver's). */
static __always_inline u32 copy_kind_of(u32 op)
{
	return op < OP_MAX ? op_copy_kind[op_index(op)] : 0;
}

/* Bytes per counted element of a set (cuMemsetD16/D32). */
static __always_inline u64 unit_of(u32 op)
{
	u32 u = op < OP_MAX ? op_unit[op_index(op)] : 0;

	return u ? u : 1;
}

/*
 * The phase of a launch on thread id: the innermost open NVTX range whose
 * name matches a rule, PHASE_OTHER when ranges are open but none matches.
 */
static __always_inline u32 launch_phase(u64 id)
{
	struct nvtx_ranges *s;
	u32 n, i;

	if (!nvtx_enabled)
		return PHASE_NONE;
	s = bpf_map_lookup_elem(&nvtx_stack, &id);
	if (!s || !s->depth)
		return PHASE_NONE;
	n = s->depth < NVTX_DEPTH ? s->depth : NVTX_DEPTH;
	for (i = 0; i < NVTX_DEPTH; i++) {
		u8 p;

		if (i >= n)
			break;
		p = s->phases[(n - 1 - i) & (NVTX_DEPTH - 1)];
		if (p != PHASE_OTHER && p != PHASE_NONE)
			return p;
	}
	return PHASE_OTHER;
}
