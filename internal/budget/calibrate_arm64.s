#include "textflag.h"

// trapTarget starts with stp x29, x30, [sp, #-16]!, the frame record an
// arm64 function begins with (after bti c and paciasp where it is built
// with branch protection, which the kernel steps alike): the kernel
// single-steps it out of line, so a probe on it costs a trap and a step,
// as a probe on a usual arm64 prologue does.
TEXT ·trapTarget(SB), NOSPLIT|NOFRAME, $0-0
	STP.W (R29, R30), -16(RSP)
	LDP.P 16(RSP), (R29, R30)
	RET

// bareTarget is trapTarget without the probe: the calibration times both
// in turn, so both see the same machine state.
TEXT ·bareTarget(SB), NOSPLIT|NOFRAME, $0-0
	STP.W (R29, R30), -16(RSP)
	LDP.P 16(RSP), (R29, R30)
	RET

// func callN(pc uintptr, n int) calls the ABI0 function at pc n times
// (trapTarget and bareTarget leave every register as they found it; the
// frame saves the link register the calls overwrite).
TEXT ·callN(SB), NOSPLIT, $16-16
	MOVD pc+0(FP), R1
	MOVD n+8(FP), R2

loop:
	CBZ  R2, done
	CALL (R1)
	SUB  $1, R2
	B    loop

done:
	RET

// The ABI0 entries of the targets, where the probe goes (a Go func value
// would give the ABIInternal wrapper instead).
DATA ·trapTargetPC+0(SB)/8, $·trapTarget(SB)
GLOBL ·trapTargetPC(SB), RODATA, $8
DATA ·bareTargetPC+0(SB)/8, $·bareTarget(SB)
GLOBL ·bareTargetPC(SB), RODATA, $8
