// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)

/*
 * The fields of the kernel's structures the crash breaker reads, at their
 * offsets in the running kernel (CO-RE relocations against its BTF).
 * do_exit sets exit_code before the sched_process_exit tracepoint, the
 * signal that killed the process in its low 7 bits (exit(n) leaves them
 * 0). The uprobe out-of-line page ([uprobes]: the copies of probed
 * instructions and the return probe trampoline) is mm's xol_area; a
 * thread's pending return probes are its utask's return_instances, each
 * with the stack address of the return address it hijacked. do_exit
 * counts the exiting thread out of signal->live before the tracepoint too:
 * 0 there means the whole process has exited.
 */
struct xol_area___profi {
	unsigned long vaddr;
} __attribute__((preserve_access_index));

struct uprobes_state___profi {
	struct xol_area___profi *xol_area;
} __attribute__((preserve_access_index));

struct mm_struct___profi {
	struct uprobes_state___profi uprobes_state;
} __attribute__((preserve_access_index));

struct return_instance___profi {
	unsigned long stack;
} __attribute__((preserve_access_index));

struct uprobe_task___profi {
	struct return_instance___profi *return_instances;
} __attribute__((preserve_access_index));

struct signal_struct___profi {
	struct {
		int counter;
	} live;
} __attribute__((preserve_access_index));

struct task_struct___profi {
	int exit_code;
	struct signal_struct___profi *signal;
	struct mm_struct___profi *mm;
	struct uprobe_task___profi *utask;
} __attribute__((preserve_access_index));

/* SIGILL, SIGTRAP, SIGBUS, SIGFPE, SIGSEGV, SIGSYS: the same numbers on x86-64 and arm64. */
#define SIGTRAP 5
#define SIGSYS	31

static __always_inline bool fault_signal(u32 sig)
{
	return sig == 4 || sig == SIGTRAP || sig == 7 || sig == 8 || sig == 11 || sig == SIGSYS;
}

/* The current thread's user registers, as saved at its entry into the kernel. */
static __always_inline int user_regs(struct pt_regs *r)
{
	struct pt_regs *k = (void *)bpf_task_pt_regs(bpf_get_current_task_btf());

	return bpf_probe_read_kernel(r, sizeof(*r), k);
}

/*
 * What ties a fault at instruction pointer ip, stack pointer sp, to the
 * probes (enum fault_why): ip in the out-of-line page (a copied
 * instruction or the trampoline faulted, or the process jumped there);
 * the uprobe breakpoint at ip (the kernel moves the instruction pointer
 * back to the probed instruction when its out-of-line copy faults); the
 * innermost pending return probe's slot popped (a return through the
 * trampoline that came out wrong). Nothing here trusts what the process
 * can say: the signal was raised by the kernel, the rest is the kernel's
 * own state and the process's code.
 */
static __always_inline u8 fault_evidence(u32 sig, u64 ip, u64 sp)
{
	struct task_struct___profi *task = (void *)bpf_get_current_task();
	u64 xol = BPF_CORE_READ(task, mm, uprobes_state.xol_area, vaddr);
	u64 stack = BPF_CORE_READ(task, utask, return_instances, stack);
	u32 insn = 0;
	u8 why = 0;

	if (xol && ip - xol < page_size)
		why |= FAULT_XOL;
	if (!(BKPT_TRAP_AT_NEXT && sig == SIGTRAP) &&
	    !bpf_probe_read_user(&insn, sizeof(insn), (void *)ip) &&
	    (insn & UPROBE_BKPT_MASK) == UPROBE_BKPT)
		why |= FAULT_PROBED_INSN;
	if (stack && RETURN_POPPED_SP(stack) && sp == RETURN_POPPED_SP(stack))
		why |= FAULT_RETURN;
	return why;
}

/*
 * A fault signal is delivered to a thread of a probed process. Only one
 * the kernel raised counts (si_code > 0: never kill, tgkill or sigqueue,
 * whose codes are 0 or negative; a process may queue itself a positive
 * code, but not make its instruction pointer explain it). It is kept, the
 * process's latest, with the evidence that ties it to a probe and the
 * faulting thread's latest probe hit, for the exit to report: a handler
 * may run first and raise the signal again with kill (Python's
 * faulthandler does), which is not kept. A thread that never trapped
 * cannot have been made to fault by a probe: its fault keeps no evidence.
 * Signals of unprobed processes cost one map lookup.
 */
