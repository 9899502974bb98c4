// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)

/* NCCL. One entry and one return program serve every probed function of libnccl. */

/* Bytes of one element of an ncclDataType_t; 0 when unknown. */
static __always_inline u64 nccl_type_size(u64 dtype)
{
	switch (dtype) {
	case 0:	 /* int8 */
	case 1:	 /* uint8 */
	case 10: /* fp8 e4m3 */
	case 11: /* fp8 e5m2 */
		return 1;
	case 6: /* float16 */
	case 9: /* bfloat16 */
		return 2;
	case 2: /* int32 */
	case 3: /* uint32 */
	case 7: /* float32 */
		return 4;
	case 4: /* int64 */
	case 5: /* uint64 */
	case 8: /* float64 */
		return 8;
	}
	return 0;
}

static __always_inline void add_nccl(u64 id, u32 op, u64 comm, s32 err, u64 bytes, bool timed,
				     u64 dur)
{
	struct nccl_key key = {
	    .pid = id >> 32, .op = op, .comm = comm, .err = err, .dev = thread_dev()};
	struct nccl_val *val;

	val = lookup_or_admit(&nccl_agg, &key, NULL, &zero_nccl, QUOTA_NCCL_AGG);
	if (!val)
		return;
	PCPU_ADD(val->count, 1);
	if (bytes)
		PCPU_ADD(val->bytes, bytes);
	if (timed) {
		u32 b = bucket(dur, nlat_bounds_ns, NLAT_BUCKETS - 1);

		PCPU_ADD(val->timed, 1);
		PCPU_ADD(val->duration_ns, dur);
		if (b < NLAT_BUCKETS)
			PCPU_ADD(val->buckets[b], 1);
	}
}

static __always_inline int nccl_entry_impl(struct pt_regs *ctx)
{
	u64 cookie = bpf_get_attach_cookie(ctx);
	u64 id = bpf_get_current_pid_tgid();
	u32 pid = id >> 32;
	u32 op = COOKIE_OP(cookie);
	struct nccl_call *cur, *c;
	u32 zero = 0, drop;
	u64 count = 0, dtype = 0;

	count_hit(pid);
	if (!hit_flags(ctx, pid, COOKIE_FILE(cookie)))
		return 0;
	/* Entry-only (ncclGroupStart): nothing to time, nothing can hang. */
	if (flags_of(op) & OPF_ENTRY_ONLY) {
		add_nccl(id, op, 0, 0, 0, false, 0);
		return 0;
	}
	cur = bpf_map_lookup_elem(&nccl_inflight, &id);
	if (cur) {
		cur->depth++;
		count_drop(DROP_NESTED);
		return 0;
	}
	c = bpf_map_lookup_elem(&nccl_scratch, &zero);
	if (!c)
		return 0;
	__builtin_memset(c, 0, sizeof(*c));
	c->op = op;
	switch (args_of(op)) {
	case ARGS_NCCL_COLL:
		count = arg(ctx, 3);
		dtype = arg(ctx, 4);
		c->comm = arg(ctx, 6);
		break;
	case ARGS_NCCL_GATHER:
		count = arg(ctx, 3);
		dtype = arg(ctx, 4);
		c->comm = arg(ctx, 5);
		break;
	case ARGS_NCCL_REDUCE:
		count = arg(ctx, 3);
		dtype = arg(ctx, 4);
		c->comm = arg(ctx, 7); /* after root */
		break;
	case ARGS_NCCL_P2P:
		count = arg(ctx, 2);
		dtype = arg(ctx, 3);
		c->comm = arg(ctx, 5);
		break;
	case ARGS_NCCL_INIT_RANK:
		/*
		 * (ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, ...):
		 * the 128-byte id is passed by value (big_arg: on the stack on
		 * x86-64, by reference on arm64), so rank's slot depends on it.
		 */
		c->out = arg(ctx, 1);
		c->info.nranks = (s32)arg(ctx, 2);
		c->info.rank = (s32)arg(ctx, 3 + BIG_ARG_SLOTS);
		bpf_probe_read_user(c->info.id, sizeof(c->info.id), (void *)big_arg(ctx, 3, 0));
		break;
	case ARGS_NCCL_INIT_ALL:
		c->info.nranks = (s32)arg(ctx, 2);
		break;
	case ARGS_NCCL_COMM:
		c->comm = arg(ctx, 1);
		break;
	}
	c->bytes = count * nccl_type_size((u32)dtype);
	c->start_ns = bpf_ktime_get_ns();
	drop = store_admitted(&nccl_inflight, &id, c, pid, QUOTA_NCCL_INFLIGHT);
	if (drop != NO_DROP)
		count_drop(drop);
	return 0;
}

static __always_inline int nccl_return_impl(struct pt_regs *ctx)
{
	u64 now = bpf_ktime_get_ns();
	u64 id = bpf_get_current_pid_tgid();
	u32 pid = id >> 32;
	struct nccl_call *c;
	struct nccl_comm_key ck = {.pid = pid};
	u64 comm;
	u32 drop;
	s32 ret;

	count_hit(pid);
	if (!hit_flags(ctx, pid, COOKIE_FILE(bpf_get_attach_cookie(ctx))))
		return 0;
	c = bpf_map_lookup_elem(&nccl_inflight, &id);
	if (!c) {
		count_drop(DROP_ORPHAN_RETURN);
		return 0;
	}
	if (c->depth) {
		c->depth--;
		return 0;
	}
	ret = (s32)ret_value(ctx);
	comm = c->comm;
	/* ncclInProgress (7): a non-blocking init that goes on in the background. */
	if (args_of(c->op) == ARGS_NCCL_INIT_RANK && (ret == 0 || ret == 7) && c->out &&
	    !bpf_probe_read_user(&ck.comm, sizeof(ck.comm), (void *)c->out) && ck.comm) {
		drop = store_admitted(&nccl_comms, &ck, &c->info, pid, QUOTA_NCCL_COMMS);
		if (drop != NO_DROP)
			count_drop(drop);
		comm = ck.comm;
	}
	add_nccl(id, c->op, comm, ret, c->bytes, true, now - c->start_ns);
	/* The thread's NVTX ranges stay open: they end at their own pops. */
	delete_admitted(&nccl_inflight, &id, pid, QUOTA_NCCL_INFLIGHT);
	return 0;
}

SEC("uprobe.multi")
int nccl_entry(struct pt_regs *ctx)
{
	return nccl_entry_impl(ctx);
}

SEC("uretprobe.multi")
int nccl_return(struct pt_regs *ctx)
{
	return nccl_return_impl(ctx);
}
