/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Every map of profi's object, by concern. Map sizes are placeholders: Go
 * sets max_entries from the flags before loading (internal/bpfobj).
 * ARCHITECTURE.md lists who writes and who reads each.
 */
#pragma once

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

/*
 * LRU so that threads dying mid-call cannot leak entries. Not admitted
 * (bpf/quota.h): an entry lives only while its thread is inside a probed
 * call, and admission would cost every timed call two map operations. A
 * process with more threads blocked inside probed calls than the map
 * holds can evict another's entry: that call is lost, counted as
 * DROP_ORPHAN_RETURN (docs/SECURITY.md).
 */
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
	__type(value, struct alloc_val);
} malloc_sizes SEC(".maps");

/*
 * One library file can be attached twice under two (dev, inode) keys: two
 * overlayfs mounts of one image layer show different inodes in
 * /proc/PID/maps, while the uprobe lands on the one real inode beneath.
 * Every call would then run the programs of both attachments. pid_files
 * (written by userspace from /proc/PID/maps) says which attachments are a
 * process's own; in a process userspace has not seen yet, each probed
 * address is claimed by the first attachment that fires there (pid_claim).
 * The value (struct pid_file_val) also says whether full-mode upgrade probes
 * serve the process (PF_FULL) and where its runtime's code is (PF_RT_TEXT):
 * one lookup per hit answers all of them.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct pid_file);
	__type(value, struct pid_file_val);
} pid_files SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct claim_key);
	__type(value, u32); /* file id */
} pid_claim SEC(".maps");

/*
 * Threads that launched a kernel, noted once each (thread_state.launcher):
 * tid -> pid. Userspace takes each entry at its drain (reads and deletes
 * it) and samples those threads' CPU time from then on.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, u32);   /* tid */
	__type(value, u32); /* pid */
} launch_threads SEC(".maps");

/* Unseen processes' identities (struct proc_identity); LRU: bounded by itself. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1024);
	__type(key, u32); /* pid */
	__type(value, struct proc_identity);
} unseen_procs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, DROP_MAX);
	__type(key, u32);
	__type(value, u64);
} drops SEC(".maps");

/*
 * libcudart's code in each unseen process, found by BPF (unseen_text in
 * handover.h): a driver launch whose return address lies there was made
 * by the runtime. A registered process's range is in its pid_files values.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, u32); /* pid */
	__type(value, struct text_range);
} rt_text SEC(".maps");

/*
 * A process that maps an attached file between two passes is unseen: no
 * pid_files or rt_text entry speaks for it yet, and it may exit before
 * the next pass. file_facts (written by userspace) are what every process
 * of a runtime file gets until then: PF_RT_SHARED, PF_RT_MARK and
 * PF_HANDED. rt_inodes (written by BPF, pruned by userspace when a file
 * goes) names the runtime file of a mapped inode, so that a driver launch
 * of an unseen process can tell from its return address's mapping that
 * the runtime made it (unseen_text in handover.h).
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, u32);  /* file id */
	__type(value, u8); /* enum pid_file_flag */
} file_facts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, u64);   /* struct inode address: stable while a probe holds the file */
	__type(value, u32); /* runtime file id */
} rt_inodes SEC(".maps");

/*
 * One trap per runtime launch (ARCHITECTURE.md, "One trap per
 * launch"). While a runtime file learns (PF_RT_MARK), each driver launch
 * its launches make records which runtime op entered the driver at that
 * site (rt_sites), and each op whether all its launches got there
 * (rt_ops). Userspace reads both; for an op that always reaches the driver
 * at sites no other op uses, it writes those sites into rt_counted and
 * detaches the op's runtime probes: from then on the driver entry counts
 * the launch, labelled with the runtime op. Not admitted: keyed by
 * runtime file, not process, and a full rt_sites costs other files their
 * handover (two traps a launch, DROP_RT_LEARN), never a count.
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 1024);
	__type(key, struct rt_site);
	__type(value, struct rt_site_val);
} rt_sites SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 1024);
	__type(key, struct rt_op_key);
	__type(value, struct rt_op_val);
} rt_ops SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, struct rt_site);
	__type(value, u32); /* the runtime op whose launches the driver counts there */
} rt_counted SEC(".maps");

