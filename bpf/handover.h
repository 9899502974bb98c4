/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The runtime->driver handover (ARCHITECTURE.md, "One trap per launch"):
 * which probe counts a runtime launch, the markers runtime entries leave
 * (threads), what learning files record (rt_sites, rt_ops), and the
 * sites whose driver entry counts for the runtime (rt_counted).
 */
#pragma once

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

/*
 * Unseen processes (PF_UNSEEN: mapped an attached file since the last
 * pass; a short one exits before the next). Their runtime's range is
 * found where the kernel keeps it, the mapping (vma) that holds an
 * address (bpf_find_vma, 5.17+; find_vma in config.h): from a
 * runtime probe, the probed instruction, in that file's code; from a
 * driver launch, its return address, whose mapping's inode rt_inodes
 * names if it is a runtime's. So a handed-over runtime's launches count
 * as the runtime's op from the process's first one, and learning runs in
 * short processes too.
 */
struct file___profi {
	void *f_inode;
} __attribute__((preserve_access_index));

struct vm_area_struct___profi {
	unsigned long vm_start;
	unsigned long vm_end;
	struct file___profi *vm_file;
} __attribute__((preserve_access_index));

struct vma_found {
	u64 start;
	u64 end;
	u64 inode; /* the mapped file's inode address; 0: anonymous memory */
};

/* bpf_find_vma's callback (task, vma, data), vma as the kernel's struct. */
static long vma_found_cb(void *task, struct vm_area_struct___profi *vma, void *data)
{
	struct vma_found *out = data;

	out->start = BPF_CORE_READ(vma, vm_start);
	out->end = BPF_CORE_READ(vma, vm_end);
	out->inode = (u64)BPF_CORE_READ(vma, vm_file, f_inode);
	return 0;
}

/*
 * The mapping of the current process that holds addr, if it maps a file:
 * false for anonymous memory (JIT code), and when the process's mappings
 * are being changed (the lock is only tried: counted as DROP_RT_TEXT).
 */
static __always_inline bool find_mapping(u64 addr, struct vma_found *out)
{
	long err;

	if (!find_vma)
		return false;
	err = bpf_find_vma(bpf_get_current_task_btf(), addr, vma_found_cb, out, 0);

	if (err == -EBUSY)
		count_drop(DROP_RT_TEXT);
	return !err && out->inode;
}

/*
 * Writes the rt_text entry of unseen process pid from the mapping that
 * holds addr: with file, a probe of that runtime file fired at addr (its
 * inode is noted in rt_inodes); without (0), addr is a driver launch's
 * return address, and the mapping must be a noted runtime file's. Returns
 * whether the entry is there. A global function: the verifier checks it
 * once, not in every caller's paths (inlined, it doubled launch_entry's
 * instructions processed: docs/BENCHMARK.md, "Verifier cost").
 */
__noinline int write_unseen_text(u32 pid, u64 addr, u32 file)
{
	struct text_range t = {};
	struct vma_found m = {};
	u32 *noted;

	if (!find_mapping(addr, &m))
		return 0;
	if (file) {
		bpf_map_update_elem(&rt_inodes, &m.inode, &file, BPF_ANY);
	} else {
		noted = bpf_map_lookup_elem(&rt_inodes, &m.inode);
		if (!noted || !bpf_map_lookup_elem(&file_facts, noted))
			return 0;
		file = *noted;
	}
	t.start = m.start;
	t.end = m.end;
	t.file = file;
	bpf_map_update_elem(&rt_text, &pid, &t, BPF_NOEXIST);
	if (!bpf_map_lookup_elem(&rt_text, &pid)) {
		count_drop(DROP_RT_TEXT);
		return 0;
	}
	return 1;
}

/* Notes the inode of the mapping that holds addr as runtime file file's (rt_inodes). Global, as
 * above. */
__noinline int note_inode(u64 addr, u32 file)
{
	struct vma_found m = {};

	if (find_mapping(addr, &m))
		bpf_map_update_elem(&rt_inodes, &m.inode, &file, BPF_ANY);
	return 0;
}

/*
 * The runtime range of the current process (pid) into *out, and whether it
 * has one: a registered process's is in its pid_files value v (PF_RT_TEXT),
 * so no lookup; an unseen one's (PF_UNSEEN in flags) is rt_text's, found
 * from addr's mapping if not there yet (write_unseen_text: file 0 for a
 * driver launch's return address). handed is then the file's (file_facts).
 */
static __always_inline bool process_text(const struct pid_file_val *v, u32 flags, u32 pid, u64 addr,
					 u32 file, struct text_range *out)
{
	struct text_range *t;
	u8 *f;

	if (v && (v->flags & PF_RT_TEXT)) {
		out->start = v->rt_start;
		out->end = v->rt_end;
		out->file = v->rt_file;
		out->handed = !!(v->flags & PF_HANDED);
		return true;
	}
	if (!(flags & PF_UNSEEN))
		return false;
	t = bpf_map_lookup_elem(&rt_text, &pid);
	if (!t && write_unseen_text(pid, addr, file))
		t = bpf_map_lookup_elem(&rt_text, &pid);
	if (!t)
		return false;
	out->start = t->start;
	out->end = t->end;
	out->file = t->file;
	f = bpf_map_lookup_elem(&file_facts, &out->file);
	out->handed = f && (*f & PF_HANDED);
	return true;
}

/* The marker in thread state t (thread_state); NULL when it has none. */
static __always_inline struct rt_launch *thread_marker(struct thread_state *t)
{
	return t && t->rt.sp ? &t->rt : NULL;
}
static const struct rt_site_val zero_rt_site;

