// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//go:build ignore

/*
 * profi's uprobe programs: count and time CUDA Runtime, Driver, NCCL and
 * NVTX calls and aggregate them in per-CPU maps. Nothing leaves the kernel
 * per call: Go reads the cumulative map values. Ring buffers carry kernel
 * names (full mode), library loads, and per-launch events only with
 * --detailed-launches.
 *
 * One program per role, each built as uprobe.multi; Go loads them as
 * classic uprobe programs on kernels without uprobe_multi
 * (internal/bpfobj). The BPF cookie carries the operation (enum op,
 * generated from internal/ops into ops.h) and the attached file id; what a
 * program decodes follows the operation's argument layout (op_args[]).
 * ARCHITECTURE.md lists the programs and maps and who reads them.
 *
 * Per-CPU counters (PCPU_ADD) are plain adds; shared values (graph_nodes,
 * pid_quotas, graph_seq, live_captures) are atomic. See PCPU_ADD for why
 * that is safe where preemption is off and what it risks where it is on.
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
 * The value (enum pid_file_flag) also says whether full-mode upgrade probes
 * serve the process (PF_FULL) and whether rt_text knows its runtime
 * (PF_RT_TEXT): one lookup per hit answers all three.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct pid_file);
	__type(value, u8); /* enum pid_file_flag */
} pid_files SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct claim_key);
	__type(value, u32); /* file id */
} pid_claim SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, DROP_MAX);
	__type(key, u32);
	__type(value, u64);
} drops SEC(".maps");

/* Runtime launch entered on a thread (anonymous mode), for the runtime->driver guard. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, u64); /* pid_tgid */
	__type(value, struct rt_launch);
} rt_launches SEC(".maps");

/*
 * libcudart's code in each process, written by userspace from each scan:
 * a driver launch whose return address lies there was made by the runtime.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, u32); /* pid */
	__type(value, struct text_range);
} rt_text SEC(".maps");

/*
 * One trap per runtime launch (ARCHITECTURE.md, "One trap per
 * launch"). While a runtime file learns (PF_RT_MARK), each driver launch
 * its launches make records which runtime op entered the driver at that
 * site (rt_sites), and each op whether all its launches got there
 * (rt_ops). Userspace reads both; for an op that always reaches the driver
 * at sites no other op uses, it writes those sites into rt_counted and
 * detaches the op's runtime probes: from then on the driver entry counts
 * the launch, labelled with the runtime op.
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
 * Current device of each thread, from successful cudaSetDevice calls: every
 * call's key carries it (thread_dev). Deleted when the thread exits
 * (thread_exit); LRU in case that hook is missing.
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, u64); /* pid_tgid */
	__type(value, u32);
} thread_device SEC(".maps");

/*
 * (pid, cudaKernel_t) handles whose call site was sent (NAME_LAUNCH_SITE):
 * a handle obtained before the agent attached has no __cudaGetKernel event,
 * and its call site (the nvcc-generated __device_stub_ function) names it.
 * LRU: a forgotten handle is only sent again.
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

/* Events recorded on a capturing stream: waiting on one joins its capture. LRU: events are not
 * tracked to their destruction. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
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
 * their caps, admitted streams, and the keys the process holds in each
 * shared map (enum quota_map) against its share (pid_share). Written only
 * when a key is new (admit), never on the path of a key that exists.
 * Deleted by userspace when the process exits.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, u32);
	__type(value, struct pid_quota);
} pid_quotas SEC(".maps");

/*
 * The streams each process may name in keys, (pid, stream): the first
 * --max-streams-per-pid non-default streams it used. Keys of any other
 * stream are folded into STREAM_OTHER in BPF (userspace labels it
 * "other"), so fake stream handles cannot multiply a process's keys.
 * A full map folds too. Deleted by userspace when the process exits.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct handle_key); /* pid, stream */
	__type(value, u8);
} pid_streams SEC(".maps");

/* graph_return's "nothing lost". */
#define NO_DROP DROP_MAX

/* Graph ids: unique on the node, never reused (0 is "unknown"). */
u64 graph_seq = 0;
/* Captures in progress on the node: 0 spares every launch the capture lookup. */
u32 live_captures = 0;

/* Per-process caps (issue 16): graph ids ever assigned, executable graphs alive. */
const volatile u32 max_graphs_per_pid = 8192;
const volatile u32 max_execs_per_pid = 8192;

/* --max-streams-per-pid: streams each process may name in keys (pid_streams). */
const volatile u32 max_streams_per_pid = 32;

/*
 * Each process's share of each shared map (enum quota_map): set by
 * internal/bpfobj from the map sizes (max_entries / 4, at least 64; 0, no
 * quota, for a map of 64 entries or fewer, whose share would be all of
 * it). The defaults here are those of the default sizes.
 */
const volatile u32 pid_share[QUOTA_MAPS] = {512, 2048, 256, 32768, 32768, 4096};

/* --kernel-mode: 0 off, 1 anonymous, 2 full. Graph kernel nodes follow it. */
const volatile u32 kernel_mode = 1;

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

/* Communicators seen at init, per process: rank, size, unique id. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
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

volatile const bool count_hits = false;

/*
 * Open NVTX ranges per thread (--enable-nvtx-tracing): the phase rule of
 * each, pushed and popped by nvtx_push/nvtx_pop. LRU: a thread that exits
 * with ranges open is also removed by thread_exit, and cannot leak anyway.
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
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

/* --enable-nvtx-tracing: launches look up their thread's phase. Off, the code is not loaded. */
volatile const bool nvtx_enabled = false;

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
 * --sample-rate: 1 in sample_rate timed calls has its latency measured,
 * chosen at random (unbiased across processes and threads), and counts
 * sample_rate times, so histograms need no rescaling. Counts and bytes
 * are always exact. Sampling saves BPF work, never a trap.
 */
const volatile u32 sample_rate = 1;

/* --detailed-launches. */
const volatile bool detailed_launches = false;

