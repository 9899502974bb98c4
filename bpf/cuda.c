// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * CUDA Runtime and Driver programs. timed_entry/timed_return time a call
 * and aggregate it (aggregated) when it returns; launch_entry counts a
 * launch at entry in anonymous mode; name_entry reports kernel names in
 * full mode. What each decodes follows the operation's argument layout
 * (args.h).
 */

static __always_inline int timed_entry_impl(struct pt_regs *ctx)
{
	u64 cookie = bpf_get_attach_cookie(ctx);
	u64 id = bpf_get_current_pid_tgid();
	struct inflight_call *cur;
	struct inflight_call in = {};

	count_hit(id >> 32);
	if (!hit_flags(ctx, id >> 32, COOKIE_FILE(cookie)))
		return 0;
	cur = bpf_map_lookup_elem(&inflight, &id);
	/*
	 * A probed call nested in another one on this thread (a runtime call
	 * going down into the driver, or the library calling its own API):
	 * counted once, as the outer call; the matching return unwinds.
	 */
	if (cur) {
		cur->depth++;
		count_drop(DROP_NESTED);
		return 0;
	}

	in.op = COOKIE_OP(cookie);
	decode_entry(ctx, &in, id >> 32);

	in.sampled = sample_rate <= 1 || bpf_get_prandom_u32() % sample_rate == 0;
	in.start_ns = in.sampled ? bpf_ktime_get_ns() : 0;
	if (bpf_map_update_elem(&inflight, &id, &in, BPF_ANY))
		count_drop(DROP_INFLIGHT);
	return 0;
}

/*
 * Timed launches (full mode): per-kernel count, geometry and latency. Not
 * inlined, nor is copy_node: their locals in timed_return's own frame made
 * its deepest call chain (graph_return, admit) more than the 512 bytes of
 * stack 6.1's verifier allows (internal/bpfobj's TestStackDepth).
 */
static __noinline void timed_launch(u64 id, struct inflight_call *in, s32 ret, u64 dur, u32 weight)
{
	add_launch(id, in->op, in->launch.func, &in->launch, dur, weight, thread_dev());
	send_launch(id, in->op, in->start_ns, ret, dur, &in->launch);
	note_launcher(id);
}

/*
 * A copy or set into a capturing stream: recorded in its graph, whose
 * replays move the bytes. Returns whether it was (then it moves none now).
 */
static __noinline bool copy_node(u32 pid, struct inflight_call *in, u64 bytes)
{
	u64 graph = capture_of(pid, in->stream);
	u32 a = args_of(in->op);
	u32 set = a == ARGS_SET || a == ARGS_SET_ASYNC || a == ARGS_SET_2D ||
		  a == ARGS_SET_2D_ASYNC || a == ARGS_SET_3D || a == ARGS_SET_3D_ASYNC;

	if (!graph)
		return false;
	add_node(pid, in->op, graph, 0, set ? 0 : in->kind,
		 set ? GRAPH_NODE_MEMSET : GRAPH_NODE_MEMCPY, NULL, bytes);
	return true;
}

