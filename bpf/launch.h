/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Kernel launches: geometry decoding (decode_launch), their aggregation
 * (launch_agg, captured launches into graph nodes), and the events sent
 * to userspace (launch events, kernel name sources).
 */
#pragma once

/* Volume of a dim3 passed by value: x and y in one argument slot, z in the next. */
static __always_inline u64 dim3_volume(u64 xy, u64 z)
{
	return (xy & 0xffffffff) * (xy >> 32) * (z & 0xffffffff);
}

static __always_inline u64 vol3(u64 x, u64 y, u64 z)
{
	return (x & 0xffffffff) * (y & 0xffffffff) * (z & 0xffffffff);
}

/*
 * Decodes the function, stream and geometry of a launch (argument slots:
 * arg, args_ret in arch/). A dim3 passed by value takes two slots; the
 * driver passes six unsigned dims, so its later arguments may be on the
 * stack. The arguments past the sixth and the return address are read
 * together (args_ret: at most one read of user memory). *ret is the
 * return address, 0 if unreadable; only driver launches need it
 * (driver_launch_op).
 */
static __always_inline void decode_launch(struct pt_regs *ctx, u32 op, struct launch_args *a,
					  u64 *ret)
{
	u64 v[3];

	switch (args_of(op)) {
	case ARGS_LAUNCH:
		/* (func, dim3 grid, dim3 block, void **args, size_t shmem, stream) */
		args_ret(ctx, 7, 2, v, ret);
		a->func = arg(ctx, 1);
		a->grid_blocks = dim3_volume(arg(ctx, 2), arg(ctx, 3));
		a->block_threads = dim3_volume(arg(ctx, 4), arg(ctx, 5));
		a->shared_bytes = v[0];
		a->stream = v[1];
		break;
	case ARGS_LAUNCH_EXC: {
		/* (const cudaLaunchConfig_t *config, const void *func, void **args) */
		struct {
			u32 grid[3];
			u32 block[3];
			u64 shmem;
			u64 stream;
		} c = {};

		bpf_probe_read_user(&c, sizeof(c), (void *)arg(ctx, 1));
		*ret = entry_ret(ctx);
		a->func = arg(ctx, 2);
		a->grid_blocks = vol3(c.grid[0], c.grid[1], c.grid[2]);
		a->block_threads = vol3(c.block[0], c.block[1], c.block[2]);
		a->shared_bytes = c.shmem;
		a->stream = c.stream;
		break;
	}
	case ARGS_CU_LAUNCH:
		/* (f, gx, gy, gz, bx, by, bz, shmem, hStream, ...) */
		args_ret(ctx, 7, 3, v, ret);
		a->func = arg(ctx, 1);
		a->grid_blocks = vol3(arg(ctx, 2), arg(ctx, 3), arg(ctx, 4));
		a->block_threads = vol3(arg(ctx, 5), arg(ctx, 6), v[0]);
		a->shared_bytes = v[1] & 0xffffffff;
		a->stream = v[2];
		break;
	case ARGS_CU_LAUNCH_EX: {
		/* (const CUlaunchConfig *config, CUfunction f, ...): stream at offset 32 */
		struct {
			u32 grid[3];
			u32 block[3];
			u32 shmem;
			u32 pad;
			u64 stream;
		} c = {};

		bpf_probe_read_user(&c, sizeof(c), (void *)arg(ctx, 1));
		*ret = entry_ret(ctx);
		a->func = arg(ctx, 2);
		a->grid_blocks = vol3(c.grid[0], c.grid[1], c.grid[2]);
		a->block_threads = vol3(c.block[0], c.block[1], c.block[2]);
		a->shared_bytes = c.shmem;
		a->stream = c.stream;
		break;
	}
	}
}

/*
 * Notes the current thread in launch_threads, once: at its first counted
 * launch (its state says whether it was). A global function called after
 * every counted launch: verified once, and its caller keeps no register
 * and takes no branch for it (either doubled the caller's states); the
 * task-storage lookup is a pointer walk, no hash.
 */