SEC("raw_tracepoint/signal_deliver")
int fault_deliver(u64 *ctx)
{
	u32 sig = (u32)ctx[0], pid = bpf_get_current_pid_tgid() >> 32;
	const void *info = (const void *)ctx[1];
	struct thread_state *t;
	struct last_hit *h;
	struct pt_regs r;
	s32 code = 0;
	u64 addr = 0;

	if (!crash_breaker || !fault_signal(sig) || !info)
		return 0;
	h = bpf_map_lookup_elem(&pid_last_hit, &pid);
	if (!h)
		return 0;
	/* kernel_siginfo: si_signo, si_errno, si_code, then the union at 16 (64-bit). */
	if (bpf_probe_read_kernel(&code, sizeof(code), info + 8) || code <= 0)
		return 0;
	bpf_probe_read_kernel(&addr, sizeof(addr), info + 16);
	if (user_regs(&r))
		return 0;
	h->fault_ip = UREGS_IP(&r);
	h->fault_addr = addr;
	h->fault_code = code;
	h->fault_sig = sig;
	t = thread_state();
	h->file = t ? t->hit_file : 0;
	h->ns = t ? t->hit_ns : 0;
	h->fault_why = h->file ? fault_evidence(sig, UREGS_IP(&r), UREGS_SP(&r)) : 0;
	return 0;
}

/*
 * A thread of a process with a crash record exits. If a fault signal
 * killed it, the first such thread sends one crash_events record
 * (deleting the entry decides which: the others find it gone), with the
 * evidence fault_deliver kept; the breaker in userspace decides whether a
 * probe explains the death. A process that exits otherwise (exit,
 * SIGKILL, SIGTERM) drops the entry with its last thread.
 */
static __always_inline void note_exit(u64 id)
{
	struct task_struct___profi *task = (void *)bpf_get_current_task();
	u32 pid = id >> 32, key = 0;
	struct last_hit *h, fault;
	struct thread_state *t;
	struct crash_event *e;
	struct pt_regs r;
	u64 hit_ns, *lost;
	u32 file, sig;
	int code;

	h = bpf_map_lookup_elem(&pid_last_hit, &pid);
	if (!h)
		return;
	code = BPF_CORE_READ(task, exit_code);
	sig = code & 0x7f;
	if (!fault_signal(sig)) {
		if (!BPF_CORE_READ(task, signal, live.counter))
			bpf_map_delete_elem(&pid_last_hit, &pid);
		return;
	}
	hit_ns = h->ns;
	file = h->file;
	fault = *h;
	/*
	 * A seccomp filter kills without delivering a signal: one that
	 * blocks the return probe's system call kills in it (x86-64 from
	 * 6.11; docs/KERNELS.md). The killed thread exits first, the others
	 * only once woken by the kill, so it is the one reporting, with its
	 * own latest hit.
	 */
	if (sig == SIGSYS && NR_URETPROBE >= 0 && !user_regs(&r) &&
	    UREGS_SYSCALL(&r) == NR_URETPROBE && (t = thread_state()) && t->hit_file) {
		file = t->hit_file;
		hit_ns = t->hit_ns;
		fault.fault_ip = UREGS_IP(&r);
		fault.fault_addr = 0;
		fault.fault_code = 0;
		fault.fault_sig = SIGSYS;
		fault.fault_why = FAULT_URETPROBE_SYS;
	}
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
	e->tenant = tenant_of(pid);
	e->fault_ip = fault.fault_ip;
	e->fault_addr = fault.fault_addr;
	e->fault_code = fault.fault_code;
	e->fault_sig = fault.fault_sig;
	e->fault_why = fault.fault_why;
	bpf_get_current_comm(e->comm, sizeof(e->comm));
	bpf_ringbuf_submit(e, 0);
}

/*
 * Every thread exit. A thread that exits inside an NCCL call (a rank
 * killed mid-collective) never returns from it: its in-flight entry goes
 * with it, so no hang is reported for a process that is gone (its current
 * device, task storage, goes with the thread by itself). And the crash
 * breaker learns of probed processes killed by a fault.
 */
SEC("raw_tracepoint/sched_process_exit")
int thread_exit(void *ctx)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 pid = id >> 32;

	/* An unseen process's range (BPF's own, rt_text) goes with it. */
	if ((u32)id == pid)
		bpf_map_delete_elem(&rt_text, &pid);
	delete_admitted(&nccl_inflight, &id, id >> 32, QUOTA_NCCL_INFLIGHT);
	if (nvtx_enabled)
		delete_admitted(&nvtx_stack, &id, id >> 32, QUOTA_NVTX_STACK);
	if (crash_breaker)
		note_exit(id);
	return 0;
}
