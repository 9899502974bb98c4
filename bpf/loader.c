// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)

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
