/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Types shared between the BPF programs and Go. bpf2go generates the Go
 * side from these definitions (-type ...); never copy them by hand.
 */
#pragma once

#include "common.h"

#include "ops.h"

/* memcpy kinds beyond cudaMemcpyKind, for copies that name no kind. */
#define KIND_P2P 0x100

/* Index into the drops array: one counter per way data can be lost. */
enum drop {
	DROP_AGGREGATED = 0,	/* aggregated map full */
	DROP_LAUNCH_AGG = 1,	/* launch_agg map full */
	DROP_INFLIGHT = 2,	/* inflight insert failed */
	DROP_MALLOC_SIZES = 3,	/* malloc_sizes map full: a live allocation is untracked */
	DROP_ORPHAN_RETURN = 4, /* return probe without its entry (evicted, or attached mid-call) */
	DROP_NESTED = 5, /* probed call nested in another probed call on one thread: not timed */
	DROP_EVENTS_RING = 6, /* events ring-buffer reserve failure */
	DROP_PID_CLAIM = 7,   /* pid_claim update failed: the hit is counted by every alias */
	DROP_KERNEL_REGS = 8, /* kernel_regs ring-buffer reserve failure: a kernel name is lost */
	DROP_RT_TO_DRV = 9,   /* driver launch made by a runtime launch: counted once, as runtime */
	DROP_LIB_LOADS = 10,  /* lib_loads ring full: that process waits for the periodic rescan */
	DROP_NCCL_AGG = 11,   /* nccl_agg map full */
	DROP_NCCL_INFLIGHT =
	    12, /* nccl_inflight insert failed: that call is neither timed nor watched */
	DROP_NVTX_STACK = 13,	 /* nvtx_stack insert failed: that thread's ranges give no phase */
	DROP_GRAPH_MAPS = 14,	 /* a graph map full: a graph, node or binding is not replayed */
	DROP_GRAPH_QUOTA = 15,	 /* a process's graphs or executable graphs beyond their cap */
	DROP_GRAPH_REPLAYS = 16, /* graph_replays full: a replay is not expanded */
	DROP_CAPTURE = 17,	 /* a capture map full: a stream's capture state is lost */
	DROP_PID_QUOTA = 18,	 /* a new shared-map key refused (take_shared) */
	DROP_RT_LEARN = 19,   /* rt_sites or rt_ops full, or rt_learned: a runtime file's launches
				 stay counted by its own probes (two traps) until a pass hands
				 them over, nothing is lost */
	DROP_NCCL_COMMS = 20, /* nccl_comms full: a communicator's rank and size are not known */
	DROP_THREAD_DEVICE =
	    21, /* no memory for a thread's device: its later calls keep its old device */
	DROP_RT_MARKER =
	    22, /* no memory for a runtime launch's marker: its driver launch may count too */
	DROP_RT_TEXT = 23, /* an unseen process's runtime range not found (its mappings busy)
			      or not stored (rt_text full): until a pass registers it, its
			      handed-over runtime launches count as the driver's op */
	DROP_LAUNCH_THREADS =
	    24, /* launch_threads full, or no memory for the thread's state: a thread that
		   launches kernels is not in the launching threads' CPU time */
	DROP_BREAKER_HIT = 25, /* no memory for a thread's state, or for its process's crash record
				  (pid_last_hit): a fault in that thread is not tied to a probe, so
				  it cannot quarantine a file */
	DROP_MAX = 26,
};

/* Latency buckets: 13 finite inclusive upper bounds + the +Inf bucket. */
#define LAT_BUCKETS 14
/* Kernel launch latency buckets: 8 finite bounds + +Inf. */
#define KLAT_BUCKETS 9

/*
 * Device of a call: the process-local CUDA ordinal the calling thread last
 * set (cudaSetDevice), or DEV_NONE when it never set one. Userspace maps it
 * to a physical GPU (CUDA_VISIBLE_DEVICES, NVML).
 */
#define DEV_NONE 0xffffffff

/*
 * Device ordinals a process may name (issue 47 item 3): CUDA numbers the
 * devices a process sees from 0, MIG instances included (8 GPUs of 7
 * instances each: 56). A cudaSetDevice beyond is no device of the node,
 * whatever the process's own runtime answered: its calls count under
 * DEV_INVALID, one key, not one per ordinal.
 */
