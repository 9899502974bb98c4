/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Admission to the shared maps by tenant (tenant_of, take_shared;
 * pid_quotas, tenant_quotas, pid_streams): lookup_or_admit for the
 * counters, store_admitted and delete_admitted for the state maps, and
 * malloc_sizes' tracking.
 */
#pragma once

/* "Nothing lost" (graph_return, store_admitted). */
#define NO_DROP DROP_MAX

/*
 * The deepest cgroup level tenant_of looks at for a pod's cgroup: kubelet
 * puts it at level 2 or 3, kind's nested kubelet one deeper (internal/tenant
 * MaxDepth).
 */
#define MAX_TENANT_LEVEL 8

/*
 * The tenant of the current process, pid (struct pid_quota; issue 47
 * item 1): the pod, however deep its containers nest cgroups below it:
 * the shallowest ancestor of the current cgroup that userspace found to be
 * a pod's (tenant_roots, internal/tenant); else the current cgroup (a
 * container, outside Kubernetes a service or session); a process in the
 * root cgroup (everywhere without cgroup v2) is a tenant of its own. A
 * global function: verified once, its loop not at every caller's path.
 */
__noinline u64 tenant_of(u32 pid)
{
	u64 leaf = bpf_get_current_cgroup_id();

	for (int level = 1; level <= MAX_TENANT_LEVEL; level++) {
		u64 id = bpf_get_current_ancestor_cgroup_id(level);

		if (!id)
			break; /* deeper than the current cgroup */
		if (bpf_map_lookup_elem(&tenant_roots, &id))
			return id;
		if (id == leaf)
			break;
	}
	/* 1: the root cgroup (also where every process is without cgroup v2). */
	return leaf > 1 ? leaf : TENANT_PID | pid;
}

/*
 * Keys of each quota map the node holds (docs/METRICS.md, "Shares of the
 * shared maps"): node_keys taken and given back here, node_returned what
 * userspace gave back for exited processes (its own section, written
 * only by userspace, so that its writes never undo BPF's atomic adds).
 */
u32 node_keys[QUOTA_MAPS] = {};
u32 node_returned[QUOTA_MAPS] SEC(".data.returned") = {};

/*
 * One unit of map qm for tenant t (issue 47 item 1): work-conserving.
 * While the node holds fewer than node_room[qm] keys of the map, any
 * tenant takes one, however many it holds: a tenant alone may use what no
 * one else needs. Past it, the reserve left is kept for tenants holding
 * fewer than tenant_guarantee[qm] keys, so that a newcomer always finds
 * its guarantee whoever came first. Units are counted before the checks
 * and given back when refused, so a race only ever refuses a unit, never
 * grants one past a bound. A refusal is counted for the tenant (refused).
 * What a tenant holds is what its processes took less what userspace gave
 * back for those that exited (tenant_returned). qm must be a constant or
 * checked < QUOTA_MAPS; *tenant is in a map value (no stack for the key:
 * internal/bpfobj's TestStackDepth).
 */
static __always_inline bool take_shared(struct tenant_quota *t, const u64 *tenant, u32 qm)
{
	struct tenant_quota *r;

	__sync_fetch_and_add(&t->keys[qm], 1);
	if (!node_room[qm] ||
	    (s32)(__sync_fetch_and_add(&node_keys[qm], 1) - node_returned[qm]) < (s32)node_room[qm])
		return true;
	r = bpf_map_lookup_elem(&tenant_returned, tenant);
	/*
	 * This unit is in t->keys already; units other CPUs took meanwhile
	 * only make the tenant look fuller. Below 0 only if userspace deleted
	 * the tenant's entry while a process took a unit.
	 */
	if ((s32)(t->keys[qm] - 1 - (r ? r->keys[qm] : 0)) < (s32)tenant_guarantee[qm])
		return true;
	__sync_fetch_and_add(&node_keys[qm], -1);
	__sync_fetch_and_add(&t->keys[qm], -1);
	__sync_fetch_and_add(&t->refused[qm], 1);
	return false;
}