static __always_inline int timed_return_impl(struct pt_regs *ctx)
{
	u64 now = bpf_ktime_get_ns();
	u64 id = bpf_get_current_pid_tgid();
	struct inflight_call *cur;
	struct inflight_call in;
	struct agg_key key = {};
	struct agg_val *val;
	u64 bytes = 0;
	u64 out = 0;
	u32 drop, flags;
	s32 ret;

	count_hit(id >> 32);
	flags = hit_flags(ctx, id >> 32, COOKIE_FILE(bpf_get_attach_cookie(ctx)));
	if (!flags)
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

	ret = (s32)ret_value(ctx);
	key.pid = id >> 32;
	key.op = in.op;
	key.kind = in.kind;
	key.err = ret;
	key.stream = in.stream;
	key.dev = thread_dev();
	/* Weight of this call in the latency data: 0 when not sampled. */
	u32 weight = in.sampled ? (sample_rate > 1 ? sample_rate : 1) : 0;
	u64 dur = in.sampled ? now - in.start_ns : 0;

	switch (args_of(in.op)) {
	case ARGS_ALLOC:
	case ARGS_ALLOC_ASYNC:
	case ARGS_ALLOC_POOL:
	case ARGS_ALLOC_PITCH:
	case ARGS_ALLOC_3D:
		if (ret == 0) {
			struct alloc_key ak = {.pid = key.pid};
			struct alloc_val av = {.size = in.arg1, .dev = key.dev};
			u32 a = args_of(in.op);

			/* Pitched: the pitch written back x the rows (0 if unreadable). */
			if (a == ARGS_ALLOC_PITCH || a == ARGS_ALLOC_3D) {
				if (bpf_probe_read_user(&out, sizeof(out), (void *)in.launch.func))
					out = 0;
				av.size = out * in.arg1;
			}
			bytes = av.size;
			if (bpf_probe_read_user(&ak.ptr, sizeof(ak.ptr), (void *)in.arg0))
				count_drop(DROP_MALLOC_SIZES);
			else
				track_alloc(&ak, &av);
		}
		break;
	case ARGS_FREE:
	case ARGS_FREE_ASYNC:
		/*
		 * A free counts on its allocation's device, whatever device the
		 * freeing thread has set, so active memory per GPU adds up.
		 */
		if (in.arg1)
			key.dev = in.dev;
		if (ret == 0) {
			bytes = in.arg1;
		} else if (in.arg1) {
			/* The free failed: the allocation is still live. */
			struct alloc_key ak = {.pid = key.pid, .ptr = in.arg0};
			struct alloc_val av = {.size = in.arg1, .dev = in.dev};

			track_alloc(&ak, &av);
		}
		break;
	case ARGS_ALLOC_HOST: /* pinned host memory: counted, not tracked */
	case ARGS_COPY:
	case ARGS_COPY_ASYNC:
	case ARGS_COPY_PEER:
	case ARGS_COPY_PEER_ASYNC:
	case ARGS_COPY_2D:
	case ARGS_COPY_2D_ASYNC:
	case ARGS_COPY_3D:
	case ARGS_COPY_3D_ASYNC:
	case ARGS_COPY_3D_PEER:
	case ARGS_COPY_3D_PEER_ASYNC:
	case ARGS_COPY_SYMBOL:
	case ARGS_COPY_SYMBOL_ASYNC:
	case ARGS_SET:
	case ARGS_SET_ASYNC:
	case ARGS_SET_2D:
	case ARGS_SET_2D_ASYNC:
	case ARGS_SET_3D:
	case ARGS_SET_3D_ASYNC:
	case ARGS_CU_COPY:
	case ARGS_CU_COPY_ASYNC:
	case ARGS_CU_COPY_2D:
	case ARGS_CU_COPY_2D_ASYNC:
	case ARGS_CU_COPY_3D:
	case ARGS_CU_COPY_3D_ASYNC:
	case ARGS_CU_COPY_3D_PEER:
	case ARGS_CU_COPY_3D_PEER_ASYNC:
		if (ret == 0)
			bytes = in.arg1;
		if (bytes && in.stream && copy_node(key.pid, &in, bytes))
			bytes = 0;
		break;
	case ARGS_SET_DEVICE:
		/* The call itself counts on the device it set (or failed to set: the old one). */
		if (ret == 0) {
			u32 dev = in.arg0 < MAX_DEVICES ? in.arg0 : DEV_INVALID;
			struct thread_state *t = thread_state_new();

			/* No memory for it (counted): the thread's later calls keep their old
			 * device. */
			if (t)
				t->dev = dev;
			else
				count_drop(DROP_THREAD_DEVICE);
			key.dev = dev;
		}
		break;
	case ARGS_GET_FUNCTION:
	case ARGS_GET_KERNEL:
		if (ret == 0 && !bpf_probe_read_user(&out, sizeof(out), (void *)in.arg0))
			send_name(key.pid,
				  args_of(in.op) == ARGS_GET_FUNCTION ? NAME_CU_FUNCTION
								      : NAME_CU_KERNEL,
				  out, 0, in.arg1);
		break;
	case ARGS_KERNEL_FUNCTION:
		if (ret == 0 && !bpf_probe_read_user(&out, sizeof(out), (void *)in.arg0))
			send_name(key.pid, NAME_KERNEL_FUNC, out, in.arg1, 0);
		break;
	case ARGS_GET_KERNEL_HANDLE:
		/* The launches name the handle; the host stub has the name. */
		if (ret == 0 && !bpf_probe_read_user(&out, sizeof(out), (void *)in.arg0))
			send_name(key.pid, NAME_RT_KERNEL, out, in.arg1, 0);
		break;
	case ARGS_LAUNCH:
	case ARGS_LAUNCH_EXC:
	case ARGS_CU_LAUNCH:
	case ARGS_CU_LAUNCH_EX:
		timed_launch(id, &in, ret, dur, weight);
		break;
	case ARGS_GRAPH_LAUNCH:
	case ARGS_CAPTURE_BEGIN:
	case ARGS_CAPTURE_TO_GRAPH:
	case ARGS_CAPTURE_END:
	case ARGS_EVENT_RECORD:
	case ARGS_STREAM_WAIT_EVENT:
	case ARGS_GRAPH_INSTANTIATE:
	case ARGS_GRAPH_EXEC_UPDATE:
	case ARGS_GRAPH_EXEC_DESTROY:
	case ARGS_GRAPH_DESTROY:
	case ARGS_GRAPH_KERNEL_NODE:
	case ARGS_GRAPH_MEMCPY_NODE:
	case ARGS_GRAPH_MEMCPY_NODE_1D:
	case ARGS_CU_GRAPH_MEMCPY_NODE:
	case ARGS_GRAPH_MEMSET_NODE:
	case ARGS_GRAPH_CHILD_NODE:
		drop = graph_return(id, flags, &in, ret, key.dev);
		if (drop != NO_DROP)
			count_drop(drop);
		break;
	}

	val = lookup_or_admit(&aggregated, &key, &key.stream, &zero_agg, QUOTA_AGGREGATED);
	if (!val)
		return 0;
	u32 b = bucket(dur, lat_bounds_ns, LAT_BUCKETS - 1);

	PCPU_ADD(val->count, 1);
	if (bytes)
		PCPU_ADD(val->bytes, bytes);
	if (weight) {
		PCPU_ADD(val->timed, weight);
		PCPU_ADD(val->duration_ns, dur * weight);
		if (b < LAT_BUCKETS)
			PCPU_ADD(val->buckets[b], weight);
	}
	return 0;
}