#define MAX_DEVICES 64
#define DEV_INVALID 0xfffffffe

/* Key of the aggregated map: one per (process, operation, kind, result, device, stream). */
struct agg_key {
	u32 pid;    /* host tgid */
	u32 op;	    /* enum op */
	u32 kind;   /* cudaMemcpyKind for memcpy, else 0 */
	s32 err;    /* return value: cudaError_t */
	u32 dev;    /* device ordinal of the call, DEV_NONE when not set */
	u32 pad;    /* keeps stream 8-byte aligned; always 0 */
	u64 stream; /* cudaStream_t handle, 0 = default stream */
};

/* Value of the aggregated map, per CPU. Cumulative: never reset or deleted while the process lives.
 */
struct agg_val {
	u64 count;
	u64 timed;		  /* timed calls, scaled by the sample rate (= count unsampled) */
	u64 duration_ns;	  /* sum of host-side API latency */
	u64 bytes;		  /* memcpy bytes, allocated or freed bytes */
	u64 buckets[LAT_BUCKETS]; /* latency histogram, not cumulative */
};

/* NCCL host-side latency buckets: 11 finite bounds (10 us .. 1 s) + +Inf. */
#define NLAT_BUCKETS 12
/* sizeof(ncclUniqueId): an opaque blob all ranks of one communicator share. */
#define NCCL_ID_LEN 128

/* Key of the nccl_agg map: one per (process, operation, communicator, result). */
struct nccl_key {
	u32 pid;
	u32 op;
	u64 comm; /* ncclComm_t handle; 0 for calls that name none (group calls, init) */
	s32 err;  /* ncclResult_t */
	u32 dev;  /* device ordinal of the calling thread, DEV_NONE when not set */
};

struct nccl_val {
	u64 count;
	u64 bytes; /* element count x datatype size; 0 for an unknown datatype */
	u64 timed; /* calls with a latency (every call but ncclGroupStart) */
	u64 duration_ns;
	u64 buckets[NLAT_BUCKETS];
};

/* A communicator as its init call described it. */
struct nccl_comm {
	s32 rank;
	s32 nranks;
	u8 id[NCCL_ID_LEN]; /* the ncclUniqueId */
};

/*
 * An NCCL call in progress on a thread (nccl_inflight, keyed by pid_tgid).
 * Userspace reads the start times to find hung calls.
 */
struct nccl_call {
	u64 start_ns;
	u64 comm;
	u64 bytes;
	u64 out; /* init: the ncclComm_t * the call fills */
	u32 op;
	u32 depth;
	struct nccl_comm info; /* init calls */
};

struct nccl_comm_key {
	u32 pid;
	u32 pad;
	u64 comm;
};

/*
 * The `phase` label of a launch (docs/INTERFACE.md): the rule the innermost open
 * NVTX range matching one gives, PHASE_OTHER when ranges are open but none
 * matches, PHASE_NONE when none is open (or NVTX tracing is off).
 */
enum phase {
	PHASE_NONE = 0,
	PHASE_PREFILL = 1,   /* prefill, prompt, encode */
	PHASE_DECODE = 2,    /* decode, generate */
	PHASE_ATTENTION = 3, /* attention, attn */
	PHASE_MLP = 4,	     /* mlp, ffn, expert */
	PHASE_NORM = 5,	     /* norm, embed */
	PHASE_OTHER = 6,
	PHASE_MAX = 7,
};

/* Open NVTX ranges kept per thread; deeper ones are counted, not classified. */
#define NVTX_DEPTH 16
/* Characters of a range name classified. */
#define NVTX_NAME_LEN 64

/* Value of nvtx_stack (per thread): the phase rule of each open range, outermost first. */
struct nvtx_ranges {
	u32 depth; /* open ranges, also beyond NVTX_DEPTH */
	u8 phases[NVTX_DEPTH];
};

/* Key of the launch aggregation map. */
struct launch_key {
	u32 pid;
	u32 op;
	u64 stream;
	u64 func;     /* host stub (runtime) or CUfunction (driver); 0 in anonymous mode */
	u32 phase;    /* enum phase at the launch */
	u32 dev;      /* device ordinal of the launching thread, DEV_NONE when not set */
	u32 captured; /* 1: the stream was capturing a graph, nothing ran */
	u32 pad;
};