/* Gives back a unit take_shared granted. */
static __always_inline void give_shared(struct tenant_quota *t, u32 qm)
{
	__sync_fetch_and_add(&t->keys[qm], -1);
	if (node_room[qm])
		__sync_fetch_and_add(&node_keys[qm], -1);
}

/*
 * Creates the quota of process pid, the current process, at its first new
 * key: with its tenant, within the tenant's share of pid_quotas. Counted
 * when refused or a map is full. Inlined into quota_of, its one caller.
 */
static __always_inline int new_quota(u32 pid)
{
	struct tenant_quota *t;
	struct pid_quota *nq;
	u32 zero = 0;

	/* Built in a scratch value: the stack of the calls above is full. */
	nq = bpf_map_lookup_elem(&quota_scratch, &zero);
	if (!nq)
		return -1;
	__builtin_memset(nq, 0, sizeof(*nq));
	nq->tenant = tenant_of(pid);
	nq->keys[QUOTA_PID_QUOTAS] = 1;
	t = lookup_or_init(&tenant_quotas, &nq->tenant, &zero_tenant, DROP_PID_QUOTA);
	if (!t)
		return -1;
	if (!take_shared(t, &nq->tenant, QUOTA_PID_QUOTAS)) {
		count_drop(DROP_PID_QUOTA);
		return -1;
	}
	/* Failed: pid_quotas is full, or another thread created it (holding its own unit). */
	if (bpf_map_update_elem(&pid_quotas, &pid, nq, BPF_NOEXIST)) {
		give_shared(t, QUOTA_PID_QUOTAS);
		if (!bpf_map_lookup_elem(&pid_quotas, &pid)) {
			count_drop(DROP_PID_QUOTA);
			return -1;
		}
	}
	return 0;
}

/*
 * The quota of process pid, the current process; NULL (counted) when it
 * has none and gets none. Not inlined: one copy, off the hot path (a key
 * that exists needs no quota), and a frame of its own at the bottom of a
 * call chain keeps its callers' frames small: 6.1's verifier allows 512
 * bytes of stack for a program's deepest chain (internal/bpfobj's
 * TestStackDepth).
 */
static __noinline struct pid_quota *quota_of(u32 pid)
{
	struct pid_quota *q = bpf_map_lookup_elem(&pid_quotas, &pid);

	if (q || new_quota(pid))
		return q;
	return bpf_map_lookup_elem(&pid_quotas, &pid);
}

/*
 * Shares of the shared maps (issues 17, 30, 47: a process calling with
 * thousands of fake stream handles or return codes must not fill a map
 * every other process needs). Paid only when a key is new: the hot path,
 * a key that exists, is one lookup as before (lookup_or_admit).
 *
 * Units are taken before the insert and given back when it fails, so no
 * bound is passed. Two CPUs that race to insert the same new key (a
 * per-CPU hash's key is shared by all CPUs: one BPF_NOEXIST insert wins,
 * the other gets -EEXIST) both hold a unit for a moment: a new key at the
 * edge may be refused meanwhile. That over-count is conservative and
 * transient.
 */

/*
 * Takes one of the n units counted in *used; false (none taken) when all
 * are used. n = 0: no limit (a map whose share would be all of it).
 */
static __always_inline bool take(u32 *used, u32 n)
{
	if (__sync_fetch_and_add(used, 1) < (n ? n : 0xffffffff))
		return true;
	__sync_fetch_and_add(used, -1);
	return false;
}

/*
 * Whether process pid may name stream in its keys: the default stream and
 * STREAM_OTHER always, else the first max_streams_per_pid streams it used
 * (pid_streams). A full pid_streams admits no new stream.
 */
static __always_inline bool stream_admitted(struct pid_quota *q, u32 pid, u64 stream)
{
	struct handle_key k = {.pid = pid, .handle = stream};
	u8 one = 1;
	long err;

	if (!stream || stream == STREAM_OTHER || bpf_map_lookup_elem(&pid_streams, &k))
		return true;
	if (!take(&q->streams, max_streams_per_pid))
		return false;
	err = bpf_map_update_elem(&pid_streams, &k, &one, BPF_NOEXIST);
	if (!err)
		return true;
	__sync_fetch_and_add(&q->streams, -1);
	return err == -EEXIST; /* another CPU admitted it first */
}

