// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)

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

	delete_admitted(&nccl_inflight, &id, id >> 32, QUOTA_NCCL_INFLIGHT);
	delete_admitted(&thread_device, &id, id >> 32, QUOTA_THREAD_DEVICE);
	if (nvtx_enabled)
		delete_admitted(&nvtx_stack, &id, id >> 32, QUOTA_NVTX_STACK);
	if (crash_breaker)
		note_exit(id);
	return 0;
}