/*
 * Launch APIs in anonymous mode: count, stream and geometry at entry. The
 * thread's state (threads: the breaker's hit, marker and device) once, one
 * pid_files lookup (ownership, upgrade, the process's runtime range), the
 * launch's stack in one read, then launch_agg; rt_counted only at a
 * handed-over site.
 */
static __always_inline int launch_entry_impl(struct pt_regs *ctx)
{
	u64 cookie = bpf_get_attach_cookie(ctx);
	u64 id = bpf_get_current_pid_tgid();
	u32 op = COOKIE_OP(cookie), pid = id >> 32;
	struct launch_args a = {};
	struct text_range text = {};
	struct pid_file_val *pf;
	struct thread_state *t;
	bool have_text;
	u64 ret = 0;
	u32 flags;

	flags = hit_state(ctx, pid, COOKIE_FILE(cookie), &pf);
	/*
	 * The breaker's hit and the thread's marker and device: one
	 * task-storage lookup. Sharing it costs the verifier on 6.1 (847 peak
	 * states against 767 with a lookup of its own for the hit, measured),
	 * but the run time is what every launch pays.
	 */
	t = count_hit_thread(pid);
	/* PF_FULL: the upgrade's timed probes count this process's launches. */
	if (!flags || (flags & PF_FULL))
		return 0;
	decode_launch(ctx, op, &a, &ret);
	if (!crash_breaker)
		t = thread_state();
	if (flags_of(op) & OPF_DRIVER_LAUNCH) {
		/* An unseen process's range from the mapping of the return address. */
		have_text = process_text(pf, flags, pid, ret, 0, &text);
		op = driver_launch_op(ctx, ret, op, t, have_text ? &text : NULL);
		if (op == RT_NESTED)
			return 0;
	} else {
		/*
		 * The range its driver launches (and a CUDA 13 inner launch) are
		 * judged by; without one, markers alone, as its file's facts
		 * assume a range.
		 */
		have_text = process_text(pf, flags, pid, probe_ip(ctx), COOKIE_FILE(cookie), &text);
		if (!have_text)
			flags &= ~(PF_RT_SHARED | PF_RT_MARK);
		if (runtime_nested(ctx, ret, flags, op, COOKIE_FILE(cookie), t,
				   have_text ? &text : NULL))
			return 0;
	}
	add_launch(id, op, 0, &a, 0, 0, dev_of(t));
	send_launch(id, op, detailed_launches ? bpf_ktime_get_ns() : 0, 0, 0, &a);
	note_launcher(id);
	return 0;
}

/* __cudaRegisterFunction(fatCubinHandle, hostFun, deviceFun, ...), full mode. */
static __always_inline int name_entry_impl(struct pt_regs *ctx)
{
	u64 cookie = bpf_get_attach_cookie(ctx);
	u32 pid = bpf_get_current_pid_tgid() >> 32;

	count_hit(pid);
	if (!hit_flags(ctx, pid, COOKIE_FILE(cookie)))
		return 0;
	send_name(pid, NAME_HOST_FUNC, arg(ctx, 2), 0, arg(ctx, 3));
	return 0;
}

SEC("uprobe.multi")
int timed_entry(struct pt_regs *ctx)
{
	return timed_entry_impl(ctx);
}

SEC("uretprobe.multi")
int timed_return(struct pt_regs *ctx)
{
	return timed_return_impl(ctx);
}

SEC("uprobe.multi")
int launch_entry(struct pt_regs *ctx)
{
	return launch_entry_impl(ctx);
}

SEC("uprobe.multi")
int name_entry(struct pt_regs *ctx)
{
	return name_entry_impl(ctx);
}