struct launch_val {
	u64 count;
	u64 grid_blocks;   /* sum of gridDim.x*y*z */
	u64 block_threads; /* sum of blockDim.x*y*z */
	u64 shared_bytes;  /* sum of dynamic shared memory */
	/* Full mode only: host-side launch latency. */
	u64 timed;
	u64 duration_ns;
	u64 buckets[KLAT_BUCKETS];
};

/* A decoded kernel launch. */
struct launch_args {
	u64 func;
	u64 stream;
	u64 grid_blocks;
	u64 block_threads;
	u64 shared_bytes;
};

/* Per-thread state of a timed call between its entry and return probes. */
struct inflight_call {
	u64 start_ns;
	u64 arg0; /* malloc: void **devPtr; free: the pointer; name sources: the out pointer */
	u64 arg1; /* malloc: size; memcpy/memset: bytes; free: size found at entry; name pointer */
	u64 stream;
	u32 op;
	u32 kind;
	u32 depth;   /* nested probed calls on this thread */
	u32 sampled; /* the latency of this call is measured (--sample-rate) */
	u32 dev;     /* free of a tracked allocation: the allocation's device */
	u32 pad;
	struct launch_args launch; /* timed launches (full mode); pitched malloc: func = &pitch */
};

/* Kinds of name_event. */
enum name_kind {
	NAME_HOST_FUNC = 1,   /* __cudaRegisterFunction: host stub -> device function name */
	NAME_CU_FUNCTION = 2, /* cuModuleGetFunction: CUfunction -> name */
	NAME_CU_KERNEL = 3,   /* cuLibraryGetKernel: CUkernel -> name */
	NAME_KERNEL_FUNC = 4, /* cuKernelGetFunction: CUfunction -> CUkernel (aux) */
	NAME_RT_KERNEL = 5,   /* __cudaGetKernel: cudaKernel_t -> host stub (aux) */
	NAME_LAUNCH_SITE = 6, /* __cudaLaunchKernel: cudaKernel_t -> its first call site (aux) */
};

#define NAME_LEN 256

/* A kernel name source seen in BPF, sent on the kernel_regs ring buffer. */
struct name_event {
	u32 pid;
	u32 kind; /* enum name_kind */
	u64 key;  /* host stub, CUfunction or CUkernel */
	u64 aux;  /* NAME_KERNEL_FUNC: the CUkernel; other kinds: the name's address */
	char name[NAME_LEN];
};

/*
 * The executable mapping of libcudart in a process: rt_text's value for an
 * unseen process (found by BPF), and what driver_launch_op reads from a
 * registered one's pid_files value.
 */
struct text_range {
	u64 start;
	u64 end;
	u32 file;   /* the runtime file's id (rt_sites and rt_counted keys) */
	u32 handed; /* some of its launch ops are counted at the driver (rt_counted): in
		       rt_text, unused (file_facts says it) */
};

/* One launch, sent on the events ring buffer with --detailed-launches. */
struct launch_event {
	u64 ts_ns; /* bpf_ktime_get_ns at entry */
	u32 pid;
	u32 tid;
	u32 op;
	s32 err;	 /* return code; 0 when not seen (anonymous mode) */
	u64 duration_ns; /* host-side launch latency; 0 when not timed */
	struct launch_args launch;
};

/* Runtime launch in progress on a thread, for the runtime->driver guard. */
struct rt_launch {
	u64 sp;	    /* stack pointer at the runtime launch's entry; 0: no marker */
	u64 ret;    /* its return address (rt_marker_live) */
	u32 learn;  /* 1 + the counted runtime launch's op while its file learns (PF_RT_MARK); 0 */
	u16 merged; /* a driver launch below it was seen */
	u16 tail; /* a __cudaLaunchKernel whose tail jump into cudaLaunchKernel is still to come */
};

/* A thread's state (threads): everything a probe keeps per thread, one lookup. */
struct thread_state {
	struct rt_launch rt; /* the marker of its last counted runtime launch; rt.sp 0: none */
	u32 dev;	     /* the device its last successful cudaSetDevice set; DEV_NONE: none */
	u32 launcher;	     /* 1: it launched a kernel and was noted in launch_threads */
	/* Its latest probe hit (the crash breaker, note_hit; read at its fault). */
	u64 hit_ns; /* bpf_ktime_get_ns of the tick's first hit: at most a tick before the latest */
	u32 hit_file; /* the attached file whose probe trapped last (its cookie's file id) */
	u32 hit_tick; /* low 32 bits of bpf_jiffies64 when hit_ns was read */
};

