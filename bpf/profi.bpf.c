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

/*
 * One object, read in parts (ARCHITECTURE.md, "The BPF source"): shared
 * definitions in headers, the programs in .c files by concern. Included in
 * dependency order; no part is compiled on its own.
 */
#include "common.h"
#include "types.h"

char __license[] SEC("license") = "Dual BSD/GPL";

#include "maps.h"
#include "config.h"

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
const enum rt_handover unused_rt_handover __attribute__((unused));
const struct rt_learned_event unused_rt_learned_event __attribute__((unused));

/* Forces the generated Go type of the crash_events records. */
const struct crash_event unused_crash_event __attribute__((unused));
const struct proc_identity unused_proc_identity __attribute__((unused));

#include "core.h"
#include "hits.h"
#include "quota.h"
#include "graphs.h"
#include "handover.h"
#include "launch.h"
#include "args.h"

#include "cuda.c"
#include "nccl.c"
#include "nvtx.c"
#include "exit.c"
#include "loader.c"