/*
 * Each thread's state (struct thread_state): its current device, from
 * successful cudaSetDevice calls (every call's key carries it), and the
 * marker its last counted runtime launch left for the runtime->driver
 * guard (thread_marker). Task storage (issue 33): the value hangs off the
 * thread itself, so a lookup is a pointer walk and no hash, one per probe
 * run for both, a thread that never needed either costs one test of a
 * NULL pointer, the kernel frees it with the thread, and no process can
 * take another's room or evict another's markers: there is no shared
 * table to fill.
 */
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct thread_state);
} threads SEC(".maps");

/*
 * (pid, cudaKernel_t) handles whose call site was sent (NAME_LAUNCH_SITE):
 * a handle obtained before the agent attached has no __cudaGetKernel event,
 * and its call site (the nvcc-generated __device_stub_ function) names it.
 * LRU, not admitted: an evicted handle, another process's too, is only
 * sent again (one more name event), nothing is miscounted.
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 8192);
	__type(key, struct alloc_key); /* pid, handle */
	__type(value, u8);
} launch_sites SEC(".maps");

/*
 * CUDA graphs (types.h, docs/METRICS.md "CUDA graphs"). Streams capturing,
 * by (pid, stream): the id of the graph being captured. A stream that joined
 * a capture through an event keeps its entry after the capture ends; the
 * capture's entry in captures going away is what ends it for every stream
 * (capture_of deletes such stale entries as it meets them).
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct handle_key); /* pid, stream */
	__type(value, u64);		/* graph id */
} capture_streams SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct handle_key); /* pid, graph id */
	__type(value, struct capture);
} captures SEC(".maps");

/*
 * Events recorded on a capturing stream: waiting on one joins its capture.
 * Not LRU, so that no process can evict another's: each event holds a unit
 * of its tenant's share until it is recorded again outside a capture, or
 * the process exits (events are not tracked to their destruction).
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct handle_key); /* pid, event */
	__type(value, u64);		/* graph id */
} capture_events SEC(".maps");

/* Graph handles (cudaGraph_t) and executable graphs (cudaGraphExec_t) -> graph id. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct handle_key);
	__type(value, u64);
} graph_ids SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct handle_key);
	__type(value, u64);
} graph_execs SEC(".maps");

/* What each graph runs: kernels, copies, sets and child graphs, by graph id. Kept until the process
 * exits. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 131072);
	__type(key, struct graph_node_key);
	__type(value, struct graph_node_val);
} graph_nodes SEC(".maps");

/* Replays, cumulative: userspace multiplies them by their graph's nodes. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct replay_key);
	__type(value, u64);
} graph_replays SEC(".maps");

/*
 * Per-process quotas (issue 17): graph ids and executable graphs against
 * their caps, admitted streams, the process's tenant, and the keys the
 * process holds in each shared map (enum quota_map), which count against
 * its tenant's share (take_shared). Written only when a key is new (admit),
 * never on the path of a key that exists. This map is shared the same way
 * (QUOTA_PID_QUOTAS), so no tenant takes the reserve kept for others. Deleted by
 * userspace when the process exits, which then gives its units back to its
 * tenant (tenant_returned).
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, u32);
	__type(value, struct pid_quota);
} pid_quotas SEC(".maps");

/*
 * Per-tenant quotas (issue 30 item 3; struct tenant_quota): the keys a
 * tenant's processes hold in each quota map, taken and given back by BPF,
 * and the new keys it was refused; and those userspace gave back when it deleted an exited
 * process's keys. Entries of a tenant with no process left and nothing held are deleted by
 * userspace.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, u64); /* tenant */
	__type(value, struct tenant_quota);
} tenant_quotas SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, u64); /* tenant */
	__type(value, struct tenant_quota);
} tenant_returned SEC(".maps");

