/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * x86-64: the register frame and argument access at a probe on a
 * function's first instruction (System V AMD64 ABI). Twin of arm64.h:
 * both define the same accessors, and the programs use nothing else, so
 * no program names a register or a stack offset (ARCHITECTURE.md, "Both
 * architectures").
 *
 * Argument slots: rdi, rsi, rdx, rcx, r8, r9, then the stack above the
 * return address (sp+8, sp+16, ...). A composite of at most 16 bytes
 * passed by value (dim3) takes two slots; a larger one is copied onto the
 * stack and takes none (big_arg).
 */
#pragma once

/*
 * Register frame as the kernel saves it (uapi layout and names, which
 * bpf_tracing.h expects when neither __KERNEL__ nor __VMLINUX_H__ is
 * defined).
 */
struct pt_regs {
	unsigned long r15;
	unsigned long r14;
	unsigned long r13;
	unsigned long r12;
	unsigned long rbp;
	unsigned long rbx;
	unsigned long r11;
	unsigned long r10;
	unsigned long r9;
	unsigned long r8;
	unsigned long rax;
	unsigned long rcx;
	unsigned long rdx;
	unsigned long rsi;
	unsigned long rdi;
	unsigned long orig_rax;
	unsigned long rip;
	unsigned long cs;
	unsigned long eflags;
	unsigned long rsp;
	unsigned long ss;
};

#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

/* Argument slots passed in registers. */
#define ARG_REGS 6

/* Slots a composite of more than 16 bytes passed by value takes: none, it is on the stack. */
#define BIG_ARG_SLOTS 0

/* The most arguments args_ret reads. */
#define ARGS_RET_MAX 3

/*
 * Integer argument slot n (1-based): six registers, then the stack, where
 * sp points at the return address.
 */
static __always_inline u64 arg(struct pt_regs *ctx, u32 n)
{
	u64 v = 0;

	switch (n) {
	case 1:
		return ctx->rdi;
	case 2:
		return ctx->rsi;
	case 3:
		return ctx->rdx;
	case 4:
		return ctx->rcx;
	case 5:
		return ctx->r8;
	case 6:
		return ctx->r9;
	}
	bpf_probe_read_user(&v, sizeof(v), (void *)(ctx->rsp + 8 * (n - ARG_REGS)));
	return v;
}

/*
 * The address of a composite of more than 16 bytes passed by value as
 * argument slot n, after `before` bytes of such composites earlier in the
 * list, when no other argument is on the stack: the caller copied each
 * (class MEMORY) in argument order where the stack arguments go, above the
 * return address, 8-byte aligned, and the next argument takes slot n
 * (BIG_ARG_SLOTS). cudaMemset3D(cudaPitchedPtr, int, cudaExtent): the
 * extent at sp+8+32, the int in the first register.
 */
static __always_inline u64 big_arg(struct pt_regs *ctx, u32 n, u32 before)
{
	return ctx->rsp + 8 + before;
}

/*
 * The stack pointer at entry: 8 below the caller's, the call pushed the
 * return address. Compared, never read through, by the nesting and
 * tail-jump checks: a call made from inside a function enters below that
 * function's entry sp (the call pushes its return address below the
 * caller's frame); a tail jump leaves the frame as it found it and enters
 * at the same sp.
 */
static __always_inline u64 entry_sp(struct pt_regs *ctx)
{
	return ctx->rsp;
}

/* The return address at entry: at the top of the stack; 0 if unreadable. */
static __always_inline u64 entry_ret(struct pt_regs *ctx)
{
	u64 v = 0;

	bpf_probe_read_user(&v, sizeof(v), (void *)ctx->rsp);
	return v;
}

/*
 * Whether the call that entered at stack pointer sp with return address
 * ret is still running, seen from a probe deeper on the same stack: its
 * return address is still in the slot the call wrote, at sp. Once it has
 * returned, the next call from its caller's frame overwrites that slot.
 */
static __always_inline bool call_live(struct pt_regs *ctx, u64 sp, u64 ret)
{
	u64 v = 0;

	if (bpf_probe_read_user(&v, sizeof(v), (void *)sp))
		return false;
	return v == ret;
}

/*
 * Argument slots first..first+n-1 into v and the return address into
 * *ret (0 if unreadable), with one read of user memory: the stack
 * arguments sit right above the return address. n <= ARGS_RET_MAX.
 */
static __always_inline void args_ret(struct pt_regs *ctx, u32 first, u32 n, u64 *v, u64 *ret)
{
	u64 st[1 + ARGS_RET_MAX]; /* the return address, then stack arguments */
	u32 last = first + n - 1;
	u32 i;

	bpf_probe_read_user(st, 8 * (last > ARG_REGS ? last - ARG_REGS + 1 : 1), (void *)ctx->rsp);
	*ret = st[0];
#pragma unroll
	for (i = 0; i < ARGS_RET_MAX; i++) {
		if (i >= n)
			break;
		v[i] = first + i > ARG_REGS ? st[first + i - ARG_REGS] : arg(ctx, first + i);
	}
}

/* The return value, at a return probe. */
static __always_inline u64 ret_value(struct pt_regs *ctx)
{
	return ctx->rax;
}

/* The address the probe fired at. */
static __always_inline u64 probe_ip(struct pt_regs *ctx)
{
	return ctx->rip;
}

/*
 * The crash breaker's evidence at a fault (bpf/exit.c). The uprobe
 * breakpoint is int3; an int3 of the program's own reports the address
 * after it, so a SIGTRAP never counts as one at the instruction pointer.
 */
#define UPROBE_BKPT	  0xccU
#define UPROBE_BKPT_MASK  0xffU
#define BKPT_TRAP_AT_NEXT 1
/* __NR_uretprobe: return probes return through it from 6.11 (docs/KERNELS.md). */
#define NR_URETPROBE 335
/*
 * A return through the return probe's trampoline pops the hijacked return
 * address slot: the stack pointer is the slot's address (return_instance's
 * stack) plus 8. The trampoline's system call blocked by a seccomp filter
 * returns to the function's return value instead.
 */
#define RETURN_POPPED_SP(stack) ((stack) + 8)

/* The user registers' instruction pointer, stack pointer and system call number. */
#define UREGS_IP(r)	 ((r)->rip)
#define UREGS_SP(r)	 ((r)->rsp)
#define UREGS_SYSCALL(r) ((r)->orig_rax)