/*
 * Where a runtime launch enters the driver: the runtime file, the driver
 * launch function, and the return address as an offset into the runtime's
 * code (the same for every process mapping that file). Key of rt_sites
 * and rt_counted.
 */
struct rt_site {
	u32 file;
	u32 drv_op;
	u64 off;
};

/* rt_sites value, per CPU: which runtime launch op entered the driver there. */
struct rt_site_val {
	u32 op;	   /* 1 + op; 0 not seen on this CPU */
	u32 mixed; /* a second runtime op entered there too */
	u64 merged;
};

/* Key of rt_ops: a runtime launch op of one runtime file. */
struct rt_op_key {
	u32 file;
	u32 op;
};

/*
 * A new runtime file hands its launches over to the driver within its first
 * launches, not at the next discovery pass: when one CPU has seen
 * RT_MIN_MERGED launches of an op reach the driver, rt_op_add sends
 * rt_learned_event to userspace, which runs the handover then
 * (Attacher.WatchLearning). RT_MIN_MERGED is also the handover's threshold
 * (attach.MinMerged).
 */
enum rt_handover {
	RT_MIN_MERGED = 16,
};

/* A record of rt_learned: an op of a runtime file may be ready to hand over. */
struct rt_learned_event {
	u32 file; /* runtime file id */
	u32 op;	  /* enum op */
};

/* rt_ops value, per CPU: how that op's launches reached the driver while learning. */
struct rt_op_val {
	u64 merged;   /* followed by a driver launch on the thread */
	u64 unmerged; /* the next runtime launch came first: this one never reached the driver */
	u64 tails;    /* entered by CUDA 13's __cudaLaunchKernel tail jump (not counted) */
	u32 tail_of;  /* 1 + the op whose tail jump that was */
	u32 pad;
};

/*
 * The BPF cookie of every probe: the operation in the low 32 bits, the id
 * of the attached library file in the high 32 bits.
 */
#define COOKIE_OP(c)   ((u32)(c))
#define COOKIE_FILE(c) ((u32)((c) >> 32))

/*
 * Why a fault is the probes' doing (the crash breaker's evidence,
 * bpf/exit.c): bits of last_hit.fault_why and crash_event.fault_why.
 */
enum fault_why {
	FAULT_XOL = 1, /* the instruction pointer is in the uprobe out-of-line page ([uprobes]) */
	FAULT_PROBED_INSN = 2, /* it is a probed instruction (the uprobe breakpoint is there) */
	FAULT_RETURN =
	    4, /* a return probe's hijacked return was left without the kernel's return handling */
	FAULT_URETPROBE_SYS = 8, /* killed (SIGSYS) in the return probe's system call */
};

/*
 * pid_last_hit's value: a probed process's crash record (the crash
 * breaker), created by the first probe hit of each of its threads.
 */
struct last_hit {
	u64 ns;	  /* the faulting thread's latest hit (thread_state.hit_ns) */
	u32 file; /* the attached file of that hit; 0: the thread had none, nothing to tie */
	u32 pad0;
	/* The process's latest fault the kernel raised (si_code > 0), as delivered. */
	u64 fault_ip;	/* the user instruction pointer */
	u64 fault_addr; /* si_addr */
	s32 fault_code; /* si_code */
	u8 fault_sig;
	u8 fault_why; /* enum fault_why bits; 0: nothing points at a probe */
	u16 pad;
};

/* A probed process killed by a fault signal (crash_events). */
struct crash_event {
	u32 pid;
	u32 tid;       /* the thread that reported it: the first to exit */
	u32 file;      /* the attached file of the process's latest probe hit */
	s32 exit_code; /* task->exit_code: the signal in the low 7 bits, 0x80 if it dumped core */
	u64 exit_ns;   /* bpf_ktime_get_ns at the exit */
	u64 hit_ns;    /* bpf_ktime_get_ns of that hit */
	u64 tenant;    /* tenant_of the reporting thread: its cgroup v2 id (quota.h) */
	u64 fault_ip;  /* the latest kernel-raised fault's instruction pointer, si_addr, si_code and
			  signal */
	u64 fault_addr;
	s32 fault_code;
	u8 fault_sig;
	u8 fault_why; /* enum fault_why bits: the evidence that a probe caused it */
	u16 pad;
	u8 comm[16]; /* the reporting thread's comm */
};