/*
 * One unit of map qm for process pid, of its tenant's share (take_shared):
 * 1 when taken, 0 when refused (or pid has no quota). The process's own
 * count is what userspace gives back when it exits. A global function:
 * verified once, not at each of its callers' paths (admit, store_admitted,
 * track_alloc, all under graph_return's), and its frame is its own.
 */
__noinline int take_unit(u32 pid, u32 qm)
{
	struct pid_quota *q = bpf_map_lookup_elem(&pid_quotas, &pid);
	struct tenant_quota *t;

	if (!q || qm >= QUOTA_MAPS)
		return 0;
	t = bpf_map_lookup_elem(&tenant_quotas, &q->tenant);
	if (!t || !take_shared(t, &q->tenant, qm))
		return 0;
	__sync_fetch_and_add(&q->keys[qm], 1);
	return 1;
}

/*
 * Gives back a unit of map qm that process pid held (its key was
 * deleted). Global, like take_unit.
 */
__noinline int give_unit(u32 pid, u32 qm)
{
	struct pid_quota *q = bpf_map_lookup_elem(&pid_quotas, &pid);
	struct tenant_quota *t;

	if (!q || qm >= QUOTA_MAPS || !q->keys[qm])
		return 0;
	__sync_fetch_and_add(&q->keys[qm], -1);
	t = bpf_map_lookup_elem(&tenant_quotas, &q->tenant);
	if (t)
		give_shared(t, qm);
	return 0;
}

/* The drop counted when map qm itself is full. */
static __always_inline u32 full_drop(u32 qm)
{
	switch (qm) {
	case QUOTA_AGGREGATED:
		return DROP_AGGREGATED;
	case QUOTA_LAUNCH_AGG:
		return DROP_LAUNCH_AGG;
	case QUOTA_NCCL_AGG:
		return DROP_NCCL_AGG;
	case QUOTA_MALLOC_SIZES:
		return DROP_MALLOC_SIZES;
	case QUOTA_GRAPH_REPLAYS:
		return DROP_GRAPH_REPLAYS;
	case QUOTA_CAPTURE_STREAMS:
	case QUOTA_CAPTURES:
	case QUOTA_CAPTURE_EVENTS:
		return DROP_CAPTURE;
	case QUOTA_NCCL_INFLIGHT:
		return DROP_NCCL_INFLIGHT;
	case QUOTA_NCCL_COMMS:
		return DROP_NCCL_COMMS;
	case QUOTA_NVTX_STACK:
		return DROP_NVTX_STACK;
	case QUOTA_PID_QUOTAS:
		return DROP_PID_QUOTA;
	}
	return DROP_GRAPH_MAPS;
}

/*
 * A key that is not in map qm yet. Its stream (NULL: the key has none)
 * beyond the process's admitted streams is folded into STREAM_OTHER, and
 * that key looked up again; a key still new is inserted within the
 * tenant's share of the map, else dropped and counted (DROP_PID_QUOTA)
 * without touching any other process's keys. Every key begins with its
 * u32 pid. Not inlined: one copy serves every map.
 */
static __noinline void *admit(void *map, void *key, u64 *stream, const void *zero, u32 qm)
{
	u32 pid = *(u32 *)key;
	struct pid_quota *q;
	void *v;

	q = quota_of(pid);
	if (!q)
		return NULL;
	if (stream && !stream_admitted(q, pid, *stream)) {
		*stream = STREAM_OTHER;
		v = bpf_map_lookup_elem(map, key);
		if (v)
			return v;
	}
	/* Kept: clang drops the check (every caller passes a constant), the verifier needs it. */
	asm volatile("" : "+r"(qm));
	if (qm >= QUOTA_MAPS)
		return NULL;
	if (!take_unit(pid, qm)) {
		count_drop(DROP_PID_QUOTA);
		return NULL;
	}
	/* Failed: the map is full, or another CPU inserted the key (and counted it). */
	if (bpf_map_update_elem(map, key, zero, BPF_NOEXIST))
		give_unit(pid, qm);
	v = bpf_map_lookup_elem(map, key);
	if (!v)
		count_drop(full_drop(qm));
	return v;
}

