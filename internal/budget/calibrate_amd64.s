#include "textflag.h"

// trapTarget starts with push %rbp, an instruction the kernel emulates,
// like the prologues profi probes in CUDA libraries: a probe on it costs
// one trap and no single-step.
TEXT ·trapTarget(SB), NOSPLIT|NOFRAME, $0-0
	PUSHQ BP
	POPQ  BP
	RET

// bareTarget is trapTarget without the probe: the calibration times both
// in turn, so both see the same machine state.
TEXT ·bareTarget(SB), NOSPLIT|NOFRAME, $0-0
	PUSHQ BP
	POPQ  BP
	RET

// func callN(pc uintptr, n int) calls the ABI0 function at pc n times
// (trapTarget and bareTarget touch no register but the stack).
TEXT ·callN(SB), NOSPLIT, $0-16
	MOVQ pc+0(FP), DX
	MOVQ n+8(FP), CX

loop:
	TESTQ CX, CX
	JZ    done
	CALL  DX
	DECQ  CX
	JMP   loop

done:
	RET

// The ABI0 entries of the targets, where the probe goes (a Go func value
// would give the ABIInternal wrapper instead).
DATA ·trapTargetPC+0(SB)/8, $·trapTarget(SB)
GLOBL ·trapTargetPC(SB), RODATA, $8
DATA ·bareTargetPC+0(SB)/8, $·bareTarget(SB)
GLOBL ·bareTargetPC(SB), RODATA, $8
