/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Load-time settings: read-only globals internal/bpfobj sets from the
 * flags before loading. A setting that is off lets the verifier drop the
 * code it guards.
 */
#pragma once

/* Per-process caps (issue 16): graph ids ever assigned, executable graphs alive. */
const volatile u32 max_graphs_per_pid = 8192;
const volatile u32 max_execs_per_pid = 8192;

/* --max-streams-per-pid: streams each process may name in keys (pid_streams). */
const volatile u32 max_streams_per_pid = 32;

/*
 * The shares of the shared maps (enum quota_map, take_shared; issue 47
 * item 1): while the node holds fewer than node_room[m] keys of map m any
 * tenant takes one; past it, only a tenant holding fewer than
 * tenant_guarantee[m]. Set by internal/bpfobj from the map sizes
 * (NodeRoom, TenantGuarantee: the reserve is an eighth of the map, at
 * least 64, a guarantee half the reserve; 0, no quota, for a map whose reserve would be all of it).
 * The defaults here are those of the default sizes.
 */
const volatile u32 node_room[QUOTA_MAPS] = {1792,  7168,  896,	114688, 114688, 14336, 14336, 3584,
					    14336, 57344, 8960, 3584,	57344,	896,   14336};
const volatile u32 tenant_guarantee[QUOTA_MAPS] = {128,	 512,  64,  8192, 8192, 1024, 1024, 256,
						   1024, 4096, 640, 256,  4096, 64,   1024};

/* --kernel-mode: 0 off, 1 anonymous, 2 full. Graph kernel nodes follow it. */
const volatile u32 kernel_mode = 1;

/* --overhead-budget: count every trap per process (pid_hits). */
volatile const bool count_hits = false;

/* --enable-nvtx-tracing: launches look up their thread's phase. Off, the code is not loaded. */
volatile const bool nvtx_enabled = false;

/*
 * --sample-rate: 1 in sample_rate timed calls has its latency measured,
 * chosen at random (unbiased across processes and threads), and counts
 * sample_rate times, so histograms need no rescaling. Counts and bytes
 * are always exact. Sampling saves BPF work, never a trap.
 */
const volatile u32 sample_rate = 1;

/* --detailed-launches. */
const volatile bool detailed_launches = false;

/* The crash circuit breaker (pid_last_hit, crash_events). */
volatile const bool crash_breaker = false;

/* The page size (the uprobe execute-out-of-line area is one page): set at load. */
volatile const u64 page_size = 4096;

/*
 * bpf_find_vma (5.17): unseen processes' runtime ranges (unseen_text).
 * Without it (5.15, 5.16) the code is not loaded and those processes'
 * launches are told apart by markers only until a pass registers them.
 */
volatile const bool find_vma = false;
