/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * CUDA graphs (types.h, docs/METRICS.md "CUDA graphs"): capture state,
 * graph ids, nodes, and what a graph call leaves once it returned
 * (graph_return).
 */
#pragma once

/* Graph ids: unique on the node, never reused (0 is "unknown"). */
u64 graph_seq = 0;
/* Captures in progress on the node: 0 spares every launch the capture lookup. */
u32 live_captures = 0;

/*
 * The id of the graph stream is capturing into in process pid;
 * 0 when it is not capturing. An entry whose capture has ended (a stream
 * that joined through an event) is deleted on the way.
 */
static __always_inline u64 capture_of(u32 pid, u64 stream)
{
	struct handle_key k = {.pid = pid, .handle = stream};
	struct handle_key ck = {.pid = pid};
	u64 *gid;

	if (!live_captures)
		return 0;
	gid = bpf_map_lookup_elem(&capture_streams, &k);
	if (!gid)
		return 0;
	ck.handle = *gid;
	if (bpf_map_lookup_elem(&captures, &ck))
		return ck.handle;
	delete_admitted(&capture_streams, &k, pid, QUOTA_CAPTURE_STREAMS);
	return 0;
}

/* A new graph id for process pid, within its cap; 0 when refused (counted). */
static __always_inline u64 new_graph_id(u32 pid)
{
	struct pid_quota *q = quota_of(pid);

	if (!q)
		return 0;
	if (q->graphs >= max_graphs_per_pid) {
		count_drop(DROP_GRAPH_QUOTA);
		return 0;
	}
	__sync_fetch_and_add(&q->graphs, 1);
	return __sync_fetch_and_add(&graph_seq, 1) + 1;
}

/*
 * The id of graph handle in process pid. With assign, a graph profi has not
 * seen yet (built node by node, or created before attach) gets a new one.
 */
static __always_inline u64 graph_id_of(u32 pid, u64 handle, bool assign)
{
	struct handle_key k = {.pid = pid, .handle = handle};
	u64 *id = bpf_map_lookup_elem(&graph_ids, &k);
	u64 nid;
	u32 drop;

	if (id)
		return *id;
	if (!assign || !handle)
		return 0;
	nid = new_graph_id(pid);
	if (!nid)
		return 0;
	drop = store_admitted(&graph_ids, &k, &nid, pid, QUOTA_GRAPH_IDS | NEW_ONLY);
	if (drop != NO_DROP) {
		/* Another thread named it first, or refused. */
		id = bpf_map_lookup_elem(&graph_ids, &k);
		if (id)
			return *id;
		count_drop(drop);
		return 0;
	}
	return nid;
}

/* Adds one node to graph id graph (0: none). */
static __always_inline void add_node(u32 pid, u32 op, u64 graph, u64 func, u32 kind, u32 type,
				     struct launch_args *a, u64 bytes)
{
	struct graph_node_key k = {
	    .pid = pid, .op = op, .graph = graph, .func = func, .kind = kind, .type = type};
	struct graph_node_val *v;

	if (!graph)
		return;
	v = lookup_or_admit(&graph_nodes, &k, NULL, &zero_node, QUOTA_GRAPH_NODES);
	if (!v)
		return;
	__sync_fetch_and_add(&v->count, 1);
	if (a) {
		__sync_fetch_and_add(&v->grid_blocks, a->grid_blocks);
		__sync_fetch_and_add(&v->block_threads, a->block_threads);
		__sync_fetch_and_add(&v->shared_bytes, a->shared_bytes);
	}
	if (bytes)
		__sync_fetch_and_add(&v->bytes, bytes);
}

/*
 * CUDA graphs: the state a capture, event, graph-building, instantiate,
 * update, destroy or launch call leaves, once it returned ret. Only
 * successful calls change it, but for EndCapture: a capture that fails
 * ends too. Returns the drop to count, or NO_DROP (a subprogram, not
 * inlined: timed_return's stack would exceed 512 bytes).
 */