/*
 * lookup_or_init for the shared maps with per-process quotas: this CPU's
 * value for key, admitted first when the key is new. *stream may be
 * folded into STREAM_OTHER.
 */
static __always_inline void *lookup_or_admit(void *map, void *key, u64 *stream, const void *zero,
					     u32 qm)
{
	void *v = bpf_map_lookup_elem(map, key);

	if (v)
		return v;
	return admit(map, key, stream, zero, qm);
}

/*
 * Records a live allocation in malloc_sizes within its tenant's share;
 * false when it is not tracked (counted). An address handed out again
 * while its entry is still there (its free was not seen) replaces the
 * entry and takes no unit.
 */
static __noinline bool track_alloc(struct alloc_key *ak, struct alloc_val *av)
{
	struct pid_quota *q = quota_of(ak->pid);
	long err;

	if (!q)
		return false;
	if (!take_unit(ak->pid, QUOTA_MALLOC_SIZES)) {
		if (!bpf_map_update_elem(&malloc_sizes, ak, av, BPF_EXIST))
			return true;
		count_drop(DROP_PID_QUOTA);
		return false;
	}
	err = bpf_map_update_elem(&malloc_sizes, ak, av, BPF_NOEXIST);
	if (!err)
		return true;
	give_unit(ak->pid, QUOTA_MALLOC_SIZES);
	if (err == -EEXIST && !bpf_map_update_elem(&malloc_sizes, ak, av, BPF_EXIST))
		return true;
	count_drop(DROP_MALLOC_SIZES);
	return false;
}

/* Gives back the unit of a malloc_sizes entry just deleted. */
static __always_inline void untrack_alloc(u32 pid)
{
	give_unit(pid, QUOTA_MALLOC_SIZES);
}

/*
 * The state maps (issue 30: one process holding 4,096 open captures, or
 * naming endless graph handles, filled captures and graph_ids, and every
 * other process's captured launches counted as run and its graph kernels
 * lost): capture_streams, captures, capture_events, graph_ids and
 * nccl_inflight. Each key of process pid holds a unit of its share of map
 * qm from its insert to its delete (delete_admitted), so what one process
 * holds is bounded and a victim finds room.
 *
 * Stores val under key. A key that exists is replaced (no unit taken),
 * unless qm has NEW_ONLY: then it fails like a full map. A new key takes
 * a unit first. Returns NO_DROP when stored, DROP_PID_QUOTA when pid's
 * share is used up (its process's keys are untouched), the map's own drop
 * (full_drop) when the insert failed, and DROP_MAX + 1 when pid_quotas
 * itself was full (counted already). Not inlined: one copy serves every
 * map.
 */
#define NEW_ONLY 0x100

static __noinline u32 store_admitted(void *map, void *key, void *val, u32 pid, u32 qm)
{
	bool replace = !(qm & NEW_ONLY);
	struct pid_quota *q;
	long err;

	qm &= ~NEW_ONLY;
	if (replace && !bpf_map_update_elem(map, key, val, BPF_EXIST))
		return NO_DROP;
	q = quota_of(pid);
	if (!q)
		return DROP_MAX + 1;
	asm volatile("" : "+r"(qm));
	if (qm >= QUOTA_MAPS)
		return DROP_MAX + 1;
	if (!take_unit(pid, qm))
		return DROP_PID_QUOTA;
	err = bpf_map_update_elem(map, key, val, BPF_NOEXIST);
	if (!err)
		return NO_DROP;
	give_unit(pid, qm);
	/* Another CPU inserted it meanwhile (and holds its unit). */
	if (err == -EEXIST && replace && !bpf_map_update_elem(map, key, val, BPF_EXIST))
		return NO_DROP;
	return full_drop(qm);
}

/* Deletes key of process pid from map qm's map; true (its unit given back) when it was there. */
static __noinline bool delete_admitted(void *map, void *key, u32 pid, u32 qm)
{
	if (bpf_map_delete_elem(map, key))
		return false;
	asm volatile("" : "+r"(qm));
	if (qm < QUOTA_MAPS)
		give_unit(pid, qm);
	return true;
}
