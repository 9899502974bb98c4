/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Every probe run: the trap it cost (count_hit: the overhead estimate and
 * the crash breaker's last hit) and whether this attachment counts it
 * (hit_flags: pid_files, pid_claim).
 */
#pragma once

static const struct last_hit zero_last_hit;

/*
 * A thread's first probe hit: creates its state and, if it is its
 * process's first, the process's crash record. Global: verified once, not
 * in every program's paths.
 */
__noinline int note_first_hit(u32 pid)
{
	long err;

	if (!thread_state_new()) {
		count_drop(DROP_BREAKER_HIT);
		return 0;
	}
	err = bpf_map_update_elem(&pid_last_hit, &pid, &zero_last_hit, BPF_NOEXIST);
	if (err && err != -EEXIST)
		count_drop(DROP_BREAKER_HIT);
	return 0;
}

/*
 * Records that the probe of attached file file trapped in the current
 * thread of process pid now, in the thread's state (threads), and returns
 * that state. The breaker ties a fault to the latest hit of the thread
 * that faulted: a probe can only make the thread it trapped fault. The
 * launch path looks the thread's state up anyway, so there the hit costs
 * no lookup of its own (issue 44). A thread's first hit creates its
 * process's crash record (pid_last_hit), which signal delivery and exits
 * look up. The clock is read at most once a tick per thread: the tick
 * count (bpf_jiffies64) is a load, while bpf_ktime_get_ns reads the clock
 * source, 120-170 ns a call on the benchmark's kvm-clock VM
 * (docs/BENCHMARK.md, "Crash circuit breaker"). The breaker's window is
 * seconds, so a hit time up to a tick early changes nothing it decides.
 */
static __always_inline struct thread_state *note_hit(u32 pid, u32 file)
{
	u32 tick = (u32)bpf_jiffies64();
	struct thread_state *t = thread_state();

	if (!t) {
		note_first_hit(pid);
		t = thread_state();
		if (!t)
			return NULL;
	}
	/* The thread's own line: written unconditionally, the clock once a tick. */
	if (t->hit_tick != tick) {
		t->hit_ns = bpf_ktime_get_ns();
		t->hit_tick = tick;
	}
	t->hit_file = file;
	return t;
}

/* note_hit for programs that keep no thread state: verified once, a small frame. */
__noinline int note_hit_call(u32 pid, u32 file)
{
	note_hit(pid, file);
	return 0;
}

/*
 * Counts a probe hit (a trap) of process pid. Every probe program calls it
 * once per run, with its context named ctx: the crash breaker needs the
 * attached file from the cookie. count_hit_thread also returns the
 * thread's state when the breaker looked it up (else NULL: thread_state).
 */
#define count_hit(pid)	      ((void)count_hit_at(ctx, (pid), false))
#define count_hit_thread(pid) count_hit_at(ctx, (pid), true)

static __always_inline struct thread_state *count_hit_at(struct pt_regs *ctx, u32 pid, bool thread)
{
	struct thread_state *t = NULL;
	u64 one = 1;
	u64 *n;

	if (crash_breaker) {
		u32 file = COOKIE_FILE(bpf_get_attach_cookie(ctx));

		if (thread)
			t = note_hit(pid, file);
		else
			note_hit_call(pid, file);
	}
	if (!count_hits)
		return t;
	n = bpf_map_lookup_elem(&pid_hits, &pid);
	if (n)
		PCPU_ADD(*n, 1);
	else
		bpf_map_update_elem(&pid_hits, &pid, &one, BPF_NOEXIST);
	return t;
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
 * if not, else its pid_file_flag bits (PF_OWN at least); with val, *val is
 * then the process's pid_files value for the file (NULL for an unseen
 * process). A
 * process userspace has seen costs one lookup when the file is its own
 * (the common case), two when it is an alias's; an unseen one (PF_UNSEEN)
 * four, until the next pass.
 */
static __always_inline u32 hit_state(struct pt_regs *ctx, u32 pid, u32 file,
				     struct pid_file_val **val)
{
	struct pid_file k = {.pid = pid, .file = file};
	struct claim_key ck = {.pid = pid, .ip = probe_ip(ctx)};
	struct pid_file_val *v;
	u32 *owner;
	u8 *f;

	if (val)
		*val = NULL;
	v = bpf_map_lookup_elem(&pid_files, &k);
	if (v) {
		if (val)
			*val = v;
		return v->flags | PF_OWN;
	}
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

/* hit_state without the value. */
static __always_inline u32 hit_flags(struct pt_regs *ctx, u32 pid, u32 file)
{
	return hit_state(ctx, pid, file, NULL);
}