/*
 * Key of pid_files: (pid, file) says the process maps that attached file;
 * (pid, 0) says the process is known to userspace at all.
 */
struct pid_file {
	u32 pid;
	u32 file;
};

/*
 * Value of pid_files: everything a probe needs to know about its process
 * and file, so that one lookup answers it (issue 44): the flags, and with
 * PF_RT_TEXT the process's runtime code range, in the value of every file
 * the process maps (a driver launch reads it from the driver's entry).
 * Written whole by userspace, so the range and the flags saying it is
 * there never disagree.
 */
struct pid_file_val {
	u32 flags;    /* enum pid_file_flag */
	u32 rt_file;  /* PF_RT_TEXT: the runtime file's id (rt_sites and rt_counted keys) */
	u64 rt_start; /* PF_RT_TEXT: the executable mapping of that runtime in the process */
	u64 rt_end;
};

/* Bits of a pid_files value (written by internal/attach). */
enum pid_file_flag {
	PF_OWN = 1,	  /* the process maps this attached file (always set) */
	PF_FULL = 2,	  /* full-mode upgrade probes serve this (pid, file): launch_entry leaves
			     its launches to them; graph kernel nodes are named */
	PF_RT_TEXT = 4,	  /* the value holds the process's runtime code range: a driver launch
			     returning into it was made by the runtime (no marker needed) */
	PF_RT_SHARED = 8, /* that runtime is a shared library, not linked into the executable:
			     a runtime launch returning into its range was made by the runtime */
	PF_RT_MARK = 16,  /* its launch entries leave a marker with their op: the file learns
			     where its launches enter the driver (rt_sites, rt_ops), or some of
			     its launch ops are counted at the driver and the others must say
			     so (ARCHITECTURE.md, "One trap per launch") */
	PF_UNSEEN = 32,	  /* never stored: hit_flags says userspace has not registered the
			     process; its runtime facts are its file's (file_facts) */
	PF_HANDED = 64,	  /* some launch ops of the process's runtime file (with PF_RT_TEXT; in
			     file_facts, that file's) are counted at the driver (rt_counted) */
};

/*
 * Who a process was, noted by BPF when userspace has not registered it
 * (unseen_procs): a process that exits before the aggregator's drain sees
 * it alive keeps its series and its pod. start is its leader's
 * start_boottime (ns; /proc/PID/stat field 22 is start / 10 ms); cgroup
 * holds the names of its cgroup v2 leaf and of the leaf's parent, which
 * are where a kubelet puts the container and the pod.
 */
#define CGROUP_NAME_LEN 128
struct proc_identity {
	u64 start;
	u8 comm[16];
	char leaf[CGROUP_NAME_LEN];
	char parent[CGROUP_NAME_LEN];
};

/*
 * Key of pid_claim: a probe hit is identified by its process and address.
 * Two attachments of one file fire at the same address; different
 * libraries never do.
 */
struct claim_key {
	u32 pid;
	u32 pad;
	u64 ip;
};

struct alloc_key {
	u32 pid;
	u32 pad;
	u64 ptr;
};

/* Value of malloc_sizes: a live allocation, so its free counts on the same device. */
struct alloc_val {
	u64 size;
	u32 dev; /* device ordinal of the allocating call, DEV_NONE when not set */
	u32 pad;
};

/*
 * CUDA graphs (docs/METRICS.md, "CUDA graphs"). Every graph profi sees
 * built (captured, or node by node) gets a graph id, unique on the node and
 * never reused: its nodes are kept by id in graph_nodes, handles map to ids
 * (graph_ids, graph_execs), and a replay adds 1 to (executable graph's id,
 * stream, device, phase) in graph_replays. Userspace multiplies replays by
 * the nodes of their graph at drain time; the hot path stays one update.
 */
