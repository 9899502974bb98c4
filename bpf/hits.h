/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Every probe run: the trap it cost (count_hit: the overhead estimate and
 * the crash breaker's last hit) and whether this attachment counts it
 * (hit_flags: pid_files, pid_claim).
 */
#pragma once

/*
 * Records that the probe of ctx's attached file trapped in process pid now.
 * The clock is read at most once a tick per process: the tick count
 * (bpf_jiffies64) is a load, while bpf_ktime_get_ns reads the clock source,
 * 120-170 ns a call on the benchmark's kvm-clock VM (docs/BENCHMARK.md,
 * "Crash circuit breaker"). The breaker's window is seconds, so a hit time
 * up to a tick early changes nothing it decides.
 */
static __always_inline void note_hit(struct pt_regs *ctx, u32 pid)
{
	u32 file = COOKIE_FILE(bpf_get_attach_cookie(ctx));
	u32 tick = (u32)bpf_jiffies64();
	struct last_hit *h, v = {.file = file, .tick = tick};

	h = bpf_map_lookup_elem(&pid_last_hit, &pid);
	if (!h) {
		v.ns = bpf_ktime_get_ns();
		bpf_map_update_elem(&pid_last_hit, &pid, &v, BPF_ANY);
		return;
	}
	/* Only on a change: threads on other CPUs rarely write the same line. */
	if (h->tick != tick) {
		h->ns = bpf_ktime_get_ns();
		h->tick = tick;
	}
	if (h->file != file)
		h->file = file;
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

struct kernfs_node___profi {
	const char *name;
	struct kernfs_node___profi *parent;
} __attribute__((preserve_access_index));

/* 6.15 renamed kernfs_node's parent (an RCU pointer since). */
struct kernfs_node___rcu {
	struct kernfs_node___profi *__parent;
} __attribute__((preserve_access_index));

struct cgroup___profi {
	struct kernfs_node___profi *kn;
} __attribute__((preserve_access_index));

struct css_set___profi {
	struct cgroup___profi *dfl_cgrp;
} __attribute__((preserve_access_index));

struct task_struct___id {
	struct task_struct___id *group_leader;
	u64 start_boottime;
	char comm[16];
	struct css_set___profi *cgroups;
} __attribute__((preserve_access_index));

static const struct proc_identity zero_identity;

/*
 * Notes who unseen process pid is (unseen_procs), once per process: its
 * first claims call it. A PID reused by another process is noted afresh.
 * A global function: verified once, not in each program that counts hits.
 */
__noinline int note_unseen(u32 pid)
{
	struct task_struct___id *task = (void *)bpf_get_current_task();
	u64 start = BPF_CORE_READ(task, group_leader, start_boottime);
	struct kernfs_node___profi *kn, *up;
	struct proc_identity *id;

	id = bpf_map_lookup_elem(&unseen_procs, &pid);
	if (id && id->start == start)
		return 0;
	bpf_map_update_elem(&unseen_procs, &pid, &zero_identity, BPF_ANY);
	id = bpf_map_lookup_elem(&unseen_procs, &pid);
	if (!id)
		return 0;
	id->start = start;
	BPF_CORE_READ_INTO(&id->comm, task, group_leader, comm);
	kn = BPF_CORE_READ(task, cgroups, dfl_cgrp, kn);
	if (bpf_core_field_exists(kn->parent))
		up = BPF_CORE_READ(kn, parent);
	else
		up = BPF_CORE_READ((struct kernfs_node___rcu *)kn, __parent);
	bpf_probe_read_kernel_str(id->leaf, sizeof(id->leaf), BPF_CORE_READ(kn, name));
	if (up)
		bpf_probe_read_kernel_str(id->parent, sizeof(id->parent), BPF_CORE_READ(up, name));
	return 0;
}

/*
 * Whether this attachment (file) counts the current hit of process pid: 0
 * if not, else its pid_file_flag bits (PF_OWN at least). A process
 * userspace has seen costs one lookup when the file is its own (the common
 * case), two when it is an alias's; an unseen one (PF_UNSEEN) four, until
 * the next pass.
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
		if (!owner)
			count_drop(DROP_PID_CLAIM);
		note_unseen(pid);
	}
	if (owner && *owner != file)
		return 0;
	/* Not registered yet: its runtime facts are the file's. */
	f = bpf_map_lookup_elem(&file_facts, &file);
	return PF_OWN | PF_UNSEEN | (f ? *f & (PF_RT_SHARED | PF_RT_MARK) : 0);
}