/* Tells userspace that op of file may be handed over now (rt_learned). */
static __always_inline void rt_learned_now(u32 file, u32 op)
{
	struct rt_learned_event e = {.file = file, .op = op};

	if (bpf_ringbuf_output(&rt_learned, &e, sizeof(e), 0))
		count_drop(DROP_RT_LEARN);
}

/* what: 0 merged, 1 unmerged, 2 a tail jump from 1 + op tail_of. */
static __always_inline void rt_op_add(u32 file, u32 op, u32 what, u32 tail_of)
{
	struct rt_op_key k = {.file = file, .op = op};
	struct rt_op_val *v = lookup_or_init(&rt_ops, &k, &zero_rt_op, DROP_RT_LEARN);

	if (!v)
		return;
	if (what == 0) {
		PCPU_ADD(v->merged, 1);
		if (v->merged == RT_MIN_MERGED)
			rt_learned_now(file, op);
	} else if (what == 1)
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
 * Leaves the marker of a counted runtime launch in the thread's state t
 * (created if NULL); with learn (1 + op, the file has PF_RT_MARK), the
 * launch before it on the thread that never reached the driver is counted
 * against its op.
 */
static __always_inline void mark_runtime_launch(struct pt_regs *ctx, struct thread_state *t,
						u32 file, u32 learn, u64 ret, bool tail)
{
	struct rt_launch *m, *old = thread_marker(t);

	if (learn && old && old->learn && !old->merged)
		rt_op_add(file, old->learn - 1, 1, 0);
	if (!t)
		t = thread_state_new();
	if (!t) {
		count_drop(DROP_RT_MARKER);
		return;
	}
	m = &t->rt;
	m->sp = entry_sp(ctx);
	m->ret = ret;
	m->learn = learn;
	m->merged = 0;
	m->tail = tail;
}

/* A driver launch below a learning runtime launch: where it entered the driver. */
static __always_inline void rt_learn(struct text_range *text, u32 drv_op, u64 ret, u32 op)
{
	struct rt_site k = {.file = text->file, .drv_op = drv_op, .off = ret - text->start};
	struct rt_site_val *v = lookup_or_init(&rt_sites, &k, &zero_rt_site, DROP_RT_LEARN);

	/* The site first: rt_op_add may tell userspace to read both. */
	if (v) {
		if (!v->op) {
			v->op = op + 1;
			/* A new site: the file's inode, for its unseen processes' driver launches.
			 */
			note_inode(ret, text->file);
		} else if (v->op != op + 1)
			v->mixed = 1;
		PCPU_ADD(v->merged, 1);
	}
	rt_op_add(text->file, op, 0, 0);
}

#define RT_NESTED ((u32)~0U)

/*
 * What a driver launch at op is counted as: op (the application called
 * the driver), RT_NESTED (the runtime made it, and the runtime's probe
 * counted it), or the runtime op whose launches the driver counts at that
 * site (rt_counted). ret: the driver launch's return address
 * (decode_launch); text: the process's runtime range (process_text), NULL
 * if it has none. Inside the runtime's range the return address proves
 * who made the call; the marker only says which runtime op, so no time
 * window applies there: every marking launch replaces the thread's marker.
 */
static __always_inline u32 driver_launch_op(struct pt_regs *ctx, u64 ret, u32 op,
					    struct thread_state *t, struct text_range *text)
{
	struct rt_launch *m;
	bool nested;

	if (text) {
		struct rt_site k = {.file = text->file, .drv_op = op, .off = ret - text->start};
		bool handed;
		u32 *as;

		if (ret < text->start || ret >= text->end)
			return op;
		handed = text->handed;
		m = thread_marker(t);
		nested = m && !m->merged && entry_sp(ctx) < m->sp;
		as = handed ? bpf_map_lookup_elem(&rt_counted, &k) : NULL;
		/* Else clang tests handed for as, a link the verifier does not keep. */
		barrier_var(as);
		/* A marker of another op whose launch returned: it never got here. */
		if (as && *as < OP_MAX && nested && m->learn != *as + 1 && !rt_marker_live(ctx, m))
			nested = false;
		if (as && *as < OP_MAX && !nested)
			return *as;
		/*
		 * Ops of this file are handed over and the site is not one of
		 * theirs (a path the runtime did not take while learning): a
		 * handed op's probe is detached and leaves no marker, so only a
		 * live marker of a probed op proves the runtime counted this
		 * launch. Otherwise the driver counts it, as its own op
		 * (ARCHITECTURE.md, "One trap per launch").
		 */
		if (handed && !as && nested && !rt_marker_live(ctx, m))
			nested = false;
		if (handed && !as && !nested)
			return op;
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
	m = thread_marker(t);
	if (!m)
		return op;
	nested = entry_sp(ctx) < m->sp && rt_marker_live(ctx, m);
	m->sp = 0; /* consumed */
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
static __always_inline bool runtime_nested(struct pt_regs *ctx, u64 ret, u32 flags, u32 op,
					   u32 file, struct thread_state *t,
					   const struct text_range *text)
{
	u32 learn = flags & PF_RT_MARK ? op + 1 : 0;
	struct rt_launch *m = thread_marker(t);

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
		mark_runtime_launch(ctx, t, file, learn, ret, true);
		return false;
	}
	if (flags & PF_RT_SHARED) {
		if (!text || ret < text->start || ret >= text->end) {
			if (learn)
				mark_runtime_launch(ctx, t, file, learn, ret, false);
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
	mark_runtime_launch(ctx, t, file, learn, ret, false);
	return false;
}