/* Force the generated Go types for the enums and shared structs. */
const enum op unused_op __attribute__((unused));
const enum op_args unused_op_args __attribute__((unused));
const enum drop unused_drop __attribute__((unused));
const enum name_kind unused_name_kind __attribute__((unused));
const enum phase unused_phase __attribute__((unused));
const struct name_event unused_name_event __attribute__((unused));
const struct launch_event unused_launch_event __attribute__((unused));
const enum graph_node_type unused_graph_node_type __attribute__((unused));
const enum pid_file_flag unused_pid_file_flag __attribute__((unused));
const enum quota_map unused_quota_map __attribute__((unused));

/*
 * Zero values inserted by lookup_or_init: read-only globals rather than
 * structs zeroed on the 512-byte stack at every call.
 */
static const struct agg_val zero_agg;
static const struct launch_val zero_launch;
static const struct nccl_val zero_nccl;
static const struct graph_node_val zero_node;
static const struct pid_quota zero_quota;
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
 * bound. Atomic adds (lock add) close it; measured on this CI's VM they
 * cost 5-8 ns each: 22 ns of a counted driver launch's 199 ns launch_entry
 * run, 25-29 ns of a copy's timed_return (docs/BENCHMARK.md, "Atomic adds
 * on per-CPU values"). Build with -DPROFI_PCPU_ATOMIC to get them back on
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

/* The device ordinal the thread last set with cudaSetDevice; DEV_NONE if none. */
static __always_inline u32 thread_dev(u64 id)
{
	u32 *dev = bpf_map_lookup_elem(&thread_device, &id);

	return dev ? *dev : DEV_NONE;
}

/*
 * The crash circuit breaker (ARCHITECTURE.md, "Crash circuit breaker"):
 * each process's latest probe hit, which attached file trapped and when,
 * and the processes that then died of a fault signal. One value per
 * process, shared by its threads: written at most once a millisecond
 * unless another file traps, so threads on other CPUs rarely write the
 * same line. Off (crash_breaker false), the verifier drops the code.
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

volatile const bool crash_breaker = false;
/* Forces the generated Go type of the crash_events records. */
const struct crash_event unused_crash_event __attribute__((unused));

/* Records that the probe of ctx's attached file trapped in process pid now. */
static __always_inline void note_hit(struct pt_regs *ctx, u32 pid)
{
	u32 file = COOKIE_FILE(bpf_get_attach_cookie(ctx));
	u64 now = bpf_ktime_get_ns();
	struct last_hit *h, v = {.ns = now, .file = file};

	h = bpf_map_lookup_elem(&pid_last_hit, &pid);
	if (!h) {
		bpf_map_update_elem(&pid_last_hit, &pid, &v, BPF_ANY);
		return;
	}
	if (h->file != file || now - h->ns > 1000000) {
		h->ns = now;
		h->file = file;
	}
}

/*
 * Counts a probe hit (a trap) of process pid. Every probe program calls it
 * once per run, with its context named ctx: the crash breaker needs the
 * attached file from the cookie.
 */
#define count_hit(pid) count_hit_at(ctx, (pid))

