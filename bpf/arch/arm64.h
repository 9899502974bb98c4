/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * arm64: the register frame and argument access at a probe on a
 * function's first instruction (AAPCS64, as Linux uses it). Twin of
 * x86_64.h: both define the same accessors, and the programs use nothing
 * else, so no program names a register or a stack offset (ARCHITECTURE.md,
 * "Both architectures").
 *
 * Argument slots: x0-x7, then the stack at sp (sp, sp+8, ...: the return
 * address is in x30, not on the stack). A composite of at most 16 bytes
 * passed by value (dim3) takes two slots, as on x86-64; a larger one is
 * passed by reference, a pointer in one slot (big_arg).
 */
#pragma once

/*
 * The register frame a uprobe program sees: the kernel's struct pt_regs
 * begins with the uapi struct user_pt_regs (asm/ptrace.h). Programs never
 * read a member by name: the accessors below do, through REG.
 */
struct user_pt_regs {
	__u64 regs[31];
	__u64 sp;
	__u64 pc;
	__u64 pstate;
};

struct pt_regs {
	struct user_pt_regs user_regs;
};

#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

/*
 * Register r of the frame, read at its constant offset in a way the
 * compiler cannot rewrite: it merges plain reads of different registers
 * in the branches of a switch into one read through a computed address
 * (regs + 8 * n), which the verifier refuses for the context ("modified
 * ctx ptr"). An inline assembly load cannot be merged so; it can still be
 * combined with an identical one.
 */
#define REG(ctx, r)                                                                                \
	({                                                                                         \
		u64 __v;                                                                           \
		asm("%0 = *(u64 *)(%1 + %2)"                                                       \
		    : "=r"(__v)                                                                    \
		    : "r"(ctx), "i"(__builtin_offsetof(struct user_pt_regs, r)));                  \
		__v;                                                                               \
	})

/* Argument slots passed in registers. */
#define ARG_REGS 8

/* Slots a composite of more than 16 bytes passed by value takes: one, its address. */
#define BIG_ARG_SLOTS 1

/* The most arguments args_ret reads. */
#define ARGS_RET_MAX 3

/*
 * User virtual addresses have at most 48 bits: the kernel maps nothing of
 * a process above 2^48 unless an mmap hint asks for it (52-bit VA
 * kernels), which no loader does for code or stacks.
 */
#define USER_VA_MASK ((1ULL << 48) - 1)

/* Integer argument slot n (1-based): eight registers, then the stack at sp. */
static __always_inline u64 arg(struct pt_regs *ctx, u32 n)
{
	u64 v = 0;

	switch (n) {
	case 1:
		return REG(ctx, regs[0]);
	case 2:
		return REG(ctx, regs[1]);
	case 3:
		return REG(ctx, regs[2]);
	case 4:
		return REG(ctx, regs[3]);
	case 5:
		return REG(ctx, regs[4]);
	case 6:
		return REG(ctx, regs[5]);
	case 7:
		return REG(ctx, regs[6]);
	case 8:
		return REG(ctx, regs[7]);
	}
	bpf_probe_read_user(&v, sizeof(v), (void *)(REG(ctx, sp) + 8 * (n - ARG_REGS - 1)));
	return v;
}

/*
 * The address of a composite of more than 16 bytes passed by value as
 * argument slot n: the caller passes a pointer to a copy in that slot
 * (AAPCS64, stage B), and the next argument takes slot n + 1 (BIG_ARG_SLOTS).
 * Each such composite takes its own slot, so the bytes of earlier ones
 * (before, which x86-64 needs) do not matter here.
 */
static __always_inline u64 big_arg(struct pt_regs *ctx, u32 n, u32 before)
{
	return arg(ctx, n);
}

/*
 * The stack pointer at entry: the caller's own (bl leaves the return
 * address in x30). Compared, never read through, by the nesting and
 * tail-jump checks, which hold as on x86-64: a function that makes a call
 * must first save x30 on its stack (there is no red zone), so a call made
 * from inside it enters below its entry sp; a tail jump restores the
 * frame and enters at the same sp.
 */
static __always_inline u64 entry_sp(struct pt_regs *ctx)
{
	return REG(ctx, sp);
}

