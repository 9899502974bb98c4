/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Types shared between the BPF programs and Go. bpf2go generates the Go
 * side from these definitions (-type ...); never copy them by hand.
 */
#pragma once

#include "common.h"

/* Operation ids: the BPF cookie of each probe and the key of every map. */
enum op {
	OP_UNKNOWN = 0,
	OP_CUDA_MALLOC = 1,
	OP_CUDA_FREE = 2,
	OP_CUDA_MEMCPY = 3,
	OP_CUDA_MEMCPY_ASYNC = 4,
	OP_CUDA_LAUNCH_KERNEL = 5,
	OP_CUDA_MALLOC_ASYNC = 6,
	OP_CUDA_FREE_ASYNC = 7,
	OP_CUDA_GRAPH_LAUNCH = 8,
	OP_CUDA_GRAPH_INSTANTIATE = 9,
	OP_MAX = 10,
};

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
	DROP_MAX = 8,
};

/* Latency buckets: 13 finite inclusive upper bounds + the +Inf bucket. */
#define LAT_BUCKETS 14

/* Key of the aggregated map: one per (process, operation, kind, result, stream). */
struct agg_key {
	u32 pid;    /* host tgid */
	u32 op;	    /* enum op */
	u32 kind;   /* cudaMemcpyKind for memcpy, else 0 */
	s32 err;    /* return value: cudaError_t */
	u64 stream; /* cudaStream_t handle, 0 = default stream */
};

/* Value of the aggregated map, per CPU. Cumulative: never reset or deleted while the process lives.
 */
struct agg_val {
	u64 count;
	u64 duration_ns;	  /* sum of host-side API latency */
	u64 bytes;		  /* memcpy bytes, allocated or freed bytes */
	u64 buckets[LAT_BUCKETS]; /* latency histogram, not cumulative */
};

/* Key of the launch aggregation map. */
struct launch_key {
	u32 pid;
	u32 op;
	u64 stream;
	u64 func; /* kernel host function; 0 in anonymous mode */
};

struct launch_val {
	u64 count;
	u64 grid_blocks;   /* sum of gridDim.x*y*z */
	u64 block_threads; /* sum of blockDim.x*y*z */
	u64 shared_bytes;  /* sum of dynamic shared memory */
};

/* Per-thread state of a timed call between its entry and return probes. */
struct inflight_call {
	u64 start_ns;
	u64 arg0; /* malloc: void **devPtr; free: the pointer */
	u64 arg1; /* malloc: size; memcpy: count; free: size found at entry */
	u64 stream;
	u32 op;
	u32 kind;
	u32 depth; /* nested probed calls on this thread */
	u32 pad;
};

/*
 * The BPF cookie of every probe: the operation in the low 32 bits, the id
 * of the attached library file in the high 32 bits.
 */
#define COOKIE_OP(c)   ((u32)(c))
#define COOKIE_FILE(c) ((u32)((c) >> 32))

/*
 * Key of pid_files: (pid, file) says the process maps that attached file;
 * (pid, 0) says the process is known to userspace at all.
 */
struct pid_file {
	u32 pid;
	u32 file;
};

struct alloc_key {
	u32 pid;
	u32 pad;
	u64 ptr;
};
