#include "textflag.h"

// trapTarget starts with push %rbp, an instruction the kernel emulates,
// like the prologues profi probes in CUDA libraries: a probe on it costs
// one trap and no single-step.
TEXT ·trapTarget(SB), NOSPLIT|NOFRAME, $0-0
	PUSHQ BP
	POPQ  BP
	RET

// func callTarget(n int)
TEXT ·callTarget(SB), NOSPLIT, $0-8
	MOVQ n+0(FP), CX

loop:
	TESTQ CX, CX
	JZ    done
	CALL  ·trapTarget(SB)
	DECQ  CX
	JMP   loop

done:
	RET

// The ABI0 entry of trapTarget, where the probe goes (a Go func value
// would give the ABIInternal wrapper instead).
DATA ·trapTargetPC+0(SB)/8, $·trapTarget(SB)
GLOBL ·trapTargetPC(SB), RODATA, $8

// bareTarget and callBare are trapTarget and callTarget without the
// probe: the calibration times both in turn, so both see the same
// machine state.
TEXT ·bareTarget(SB), NOSPLIT|NOFRAME, $0-0
	PUSHQ BP
	POPQ  BP
	RET

// func callBare(n int)
TEXT ·callBare(SB), NOSPLIT, $0-8
	MOVQ n+0(FP), CX

bareLoop:
	TESTQ CX, CX
	JZ    bareDone
	CALL  ·bareTarget(SB)
	DECQ  CX
	JMP   bareLoop

bareDone:
	RET