static __noinline int graph_return(u64 id, u32 flags, struct inflight_call *in, s32 ret, u32 dev)
{
	u32 pid = id >> 32;
	struct handle_key k = {.pid = pid, .handle = in->arg0};
	struct handle_key sk = {.pid = pid, .handle = in->stream};
	struct handle_key ck = {.pid = pid};
	struct pid_quota *q;
	struct capture c = {.origin = in->stream};
	u64 gid = 0, out = 0;
	u32 drop;
	u64 *p;

	switch (args_of(in->op)) {
	case ARGS_CAPTURE_BEGIN:
	case ARGS_CAPTURE_TO_GRAPH:
		if (ret)
			return NO_DROP;
		gid = args_of(in->op) == ARGS_CAPTURE_TO_GRAPH ? graph_id_of(pid, in->arg0, true)
							       : new_graph_id(pid);
		if (!gid)
			return NO_DROP;
		ck.handle = gid;
		/* Refused (counted): the stream does not capture, its launches count as run. */
		drop = store_admitted(&captures, &ck, &c, pid, QUOTA_CAPTURES | NEW_ONLY);
		if (drop != NO_DROP)
			return drop;
		drop = store_admitted(&capture_streams, &sk, &gid, pid, QUOTA_CAPTURE_STREAMS);
		if (drop != NO_DROP) {
			delete_admitted(&captures, &ck, pid, QUOTA_CAPTURES);
			return drop;
		}
		__sync_fetch_and_add(&live_captures, 1);
		return NO_DROP;
	case ARGS_CAPTURE_END: {
		struct capture *cur;

		p = bpf_map_lookup_elem(&capture_streams, &sk);
		if (!p)
			return NO_DROP;
		ck.handle = *p;
		cur = bpf_map_lookup_elem(&captures, &ck);
		/* Only the origin's EndCapture ends a capture; the others fail. */
		if (cur && cur->origin != in->stream)
			return NO_DROP;
		if (cur && delete_admitted(&captures, &ck, pid, QUOTA_CAPTURES))
			__sync_fetch_and_add(&live_captures, -1);
		delete_admitted(&capture_streams, &sk, pid, QUOTA_CAPTURE_STREAMS);
		if (ret || !cur || bpf_probe_read_user(&out, sizeof(out), (void *)in->arg0) || !out)
			return NO_DROP;
		k.handle = out;
		return store_admitted(&graph_ids, &k, &ck.handle, pid, QUOTA_GRAPH_IDS);
	}
	case ARGS_EVENT_RECORD:
		if (ret || !live_captures)
			return NO_DROP;
		gid = capture_of(pid, in->stream);
		if (!gid) {
			delete_admitted(&capture_events, &k, pid, QUOTA_CAPTURE_EVENTS);
			return NO_DROP;
		}
		return store_admitted(&capture_events, &k, &gid, pid, QUOTA_CAPTURE_EVENTS);
	case ARGS_STREAM_WAIT_EVENT:
		if (ret || !live_captures)
			return NO_DROP;
		p = bpf_map_lookup_elem(&capture_events, &k);
		if (!p)
			return NO_DROP;
		ck.handle = *p;
		if (!bpf_map_lookup_elem(&captures, &ck))
			return NO_DROP;
		return store_admitted(&capture_streams, &sk, &ck.handle, pid,
				      QUOTA_CAPTURE_STREAMS);
	case ARGS_GRAPH_INSTANTIATE:
		if (ret || bpf_probe_read_user(&out, sizeof(out), (void *)in->arg0) || !out)
			return NO_DROP;
		k.handle = out;
		/* fall through: bind exec k to in->arg1's graph */
	case ARGS_GRAPH_EXEC_UPDATE:
		if (ret)
			return NO_DROP;
		gid = graph_id_of(pid, in->arg1, false);
		if (!gid) {
			/* A graph profi did not see built: its replays are unknown. */
			if (delete_admitted(&graph_execs, &k, pid, QUOTA_GRAPH_EXECS)) {
				q = bpf_map_lookup_elem(&pid_quotas, &pid);
				if (q && q->execs)
					__sync_fetch_and_add(&q->execs, -1);
			}
			return NO_DROP;
		}
		if (!bpf_map_update_elem(&graph_execs, &k, &gid, BPF_EXIST))
			return NO_DROP; /* rebound */
		q = quota_of(pid);
		if (!q)
			return NO_DROP;
		if (q->execs >= max_execs_per_pid)
			return DROP_GRAPH_QUOTA;
		drop = store_admitted(&graph_execs, &k, &gid, pid, QUOTA_GRAPH_EXECS | NEW_ONLY);
		if (drop != NO_DROP)
			return drop;
		__sync_fetch_and_add(&q->execs, 1);
		return NO_DROP;
	case ARGS_GRAPH_EXEC_DESTROY:
		if (ret || !delete_admitted(&graph_execs, &k, pid, QUOTA_GRAPH_EXECS))
			return NO_DROP;
		q = bpf_map_lookup_elem(&pid_quotas, &pid);
		if (q && q->execs)
			__sync_fetch_and_add(&q->execs, -1);
		return NO_DROP;
	case ARGS_GRAPH_DESTROY:
		/* Its id and nodes stay: executable graphs made from it still replay them. */
		if (!ret)
			delete_admitted(&graph_ids, &k, pid, QUOTA_GRAPH_IDS);
		return NO_DROP;
	case ARGS_GRAPH_LAUNCH: {
		struct replay_key rk = {.pid = pid, .dev = dev, .stream = in->stream};
		u64 *n;

		if (ret)
			return NO_DROP;
		p = bpf_map_lookup_elem(&graph_execs, &k);
		rk.graph = p ? *p : 0;
		rk.phase = launch_phase(id);
		n = lookup_or_admit(&graph_replays, &rk, &rk.stream, &zero_u64,
				    QUOTA_GRAPH_REPLAYS);
		if (n)
			PCPU_ADD(*n, 1);
		return NO_DROP;
	}
	case ARGS_GRAPH_KERNEL_NODE: {
		u64 func = in->launch.func;

		if (ret || kernel_mode == 0)
			return NO_DROP;
		/* Anonymous mode names no kernel, unless the process is upgraded. */
		if (kernel_mode == 1 && !(flags & PF_FULL))
			func = 0;
		add_node(pid, in->op, graph_id_of(pid, in->arg1, true), func, 0, GRAPH_NODE_KERNEL,
			 &in->launch, 0);
		return NO_DROP;
	}
	case ARGS_GRAPH_MEMCPY_NODE:
	case ARGS_GRAPH_MEMCPY_NODE_1D:
	case ARGS_CU_GRAPH_MEMCPY_NODE:
		if (!ret)
			add_node(pid, in->op, graph_id_of(pid, in->arg1, true), 0, in->kind,
				 GRAPH_NODE_MEMCPY, NULL, in->arg0);
		return NO_DROP;
	case ARGS_GRAPH_MEMSET_NODE:
		if (!ret)
			add_node(pid, in->op, graph_id_of(pid, in->arg1, true), 0, 0,
				 GRAPH_NODE_MEMSET, NULL, in->arg0);
		return NO_DROP;
	case ARGS_GRAPH_CHILD_NODE:
		if (ret)
			return NO_DROP;
		gid = graph_id_of(pid, in->arg1, true);
		add_node(pid, in->op, gid, graph_id_of(pid, in->arg0, true), 0, GRAPH_NODE_CHILD,
			 NULL, 0);
		return NO_DROP;
	}
	return NO_DROP;
}