enum graph_node_type {
	GRAPH_NODE_KERNEL = 0, /* func: host stub, CUfunction or cudaKernel_t (0 anonymous) */
	GRAPH_NODE_MEMCPY = 1, /* kind: cudaMemcpyKind; bytes */
	GRAPH_NODE_MEMSET = 2, /* bytes */
	GRAPH_NODE_CHILD = 3,  /* func: the child graph's id; count: embeddings */
};

struct graph_node_key {
	u32 pid;
	u32 op;	   /* the call that recorded the node (a captured launch, copy or set, or
		      cudaGraphAdd*Node) */
	u64 graph; /* graph id */
	u64 func;
	u32 kind;
	u32 type; /* enum graph_node_type */
};

struct graph_node_val {
	u64 count; /* nodes of this key in the graph */
	u64 grid_blocks;
	u64 block_threads;
	u64 shared_bytes;
	u64 bytes;
};

/* Key of graph_replays: replays of one graph on one stream, device and phase. */
struct replay_key {
	u32 pid;
	u32 dev;
	u64 graph; /* graph id; 0: an executable graph profi did not see built */
	u64 stream;
	u32 phase;
	u32 pad;
};

/* Key of the per-process handle maps: (pid, handle). */
struct handle_key {
	u32 pid;
	u32 pad;
	u64 handle;
};

/* A capture in progress (captures, keyed by (pid, graph id)). */
struct capture {
	u64 origin; /* the stream that began it: only its EndCapture ends it */
};

/*
 * The shared maps whose keys a process creates at will (raw stream
 * handles, return codes, communicator, capture, event and graph handles,
 * device pointers, threads): admitted by tenant, work-conserving
 * (take_shared: node_room, tenant_guarantee). The first six are counters, whose keys stay until the
 * process exits (malloc_sizes: until the free); the others hold state,
 * and a deleted key gives its unit back (store_admitted, delete_admitted).
 */
enum quota_map {
	QUOTA_AGGREGATED = 0,
	QUOTA_LAUNCH_AGG = 1,
	QUOTA_NCCL_AGG = 2,
	QUOTA_MALLOC_SIZES = 3,
	QUOTA_GRAPH_NODES = 4,
	QUOTA_GRAPH_REPLAYS = 5,
	QUOTA_CAPTURE_STREAMS = 6,
	QUOTA_CAPTURES = 7,
	QUOTA_CAPTURE_EVENTS = 8,
	QUOTA_GRAPH_IDS = 9,
	QUOTA_NCCL_INFLIGHT = 10,
	QUOTA_NCCL_COMMS = 11,
	QUOTA_GRAPH_EXECS = 12,
	QUOTA_NVTX_STACK = 13,
	QUOTA_PID_QUOTAS = 14, /* the tenant's processes (pid_quotas entries) */
	QUOTA_MAPS = 15,
};

/*
 * The stream of a key whose stream handle is beyond the process's
 * --max-streams-per-pid admitted streams: labelled "other".
 */
#define STREAM_OTHER 0xffffffffffffffffULL

/*
 * What a process holds of the shared maps (pid_quotas, keyed by pid),
 * against its caps: graph ids and executable graphs (issue 16), admitted
 * streams, and its keys in each quota_map, which count against its
 * tenant's share. The tenant is fixed at the process's first key.
 */
struct pid_quota {
	u32 graphs;
	u32 execs;
	u32 streams;
	u32 pad;
	u64 tenant; /* tenant_of: its cgroup v2 id, or TENANT_PID | pid */
	u32 keys[QUOTA_MAPS];
};

/*
 * A tenant (issue 30 item 3): the processes of one cgroup v2 (a container
 * or pod), sharing one share of each quota map. A process in the root
 * cgroup (a node with no cgroup v2 hierarchy mounted puts every process
 * there) is a tenant of its own: TENANT_PID | pid.
 */
#define TENANT_PID (1ULL << 63)

/*
 * Keys of a tenant's processes in each quota map: taken and given back in
 * BPF (tenant_quotas), and given back by userspace when it deletes an
 * exited process's keys (tenant_returned, written only by userspace, so
 * that it never overwrites BPF's atomic counts). What the tenant holds is
 * the difference.
 */
struct tenant_quota {
	u32 keys[QUOTA_MAPS];
	u32 refused[QUOTA_MAPS]; /* new keys refused (take_shared); tenant_quotas only */
};