__noinline int note_launcher(u64 id)
{
	struct thread_state *t = thread_state_new();
	u32 tid = (u32)id, pid = id >> 32;

	if (!t) {
		count_drop(DROP_LAUNCH_THREADS);
		return 0;
	}
	if (t->launcher)
		return 0;
	/* Set even when the map is full: one drop per thread, not per launch. */
	t->launcher = 1;
	if (bpf_map_update_elem(&launch_threads, &tid, &pid, BPF_ANY))
		count_drop(DROP_LAUNCH_THREADS);
	return 0;
}

static __always_inline void add_launch(u64 id, u32 op, u64 func, struct launch_args *a, u64 dur,
				       u32 weight, u32 dev)
{
	struct launch_key key = {.pid = id >> 32,
				 .op = op,
				 .stream = a->stream,
				 .func = func,
				 .phase = launch_phase(id),
				 .dev = dev};
	struct launch_val *val;
	u64 graph = capture_of(key.pid, a->stream);

	/* Captured: recorded into the graph, run by its replays, not now. */
	if (graph) {
		key.captured = 1;
		add_node(key.pid, op, graph, func, 0, GRAPH_NODE_KERNEL, a, 0);
	}
	val = lookup_or_admit(&launch_agg, &key, &key.stream, &zero_launch, QUOTA_LAUNCH_AGG);
	if (!val)
		return;
	PCPU_ADD(val->count, 1);
	PCPU_ADD(val->grid_blocks, a->grid_blocks);
	PCPU_ADD(val->block_threads, a->block_threads);
	PCPU_ADD(val->shared_bytes, a->shared_bytes);
	if (weight) {
		u32 b = bucket(dur, klat_bounds_ns, KLAT_BUCKETS - 1);

		PCPU_ADD(val->timed, weight);
		PCPU_ADD(val->duration_ns, dur * weight);
		if (b < KLAT_BUCKETS)
			PCPU_ADD(val->buckets[b], weight);
	}
}

/* Sends a launch to userspace (--detailed-launches); a full ring is counted. */
static __always_inline void send_launch(u64 id, u32 op, u64 start, s32 err, u64 dur,
					struct launch_args *a)
{
	struct launch_event *e;

	if (!detailed_launches)
		return;
	e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count_drop(DROP_EVENTS_RING);
		return;
	}
	e->ts_ns = start;
	e->pid = id >> 32;
	e->tid = (u32)id;
	e->op = op;
	e->err = err;
	e->duration_ns = dur;
	e->launch = *a;
	bpf_ringbuf_submit(e, 0);
}

/* Sends a kernel name source to userspace; a full ring is counted. */
static __always_inline void send_name(u32 pid, u32 kind, u64 key, u64 aux, u64 name_ptr)
{
	struct name_event *e = bpf_ringbuf_reserve(&kernel_regs, sizeof(*e), 0);

	if (!e) {
		count_drop(DROP_KERNEL_REGS);
		return;
	}
	e->pid = pid;
	e->kind = kind;
	e->key = key;
	/*
	 * For named kinds aux carries the name's address: BPF cannot fault in
	 * a page that is not resident yet (a young process's .rodata), and
	 * userspace then reads the name through /proc/PID/mem, which can.
	 */
	e->aux = name_ptr ? name_ptr : aux;
	e->name[0] = 0;
	if (name_ptr)
		bpf_probe_read_user_str(e->name, sizeof(e->name), (void *)name_ptr);
	bpf_ringbuf_submit(e, 0);
}

/*
 * First launch of a cudaKernel_t handle in a process: its call site (the
 * return address at entry) goes to userspace once; BPF_NOEXIST makes
 * every later launch of the handle one failed update, no event.
 */
static __always_inline void send_launch_site(struct pt_regs *ctx, u32 pid, u64 handle)
{
	struct alloc_key k = {.pid = pid, .ptr = handle};
	u8 one = 1;
	u64 ret_addr = 0;

	if (!handle || bpf_map_update_elem(&launch_sites, &k, &one, BPF_NOEXIST))
		return;
	ret_addr = entry_ret(ctx);
	if (!ret_addr)
		return;
	send_name(pid, NAME_LAUNCH_SITE, handle, ret_addr, 0);
}