/*
 * The return address at entry: x30. At the symbol it is a plain address;
 * a probe placed past paciasp/pacibsp sees it signed, the pointer
 * authentication code in the bits above the virtual address. BPF has no
 * helper for xpaclri, so the code is masked off (USER_VA_MASK): the
 * addresses compared and sent are the same either way.
 */
static __always_inline u64 entry_ret(struct pt_regs *ctx)
{
	return REG(ctx, regs[30]) & USER_VA_MASK;
}

/* Frame records call_live follows at most (the runtime's frames below its launch). */
#define CALL_LIVE_FRAMES 8

/*
 * Whether the call that entered at stack pointer sp with return address
 * ret is still running, seen from a probe deeper on the same stack. The
 * return address is in x30, not on the stack, so the frame-record chain
 * (x29: previous x29, saved x30) is followed up from the probe towards sp:
 * a live call's function saved ret in its record below sp, a returned
 * call's record is no longer on the chain. A runtime built without frame
 * records ends the chain early: the call reads as returned, and its
 * driver launch is counted at the driver too (never lost).
 */
static __always_inline bool call_live(struct pt_regs *ctx, u64 sp, u64 ret)
{
	u64 fp = REG(ctx, regs[29]);
	u32 i;

	for (i = 0; i < CALL_LIVE_FRAMES; i++) {
		u64 rec[2] = {};

		if (fp < REG(ctx, sp) || fp >= sp ||
		    bpf_probe_read_user(rec, sizeof(rec), (void *)fp))
			return false;
		if ((rec[1] & USER_VA_MASK) == ret)
			return true;
		if (rec[0] <= fp)
			return false;
		fp = rec[0];
	}
	return false;
}

/*
 * Argument slots first..first+n-1 into v and the return address into
 * *ret, with at most one read of user memory (the stack arguments are
 * adjacent; the return address is in x30). n <= ARGS_RET_MAX.
 */
static __always_inline void args_ret(struct pt_regs *ctx, u32 first, u32 n, u64 *v, u64 *ret)
{
	u64 st[ARGS_RET_MAX]; /* the stack arguments from slot lo on */
	u32 last = first + n - 1;
	u32 lo = first > ARG_REGS ? first : ARG_REGS + 1;
	u32 i;

	*ret = entry_ret(ctx);
	if (last > ARG_REGS)
		bpf_probe_read_user(st, 8 * (last - lo + 1),
				    (void *)(REG(ctx, sp) + 8 * (lo - ARG_REGS - 1)));
#pragma unroll
	for (i = 0; i < ARGS_RET_MAX; i++) {
		if (i >= n)
			break;
		v[i] = first + i > ARG_REGS ? st[first + i - lo] : arg(ctx, first + i);
	}
}

/* The return value, at a return probe. */
static __always_inline u64 ret_value(struct pt_regs *ctx)
{
	return REG(ctx, regs[0]);
}

/* The address the probe fired at. */
static __always_inline u64 probe_ip(struct pt_regs *ctx)
{
	return REG(ctx, pc);
}

/*
 * The crash breaker's evidence at a fault (bpf/exit.c). The uprobe
 * breakpoint is BRK #0x004 (BRK64_OPCODE_UPROBES), which compilers never
 * emit; a BRK reports its own address.
 */
#define UPROBE_BKPT	  0xd4200080U
#define UPROBE_BKPT_MASK  0xffffffffU
#define BKPT_TRAP_AT_NEXT 0
/* No return probe system call on arm64: the trampoline is a breakpoint. */
#define NR_URETPROBE (-1)
/*
 * The return address is in x30, not on the stack: a return through the
 * trampoline traps into the kernel, which either handles it or raises
 * SIGILL at the trampoline ([uprobes], FAULT_XOL). No stack rule.
 */
#define RETURN_POPPED_SP(stack) 0

/* The user registers' instruction pointer, stack pointer and system call number (none kept). */
#define UREGS_IP(r)	 ((r)->user_regs.pc)
#define UREGS_SP(r)	 ((r)->user_regs.sp)
#define UREGS_SYSCALL(r) (-1)