static __always_inline void count_hit_at(struct pt_regs *ctx, u32 pid)
{
	u64 one = 1;
	u64 *n;

	if (crash_breaker)
		note_hit(ctx, pid);
	if (!count_hits)
		return;
	n = bpf_map_lookup_elem(&pid_hits, &pid);
	if (n)
		PCPU_ADD(*n, 1);
	else
		bpf_map_update_elem(&pid_hits, &pid, &one, BPF_NOEXIST);
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

/*
 * Whether this attachment (file) counts the current hit of process pid: 0
 * if not, else its pid_file_flag bits (PF_OWN at least). A process
 * userspace has seen costs one lookup when the file is its own (the common
 * case), two when it is an alias's.
 */
static __always_inline u32 hit_flags(struct pt_regs *ctx, u32 pid, u32 file)
{
	struct pid_file k = {.pid = pid, .file = file};
	struct claim_key ck = {.pid = pid, .ip = probe_ip(ctx)};
	u32 *owner;
	u8 *f;

	f = bpf_map_lookup_elem(&pid_files, &k);
	if (f)
		return *f | PF_OWN;
	k.file = 0;
	if (bpf_map_lookup_elem(&pid_files, &k))
		return 0; /* known to userspace, and this file is not its own */
	owner = bpf_map_lookup_elem(&pid_claim, &ck);
	if (!owner) {
		bpf_map_update_elem(&pid_claim, &ck, &file, BPF_NOEXIST);
		owner = bpf_map_lookup_elem(&pid_claim, &ck);
		if (!owner) {
			count_drop(DROP_PID_CLAIM);
			return PF_OWN;
		}
	}
	return *owner == file ? PF_OWN : 0;
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
 * Runtime launches are implemented by a driver launch on the same thread,
 * which must not be counted again. Timed calls see it through the
 * in-flight depth. In anonymous mode (no return probe) the driver entry
 * checks its return address: inside libcudart's code means the runtime
 * made the call. Until userspace has written the process's libcudart range
 * (its first scan), a marker left by the runtime entry stands in: the
 * driver entry must come deeper on the same stack while the runtime
 * launch still runs (rt_marker_live).
 */
static const struct rt_op_val zero_rt_op;
static const struct rt_site_val zero_rt_site;

/* what: 0 merged, 1 unmerged, 2 a tail jump from 1 + op tail_of. */
static __always_inline void rt_op_add(u32 file, u32 op, u32 what, u32 tail_of)
{
	struct rt_op_key k = {.file = file, .op = op};
	struct rt_op_val *v = lookup_or_init(&rt_ops, &k, &zero_rt_op, DROP_RT_LEARN);

	if (!v)
		return;
	if (what == 0)
		PCPU_ADD(v->merged, 1);
	else if (what == 1)
		PCPU_ADD(v->unmerged, 1);
	else {
		PCPU_ADD(v->tails, 1);
		v->tail_of = tail_of;
	}
}

/*
 * Whether the runtime launch that left marker m is still running on this
 * thread, seen from a probe deeper on its stack (call_live in the
 * architecture's header). Identity, not time: a thread stopped for any
 * length between the runtime's probe and the driver's (a pod throttled
 * by its CPU limit) still matches, and a marker whose launch returned
 * without reaching the driver does not (ARCHITECTURE.md, "Counting a
 * call once").
 */
static __always_inline bool rt_marker_live(struct pt_regs *ctx, const struct rt_launch *m)
{
	return call_live(ctx, m->sp, m->ret);
}

/*
 * Leaves the marker of a counted runtime launch; with learn (1 + op, the
 * file has PF_RT_MARK), the launch before it on the thread that never
 * reached the driver is counted against its op.
 */
static __always_inline void mark_runtime_launch(struct pt_regs *ctx, u64 id, struct rt_launch *old,
						u32 file, u32 learn, u64 ret, bool tail)
{
	struct rt_launch m = {.sp = entry_sp(ctx), .ret = ret, .tail = tail, .learn = learn};

	if (learn && old && old->learn && !old->merged)
		rt_op_add(file, old->learn - 1, 1, 0);
	bpf_map_update_elem(&rt_launches, &id, &m, BPF_ANY);
}

/* A driver launch below a learning runtime launch: where it entered the driver. */
static __always_inline void rt_learn(struct text_range *text, u32 drv_op, u64 ret, u32 op)
{
	struct rt_site k = {.file = text->file, .drv_op = drv_op, .off = ret - text->start};
	struct rt_site_val *v = lookup_or_init(&rt_sites, &k, &zero_rt_site, DROP_RT_LEARN);

	rt_op_add(text->file, op, 0, 0);
	if (!v)
		return;
	if (!v->op)
		v->op = op + 1;
	else if (v->op != op + 1)
		v->mixed = 1;
	PCPU_ADD(v->merged, 1);
}

#define RT_NESTED ((u32)~0U)

/*
 * What a driver launch at op is counted as: op (the application called
 * the driver), RT_NESTED (the runtime made it, and the runtime's probe
 * counted it), or the runtime op whose launches the driver counts at that
 * site (rt_counted). ret: the driver launch's return address
 * (decode_launch). Inside the runtime's range the return address proves
 * who made the call; the marker only says which runtime op, so no time
 * window applies there: every marking launch replaces the thread's marker.
 */
static __always_inline u32 driver_launch_op(struct pt_regs *ctx, u64 id, u64 ret, u32 op)
{
	u32 pid = id >> 32;
	struct text_range *text = bpf_map_lookup_elem(&rt_text, &pid);
	struct rt_launch *m;
	bool nested;

	if (text) {
		struct rt_site k = {.file = text->file, .drv_op = op, .off = ret - text->start};
		u32 *as;

		if (ret < text->start || ret >= text->end)
			return op;
		m = bpf_map_lookup_elem(&rt_launches, &id);
		nested = m && !m->merged && entry_sp(ctx) < m->sp;
		as = text->handed ? bpf_map_lookup_elem(&rt_counted, &k) : NULL;
		/* A marker of another op whose launch returned: it never got here. */
		if (as && *as < OP_MAX && nested && m->learn != *as + 1 && !rt_marker_live(ctx, m))
			nested = false;
		if (as && *as < OP_MAX && !nested)
			return *as;
		if (nested) {
			m->merged = 1;
			/*
			 * At a counted site, only another op's fresh launch gets
			 * here with a marker still attached: the site is shared,
			 * and learning it says so (userspace takes the op back).
			 */
			if (m->learn && (!as || m->learn != *as + 1))
				rt_learn(text, op, ret, m->learn - 1);
		}
		count_drop(DROP_RT_TO_DRV);
		return RT_NESTED;
	}
	m = bpf_map_lookup_elem(&rt_launches, &id);
	if (!m)
		return op;
	nested = entry_sp(ctx) < m->sp && rt_marker_live(ctx, m);
	bpf_map_delete_elem(&rt_launches, &id);
	if (!nested)
		return op;
	count_drop(DROP_RT_TO_DRV);
	return RT_NESTED;
}

/*
 * A runtime launch the runtime makes itself: CUDA 13's __cudaLaunchKernel
 * calls the exported cudaLaunchKernel (seen on an H200 with PyTorch 2.11;
 * test/stubs/cudart.c models it). Counted once, as the outer call, the one
 * the application made: its return address is in the application, the
 * inner one's in libcudart. Where that range is not known yet, or the
 * runtime is linked into the executable (the application's code and the
 * runtime's share a range), the outer call's marker stands in (left in
 * place for the driver launch below both), and every counted runtime
 * launch leaves one.
 */
static __always_inline bool runtime_nested(struct pt_regs *ctx, u64 id, u64 ret, u32 flags, u32 op,
					   u32 file)
{
	u32 pid = id >> 32;
	u32 learn = flags & PF_RT_MARK ? op + 1 : 0;
	struct text_range *text;
	struct rt_launch *m = bpf_map_lookup_elem(&rt_launches, &id);

	/*
	 * NVIDIA's CUDA 13 __cudaLaunchKernel reaches cudaLaunchKernel by a
	 * tail jump (seen on an H200: one frame, both probes fire with the
	 * application's return address): the next runtime launch entry on the
	 * thread into a launch that takes no kernel handle, on the same stack
	 * pointer and return address, is that jump, however long the thread
	 * was off the CPU in between. A __cudaLaunchKernel that returned
	 * without jumping leaves a marker that only a call from the same
	 * instruction at the same depth could match, and that call would be
	 * __cudaLaunchKernel again, which replaces it.
	 */
	if (m && m->tail && m->ret == ret && m->sp == entry_sp(ctx) &&
	    !(flags_of(op) & OPF_KERNEL_HANDLE)) {
		m->tail = 0;
		if (learn)
			rt_op_add(file, op, 2, m->learn);
		count_drop(DROP_NESTED);
		return true;
	}
	if (flags_of(op) & OPF_KERNEL_HANDLE) {
		mark_runtime_launch(ctx, id, m, file, learn, ret, true);
		return false;
	}
	if (flags & PF_RT_SHARED) {
		text = bpf_map_lookup_elem(&rt_text, &pid);
		if (!text || ret < text->start || ret >= text->end) {
			if (learn)
				mark_runtime_launch(ctx, id, m, file, learn, ret, false);
			return false;
		}
		count_drop(DROP_NESTED);
		return true;
	}
	/* A static runtime shares its text with the application: the marker tells. */
	if (m && entry_sp(ctx) < m->sp && rt_marker_live(ctx, m)) {
		count_drop(DROP_NESTED);
		return true;
	}
	mark_runtime_launch(ctx, id, m, file, learn, ret, false);
	return false;
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

/*
 * CUDA graphs. The id of the graph stream is capturing into in process pid;
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
	bpf_map_delete_elem(&capture_streams, &k);
	return 0;
}

static __always_inline struct pid_quota *quota_of(u32 pid)
{
	return lookup_or_init(&pid_quotas, &pid, &zero_quota, DROP_PID_QUOTA);
}

/*
 * Per-process quotas on the shared maps (issue 17: one process calling
 * with thousands of fake stream handles or return codes must not fill a
 * map every other process needs). Paid only when a key is new: the hot
 * path, a key that exists, is one lookup as before (lookup_or_admit).
 *
 * Units are taken before the insert and given back when it fails, so a
 * process never holds more than its share. Two CPUs that race to insert
 * the same new key (a per-CPU hash's key is shared by all CPUs: one
 * BPF_NOEXIST insert wins, the other gets -EEXIST) both hold a unit for a
 * moment: a third new key of that process at the edge of its share may be
 * refused meanwhile. That over-count is conservative and transient.
 */
#define EEXIST 17

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
	}
	return DROP_GRAPH_MAPS;
}

/*
 * A key that is not in map qm yet. Its stream (NULL: the key has none)
 * beyond the process's admitted streams is folded into STREAM_OTHER, and
 * that key looked up again; a key still new is inserted within the
 * process's share of the map, else dropped and counted (DROP_PID_QUOTA)
 * without touching any other process's keys. Every key begins with its
 * u32 pid. Not inlined: one copy serves every map.
 */
static __noinline void *admit(void *map, void *key, u64 *stream, const void *zero, u32 qm)
{
	u32 pid = *(u32 *)key;
	struct pid_quota *q;
	u32 *used;
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
	used = &q->keys[qm];
	if (!take(used, pid_share[qm])) {
		count_drop(DROP_PID_QUOTA);
		return NULL;
	}
	/* Failed: the map is full, or another CPU inserted the key (and counted it). */
	if (bpf_map_update_elem(map, key, zero, BPF_NOEXIST))
		__sync_fetch_and_add(used, -1);
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
 * Records a live allocation in malloc_sizes within the process's share;
 * false when it is not tracked (counted). An address handed out again
 * while its entry is still there (its free was not seen) replaces the
 * entry and takes no unit.
 */
static __noinline bool track_alloc(struct alloc_key *ak, struct alloc_val *av)
{
	struct pid_quota *q = quota_of(ak->pid);
	u32 *used;
	long err;

	if (!q)
		return false;
	used = &q->keys[QUOTA_MALLOC_SIZES];
	if (!take(used, pid_share[QUOTA_MALLOC_SIZES])) {
		if (!bpf_map_update_elem(&malloc_sizes, ak, av, BPF_EXIST))
			return true;
		count_drop(DROP_PID_QUOTA);
		return false;
	}
	err = bpf_map_update_elem(&malloc_sizes, ak, av, BPF_NOEXIST);
	if (!err)
		return true;
	__sync_fetch_and_add(used, -1);
	if (err == -EEXIST && !bpf_map_update_elem(&malloc_sizes, ak, av, BPF_EXIST))
		return true;
	count_drop(DROP_MALLOC_SIZES);
	return false;
}

/* Gives back the unit of a malloc_sizes entry just deleted. */
static __always_inline void untrack_alloc(u32 pid)
{
	struct pid_quota *q = bpf_map_lookup_elem(&pid_quotas, &pid);

	if (q && q->keys[QUOTA_MALLOC_SIZES])
		__sync_fetch_and_add(&q->keys[QUOTA_MALLOC_SIZES], -1);
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

	if (id)
		return *id;
	if (!assign || !handle)
		return 0;
	nid = new_graph_id(pid);
	if (!nid)
		return 0;
	if (bpf_map_update_elem(&graph_ids, &k, &nid, BPF_NOEXIST)) {
		/* Another thread named it first, or the map is full. */
		id = bpf_map_lookup_elem(&graph_ids, &k);
		if (id)
			return *id;
		count_drop(DROP_GRAPH_MAPS);
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

static __always_inline void add_launch(u64 id, u32 op, u64 func, struct launch_args *a, u64 dur,
				       u32 weight)
{
	struct launch_key key = {.pid = id >> 32,
				 .op = op,
				 .stream = a->stream,
				 .func = func,
				 .phase = launch_phase(id),
				 .dev = thread_dev(id)};
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
	switch (args_of(in.op)) {
	case ARGS_ALLOC:
	case ARGS_ALLOC_HOST:
		in.arg0 = arg(ctx, 1); /* void **ptr */
		in.arg1 = arg(ctx, 2); /* size */
		break;
	case ARGS_ALLOC_ASYNC:
		in.arg0 = arg(ctx, 1);
		in.arg1 = arg(ctx, 2);
		in.stream = arg(ctx, 3);
		break;
	case ARGS_FREE:
	case ARGS_FREE_ASYNC: {
		/*
		 * Take the size out at entry, while the pointer is still owned by
		 * this call: after the return another thread may already have
		 * been handed the same address. Put back if the free fails.
		 */
		struct alloc_key ak = {.pid = id >> 32, .ptr = arg(ctx, 1)};
		struct alloc_val *av = bpf_map_lookup_elem(&malloc_sizes, &ak);

		in.arg0 = ak.ptr;
		in.dev = DEV_NONE;
		if (av) {
			in.arg1 = av->size;
			in.dev = av->dev;
			if (!bpf_map_delete_elem(&malloc_sizes, &ak))
				untrack_alloc(ak.pid);
		}
		if (args_of(in.op) == ARGS_FREE_ASYNC)
			in.stream = arg(ctx, 2);
		break;
	}
	case ARGS_COPY:
		in.arg1 = arg(ctx, 3);
		in.kind = arg(ctx, 4);
		break;
	case ARGS_COPY_ASYNC:
		in.arg1 = arg(ctx, 3);
		in.kind = arg(ctx, 4);
		in.stream = arg(ctx, 5);
		break;
	case ARGS_COPY_PEER:
		/* (dst, dstDevice, src, srcDevice, count) */
		in.arg1 = arg(ctx, 5);
		in.kind = KIND_P2P;
		break;
	case ARGS_COPY_PEER_ASYNC:
		in.arg1 = arg(ctx, 5);
		in.kind = KIND_P2P;
		in.stream = arg(ctx, 6);
		break;
	case ARGS_COPY_2D:
	case ARGS_COPY_2D_ASYNC:
		/* (dst, dpitch, src, spitch, width, height, kind[, stream]) */
		in.arg1 = arg(ctx, 5) * arg(ctx, 6);
		in.kind = arg(ctx, 7);
		if (args_of(in.op) == ARGS_COPY_2D_ASYNC)
			in.stream = arg(ctx, 8);
		break;
	case ARGS_SET:
		in.arg1 = arg(ctx, 3) * unit_of(in.op);
		break;
	case ARGS_SET_ASYNC:
		in.arg1 = arg(ctx, 3) * unit_of(in.op);
		in.stream = arg(ctx, 4);
		break;
	case ARGS_CU_COPY:
		/* (dst, src, bytes): the direction is the function's */
		in.arg1 = arg(ctx, 3);
		in.kind = copy_kind_of(in.op);
		break;
	case ARGS_CU_COPY_ASYNC:
		in.arg1 = arg(ctx, 3);
		in.kind = copy_kind_of(in.op);
		in.stream = arg(ctx, 4);
		break;
	case ARGS_STREAM:
		in.stream = arg(ctx, 1);
		break;
	case ARGS_SET_DEVICE:
		in.arg0 = arg(ctx, 1);
		break;
	case ARGS_GRAPH_LAUNCH:
		in.arg0 = arg(ctx, 1); /* exec */
		in.stream = arg(ctx, 2);
		break;
	case ARGS_CAPTURE_BEGIN:
		in.stream = arg(ctx, 1);
		break;
	case ARGS_CAPTURE_TO_GRAPH:
	case ARGS_CAPTURE_END:
		/* (stream, graph) and (stream, graph *out) */
		in.stream = arg(ctx, 1);
		in.arg0 = arg(ctx, 2);
		break;
	case ARGS_EVENT_RECORD:
		in.arg0 = arg(ctx, 1); /* event */
		in.stream = arg(ctx, 2);
		break;
	case ARGS_STREAM_WAIT_EVENT:
		in.stream = arg(ctx, 1);
		in.arg0 = arg(ctx, 2); /* event */
		break;
	case ARGS_GRAPH_INSTANTIATE:
	case ARGS_GRAPH_EXEC_UPDATE:
		/* (exec *out, graph) and (exec, graph) */
		in.arg0 = arg(ctx, 1);
		in.arg1 = arg(ctx, 2);
		break;
	case ARGS_GRAPH_EXEC_DESTROY:
	case ARGS_GRAPH_DESTROY:
		in.arg0 = arg(ctx, 1);
		break;
	case ARGS_GRAPH_KERNEL_NODE: {
		/*
		 * cudaKernelNodeParams and CUDA_KERNEL_NODE_PARAMS alike: the
		 * function, six unsigned dims from offset 8, shared memory at 32.
		 */
		struct {
			u64 func;
			u32 grid[3];
			u32 block[3];
			u32 shmem;
		} p = {};

		bpf_probe_read_user(&p, sizeof(p), (void *)arg(ctx, 5));
		in.arg1 = arg(ctx, 2);
		in.launch.func = p.func;
		in.launch.grid_blocks = vol3(p.grid[0], p.grid[1], p.grid[2]);
		in.launch.block_threads = vol3(p.block[0], p.block[1], p.block[2]);
		in.launch.shared_bytes = p.shmem;
		break;
	}
	case ARGS_GRAPH_MEMCPY_NODE: {
		/* cudaMemcpy3DParms: extent (width, height, depth) at 128, kind at 152. */
		struct {
			u64 extent[3];
			u32 kind;
		} p = {};

		bpf_probe_read_user(&p, sizeof(p), (void *)(arg(ctx, 5) + 128));
		in.arg1 = arg(ctx, 2);
		in.arg0 = p.extent[0] * p.extent[1] * p.extent[2];
		in.kind = p.kind;
		break;
	}
	case ARGS_GRAPH_MEMCPY_NODE_1D:
		/* (node *out, graph, deps, n, dst, src, count, kind) */
		in.arg1 = arg(ctx, 2);
		in.arg0 = arg(ctx, 7);
		in.kind = arg(ctx, 8);
		break;
	case ARGS_GRAPH_MEMSET_NODE: {
		/*
		 * cudaMemsetParams, CUDA_MEMSET_NODE_PARAMS: dst, pitch, then
		 * value and elementSize (u32) at 16, width and height at 24.
		 */
		struct {
			u32 value;
			u32 element;
			u64 width;
			u64 height;
		} p = {};

		bpf_probe_read_user(&p, sizeof(p), (void *)(arg(ctx, 5) + 16));
		in.arg1 = arg(ctx, 2);
		in.arg0 = p.element * p.width * p.height;
		break;
	}
	case ARGS_GRAPH_CHILD_NODE:
		in.arg1 = arg(ctx, 2);
		in.arg0 = arg(ctx, 5); /* the child graph */
		break;
	case ARGS_GET_FUNCTION:
	case ARGS_GET_KERNEL:
		/* (out handle, module or library, const char *name) */
		in.arg0 = arg(ctx, 1);
		in.arg1 = arg(ctx, 3);
		break;
	case ARGS_GET_KERNEL_HANDLE:
		/* (cudaKernel_t *out, const void *hostFun) */
	case ARGS_KERNEL_FUNCTION:
		/* (CUfunction *out, CUkernel kernel) */
		in.arg0 = arg(ctx, 1);
		in.arg1 = arg(ctx, 2);
		break;
	case ARGS_LAUNCH:
	case ARGS_LAUNCH_EXC:
	case ARGS_CU_LAUNCH:
	case ARGS_CU_LAUNCH_EX: {
		u64 ret;

		decode_launch(ctx, in.op, &in.launch, &ret);
		in.stream = in.launch.stream;
		if (flags_of(in.op) & OPF_KERNEL_HANDLE)
			send_launch_site(ctx, id >> 32, in.launch.func);
		break;
	}
	}

	in.sampled = sample_rate <= 1 || bpf_get_prandom_u32() % sample_rate == 0;
	in.start_ns = in.sampled ? bpf_ktime_get_ns() : 0;
	if (bpf_map_update_elem(&inflight, &id, &in, BPF_ANY))
		count_drop(DROP_INFLIGHT);
	return 0;
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
		if (bpf_map_update_elem(&captures, &ck, &c, BPF_NOEXIST))
			return DROP_CAPTURE;
		if (bpf_map_update_elem(&capture_streams, &sk, &gid, BPF_ANY)) {
			bpf_map_delete_elem(&captures, &ck);
			return DROP_CAPTURE;
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
		if (cur && !bpf_map_delete_elem(&captures, &ck))
			__sync_fetch_and_add(&live_captures, -1);
		bpf_map_delete_elem(&capture_streams, &sk);
		if (ret || !cur || bpf_probe_read_user(&out, sizeof(out), (void *)in->arg0) || !out)
			return NO_DROP;
		k.handle = out;
		return bpf_map_update_elem(&graph_ids, &k, &ck.handle, BPF_ANY) ? DROP_GRAPH_MAPS
										: NO_DROP;
	}
	case ARGS_EVENT_RECORD:
		if (ret || !live_captures)
			return NO_DROP;
		gid = capture_of(pid, in->stream);
		if (!gid)
			bpf_map_delete_elem(&capture_events, &k);
		else if (bpf_map_update_elem(&capture_events, &k, &gid, BPF_ANY))
			return DROP_CAPTURE;
		return NO_DROP;
	case ARGS_STREAM_WAIT_EVENT:
		if (ret || !live_captures)
			return NO_DROP;
		p = bpf_map_lookup_elem(&capture_events, &k);
		if (!p)
			return NO_DROP;
		ck.handle = *p;
		if (bpf_map_lookup_elem(&captures, &ck) &&
		    bpf_map_update_elem(&capture_streams, &sk, &ck.handle, BPF_ANY))
			return DROP_CAPTURE;
		return NO_DROP;
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
			if (!bpf_map_delete_elem(&graph_execs, &k)) {
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
		if (bpf_map_update_elem(&graph_execs, &k, &gid, BPF_NOEXIST))
			return DROP_GRAPH_MAPS;
		__sync_fetch_and_add(&q->execs, 1);
		return NO_DROP;
	case ARGS_GRAPH_EXEC_DESTROY:
		if (ret || bpf_map_delete_elem(&graph_execs, &k))
			return NO_DROP;
		q = bpf_map_lookup_elem(&pid_quotas, &pid);
		if (q && q->execs)
			__sync_fetch_and_add(&q->execs, -1);
		return NO_DROP;
	case ARGS_GRAPH_DESTROY:
		/* Its id and nodes stay: executable graphs made from it still replay them. */
		if (!ret)
			bpf_map_delete_elem(&graph_ids, &k);
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
	key.dev = thread_dev(id);
	/* Weight of this call in the latency data: 0 when not sampled. */
	u32 weight = in.sampled ? (sample_rate > 1 ? sample_rate : 1) : 0;
	u64 dur = in.sampled ? now - in.start_ns : 0;

	switch (args_of(in.op)) {
	case ARGS_ALLOC:
	case ARGS_ALLOC_ASYNC:
		if (ret == 0) {
			struct alloc_key ak = {.pid = key.pid};
			struct alloc_val av = {.size = in.arg1, .dev = key.dev};

			bytes = in.arg1;
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
	case ARGS_SET:
	case ARGS_SET_ASYNC:
	case ARGS_CU_COPY:
	case ARGS_CU_COPY_ASYNC:
		if (ret == 0)
			bytes = in.arg1;
		/* Recorded into a capturing stream's graph: its replays move the bytes. */
		if (bytes && in.stream) {
			u64 graph = capture_of(key.pid, in.stream);
			u32 set = args_of(in.op) == ARGS_SET || args_of(in.op) == ARGS_SET_ASYNC;

			if (graph) {
				add_node(key.pid, in.op, graph, 0, set ? 0 : in.kind,
					 set ? GRAPH_NODE_MEMSET : GRAPH_NODE_MEMCPY, NULL, bytes);
				bytes = 0;
			}
		}
		break;
	case ARGS_SET_DEVICE:
		/* The call itself counts on the device it set (or failed to set: the old one). */
		if (ret == 0) {
			u32 dev = in.arg0;

			bpf_map_update_elem(&thread_device, &id, &dev, BPF_ANY);
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
		/* Timed launches (full mode): per-kernel count, geometry and latency. */
		add_launch(id, in.op, in.launch.func, &in.launch, dur, weight);
		send_launch(id, in.op, in.start_ns, ret, dur, &in.launch);
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
 * Launch APIs in anonymous mode: count, stream and geometry at entry. One
 * pid_files lookup (ownership, upgrade, whether rt_text is there), the
 * launch's stack in one read, rt_text only for driver launches, then
 * thread_device and launch_agg.
 */
static __always_inline int launch_entry_impl(struct pt_regs *ctx)
{
	u64 cookie = bpf_get_attach_cookie(ctx);
	u64 id = bpf_get_current_pid_tgid();
	u32 op = COOKIE_OP(cookie);
	struct launch_args a = {};
	u64 ret = 0;
	u32 flags;

	count_hit(id >> 32);
	flags = hit_flags(ctx, id >> 32, COOKIE_FILE(cookie));
	/* PF_FULL: the upgrade's timed probes count this process's launches. */
	if (!flags || (flags & PF_FULL))
		return 0;
	decode_launch(ctx, op, &a, &ret);
	if (flags_of(op) & OPF_DRIVER_LAUNCH) {
		op = driver_launch_op(ctx, id, ret, op);
		if (op == RT_NESTED)
			return 0;
	} else if (runtime_nested(ctx, id, ret, flags, op, COOKIE_FILE(cookie))) {
		return 0;
	}
	add_launch(id, op, 0, &a, 0, 0);
	send_launch(id, op, detailed_launches ? bpf_ktime_get_ns() : 0, 0, 0, &a);
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

/*
 * _dl_debug_state in ld.so: the loader calls it whenever a process's list
 * of loaded libraries changes (start-up, dlopen, dlclose), for debuggers.
 * Userspace checks that process at once, so a new CUDA library is attached
 * without waiting for the periodic rescan. Rare: a few calls per process.
 */
SEC("uprobe.multi")
int dl_event(struct pt_regs *ctx)
{
	u32 pid = bpf_get_current_pid_tgid() >> 32;

	count_hit(pid);
	if (bpf_ringbuf_output(&lib_loads, &pid, sizeof(pid), 0))
		count_drop(DROP_LIB_LOADS);
	return 0;
}

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
	    .pid = id >> 32, .op = op, .comm = comm, .err = err, .dev = thread_dev(id)};
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
	u32 zero = 0;
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
		bpf_probe_read_user(c->info.id, sizeof(c->info.id), (void *)big_arg(ctx, 3));
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
	if (bpf_map_update_elem(&nccl_inflight, &id, c, BPF_ANY))
		count_drop(DROP_NCCL_INFLIGHT);
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
		bpf_map_update_elem(&nccl_comms, &ck, &c->info, BPF_ANY);
		comm = ck.comm;
	}
	add_nccl(id, c->op, comm, ret, c->bytes, true, now - c->start_ns);
	/* The thread's NVTX ranges stay open: they end at their own pops. */
	bpf_map_delete_elem(&nccl_inflight, &id);
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

/*
 * The one field of the kernel's task_struct the crash breaker reads, at
 * its offset in the running kernel (a CO-RE relocation against its BTF):
 * do_exit sets it before the sched_process_exit tracepoint, the signal
 * that killed the process in its low 7 bits (exit(n) leaves them 0).
 */
struct task_struct___profi {
	int exit_code;
} __attribute__((preserve_access_index));

/* SIGILL, SIGTRAP, SIGBUS, SIGFPE, SIGSEGV: the same numbers on x86-64 and arm64. */
static __always_inline bool fault_signal(u32 sig)
{
	return sig == 4 || sig == 5 || sig == 7 || sig == 8 || sig == 11;
}

/*
 * A thread of a process with a probe hit on record exits. If a fault
 * signal killed it, the first such thread sends one crash_events record
 * (deleting the entry decides which: the others find it gone); the
 * breaker in userspace decides whether the hit was recent enough. A group
 * leader that exits otherwise (exit, SIGKILL, SIGTERM) drops the entry:
 * a later hit of a thread still running writes it again.
 */
static __always_inline void note_exit(u64 id)
{
	struct task_struct___profi *task = (void *)bpf_get_current_task();
	u32 pid = id >> 32, key = 0;
	struct crash_event *e;
	struct last_hit *h;
	u64 hit_ns, *lost;
	u32 file, sig;
	int code;

	h = bpf_map_lookup_elem(&pid_last_hit, &pid);
	if (!h)
		return;
	code = BPF_CORE_READ(task, exit_code);
	sig = code & 0x7f;
	if (!fault_signal(sig)) {
		if ((u32)id == pid)
			bpf_map_delete_elem(&pid_last_hit, &pid);
		return;
	}
	hit_ns = h->ns;
	file = h->file;
	if (bpf_map_delete_elem(&pid_last_hit, &pid))
		return; /* another thread of the process reported it */
	e = bpf_ringbuf_reserve(&crash_events, sizeof(*e), 0);
	if (!e) {
		lost = bpf_map_lookup_elem(&crash_lost, &key);
		if (lost)
			PCPU_ADD(*lost, 1);
		return;
	}
	e->pid = pid;
	e->tid = (u32)id;
	e->file = file;
	e->exit_code = code;
	e->exit_ns = bpf_ktime_get_ns();
	e->hit_ns = hit_ns;
	bpf_get_current_comm(e->comm, sizeof(e->comm));
	bpf_ringbuf_submit(e, 0);
}

/*
 * Every thread exit. A thread that exits inside an NCCL call (a rank
 * killed mid-collective) never returns from it: its in-flight entry goes
 * with it, so no hang is reported for a process that is gone. Its current
 * device goes too: a new thread that reuses the id starts on no device
 * set. And the crash breaker learns of probed processes killed by a fault.
 */
SEC("raw_tracepoint/sched_process_exit")
int thread_exit(void *ctx)
{
	u64 id = bpf_get_current_pid_tgid();

	bpf_map_delete_elem(&nccl_inflight, &id);
	bpf_map_delete_elem(&thread_device, &id);
	if (nvtx_enabled)
		bpf_map_delete_elem(&nvtx_stack, &id);
	if (crash_breaker)
		note_exit(id);
	return 0;
}

/*
 * NVTX (--enable-nvtx-tracing). Entry-only probes keep each thread's open
 * ranges as a stack of phase rules; launches read it (launch_phase). One
 * stack per thread across domains: ranges nest LIFO across domains.
 */

/* Whether the name at b (lowercased, zero padded) starts with the n-byte pattern s. */
static __always_inline bool at(const u8 *b, const char *s, u32 n)
{
	u32 k;

#pragma unroll
	for (k = 0; k < 9; k++) {
		if (k >= n)
			break;
		if (b[k] != (u8)s[k])
			return false;
	}
	return true;
}

/* Whether the name contains the n-byte pattern s (n <= 9). */
static __always_inline bool contains(const u8 *buf, const char *s, u32 n)
{
	u32 i;

#pragma clang loop unroll(disable)
	for (i = 0; i < NVTX_NAME_LEN; i++) {
		if (!buf[i])
			return false;
		if (at(&buf[i], s, n))
			return true;
	}
	return false;
}

#define HAS(lit) contains(buf, lit, sizeof(lit) - 1)

/* The phase rule of a lowercased name (docs/INTERFACE.md `phase`, in order). */
static __always_inline u32 name_phase(const u8 *buf)
{
	if (HAS("prefill") || HAS("prompt") || HAS("encode"))
		return PHASE_PREFILL;
	if (HAS("decode") || HAS("generate"))
		return PHASE_DECODE;
	if (HAS("attention") || HAS("attn"))
		return PHASE_ATTENTION;
	if (HAS("mlp") || HAS("ffn") || HAS("expert"))
		return PHASE_MLP;
	if (HAS("norm") || HAS("embed"))
		return PHASE_NORM;
	return PHASE_OTHER;
}

/* Reads a range name into n->buf, lowercased; false if it could not be read. */
static __always_inline bool read_name(struct nvtx_name *n, u64 ptr, bool wide)
{
	u32 i;

	__builtin_memset(n->buf, 0, sizeof(n->buf));
	if (!ptr)
		return false;
	if (!wide) {
		if (bpf_probe_read_user_str(n->buf, NVTX_NAME_LEN, (void *)ptr) <= 0)
			return false;
	} else {
		/*
		 * UTF-32 (wchar_t), read 4 characters at a time so that a name
		 * near the end of a mapping still reads; non-ASCII characters
		 * match no rule.
		 */
		__builtin_memset(n->wide, 0, sizeof(n->wide));
		for (i = 0; i < NVTX_NAME_LEN / 4; i++) {
			if (bpf_probe_read_user(&n->wide[i * 4], 16, (void *)(ptr + i * 16))) {
				if (!i)
					return false;
				break;
			}
			if (!n->wide[i * 4] || !n->wide[i * 4 + 1] || !n->wide[i * 4 + 2] ||
			    !n->wide[i * 4 + 3])
				break;
		}
		for (i = 0; i < NVTX_NAME_LEN - 1; i++) {
			u32 c = n->wide[i];

			if (!c)
				break;
			n->buf[i] = c < 0x80 ? c : 0x7f;
		}
	}
	for (i = 0; i < NVTX_NAME_LEN; i++) {
		u8 c = n->buf[i];

		if (c >= 'A' && c <= 'Z')
			n->buf[i] = c + ('a' - 'A');
	}
	return true;
}

/* nvtxEventAttributes_v2: messageType (int32) at 32, message at 40. */
#define NVTX_ATTR_MESSAGE_TYPE 32
#define NVTX_ATTR_MESSAGE      40
#define NVTX_MESSAGE_ASCII     1
#define NVTX_MESSAGE_UNICODE   2

SEC("uprobe.multi")
int nvtx_push(struct pt_regs *ctx)
{
	u64 cookie = bpf_get_attach_cookie(ctx);
	u64 id = bpf_get_current_pid_tgid();
	struct nvtx_ranges zero = {};
	struct nvtx_ranges *s;
	struct nvtx_name *n;
	u32 key = 0, phase = PHASE_OTHER, d;
	u64 ptr = 0, attr = 0, a1, a2;
	s32 type = 0;
	bool wide = false;

	count_hit(id >> 32);
	if (!hit_flags(ctx, id >> 32, COOKIE_FILE(cookie)))
		return 0;
	/* Both arguments read up front: the verifier refuses a computed ctx offset. */
	a1 = arg(ctx, 1);
	a2 = arg(ctx, 2);
	switch (args_of(COOKIE_OP(cookie))) {
	case ARGS_NVTX_A:
		ptr = a1;
		break;
	case ARGS_NVTX_W:
		ptr = a1;
		wide = true;
		break;
	case ARGS_NVTX_EX:
		attr = a1;
		break;
	case ARGS_NVTX_DOMAIN_EX:
		attr = a2;
		break;
	}
	if (attr &&
	    !bpf_probe_read_user(&type, sizeof(type), (void *)(attr + NVTX_ATTR_MESSAGE_TYPE)) &&
	    (type == NVTX_MESSAGE_ASCII || type == NVTX_MESSAGE_UNICODE) &&
	    !bpf_probe_read_user(&ptr, sizeof(ptr), (void *)(attr + NVTX_ATTR_MESSAGE)))
		wide = type == NVTX_MESSAGE_UNICODE;
	/* A registered string or an unreadable name opens a range of no rule. */
	n = bpf_map_lookup_elem(&nvtx_scratch, &key);
	if (n && ptr && read_name(n, ptr, wide))
		phase = name_phase(n->buf);

	s = lookup_or_init(&nvtx_stack, &id, &zero, DROP_NVTX_STACK);
	if (!s)
		return 0;
	d = s->depth;
	if (d < NVTX_DEPTH)
		s->phases[d & (NVTX_DEPTH - 1)] = phase;
	s->depth = d + 1;
	return 0;
}

/* nvtxRangePop, nvtxDomainRangePop: a pop with no range open changes nothing. */
SEC("uprobe.multi")
int nvtx_pop(struct pt_regs *ctx)
{
	u64 id = bpf_get_current_pid_tgid();
	struct nvtx_ranges *s;

	count_hit(id >> 32);
	if (!hit_flags(ctx, id >> 32, COOKIE_FILE(bpf_get_attach_cookie(ctx))))
		return 0;
	s = bpf_map_lookup_elem(&nvtx_stack, &id);
	if (!s || !s->depth)
		return 0;
	if (s->depth == 1)
		bpf_map_delete_elem(&nvtx_stack, &id);
	else
		s->depth--;
	return 0;
}