/*
 * The node's pod cgroups (issue 47 item 1), cgroup id → 1: written by
 * userspace (internal/tenant, from kubelet's cgroup names), read by
 * tenant_of. 4096 pods, internal/tenant MaxPods.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, u64);
	__type(value, u8);
} tenant_roots SEC(".maps");

/* Scratch for a new pid_quotas value: too big for the stack of its callers. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct pid_quota);
} quota_scratch SEC(".maps");

/*
 * The streams each process may name in keys, (pid, stream): the first
 * --max-streams-per-pid non-default streams it used. Keys of any other
 * stream are folded into STREAM_OTHER in BPF (userspace labels it
 * "other"), so fake stream handles cannot multiply a process's keys.
 * A full map folds too. Deleted by userspace when the process exits.
 * Sized at load as aggregated and launch_agg together, at least 16384
 * (internal/bpfobj PIDStreamsSize).
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct handle_key); /* pid, stream */
	__type(value, u8);
} pid_streams SEC(".maps");

/* Kernel names (full mode): a few events per process, never per launch. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} kernel_regs SEC(".maps");

/* --detailed-launches: one event per launch, besides (never instead of) launch_agg. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 2 * 1024 * 1024);
} events SEC(".maps");

/* Processes whose dynamic loader just changed their library list. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 64 * 1024);
} lib_loads SEC(".maps");

/*
 * Runtime ops that may be ready to hand over to the driver (rt_op_add): a
 * few records per runtime file, never per launch. A full ring leaves the
 * handover to the next discovery pass (DROP_RT_LEARN).
 */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 64 * 1024);
} rt_learned SEC(".maps");

/* NCCL calls per (pid, op, communicator, result, device). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 1024);
	__type(key, struct nccl_key);
	__type(value, struct nccl_val);
} nccl_agg SEC(".maps");

/*
 * NCCL calls in progress, per thread. A plain hash, not LRU: a hung call
 * must stay visible until it returns or its thread exits (thread_exit).
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 10240);
	__type(key, u64);
	__type(value, struct nccl_call);
} nccl_inflight SEC(".maps");

/*
 * Communicators seen at init, per process: rank, size, unique id. Not LRU,
 * so that no process can evict another's: each holds a unit of its
 * tenant's share until the process exits.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct nccl_comm_key);
	__type(value, struct nccl_comm);
} nccl_comms SEC(".maps");

/* Zeroed scratch for an nccl_call: too big for the stack next to the rest. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct nccl_call);
} nccl_scratch SEC(".maps");

/*
 * Probe hits per process, for the overhead estimate of --overhead-budget:
 * every program run is one trap in that process. Counted only when
 * count_hits is set; otherwise the verifier drops the code.
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_PERCPU_HASH);
	__uint(max_entries, 4096);
	__type(key, u32);
	__type(value, u64);
} pid_hits SEC(".maps");

/*
 * Open NVTX ranges per thread (--enable-nvtx-tracing): the phase rule of
 * each, pushed and popped by nvtx_push/nvtx_pop, deleted when the last
 * range closes or the thread exits (thread_exit), and by userspace when its
 * process has exited. Not LRU, so that no process can evict another's: each
 * thread with a range open holds a unit of its tenant's share.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, u64); /* pid_tgid */
	__type(value, struct nvtx_ranges);
} nvtx_stack SEC(".maps");

/* A range name being classified: too big for the stack. */
struct nvtx_name {
	u32 wide[NVTX_NAME_LEN];    /* UTF-32 names (nvtxRangePushW, NVTX_MESSAGE_TYPE_UNICODE) */
	u8 buf[NVTX_NAME_LEN + 16]; /* lowercased ASCII, zero padded past the name */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct nvtx_name);
} nvtx_scratch SEC(".maps");

/*
 * The crash circuit breaker (ARCHITECTURE.md, "Crash circuit breaker"):
 * each process's latest probe hit, which attached file trapped and when,
 * and the processes that then died of a fault signal. One value per
 * process, shared by its threads: written at most once a tick unless
 * another file traps, so threads on other CPUs rarely write the same
 * line. Off (crash_breaker false), the verifier drops the code.
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, u32); /* pid */
	__type(value, struct last_hit);
} pid_last_hit SEC(".maps");

/* Fault exits of processes with an entry in pid_last_hit (one per process). */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 64 * 1024);
} crash_events SEC(".maps");

/* crash_events reservations that failed: fault exits nobody saw. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, u64);
} crash_lost SEC(".maps");
