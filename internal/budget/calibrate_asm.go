//go:build amd64 || arm64

package budget

// Implemented in calibrate_amd64.s and calibrate_arm64.s.

//nolint:unused // called only through callN, in assembly
func trapTarget()

//nolint:unused // called only through callN, in assembly
func bareTarget()

// callN calls the ABI0 function at pc n times.
func callN(pc uintptr, n int)

// trapTargetPC and bareTargetPC are the ABI0 entries of trapTarget and
// bareTarget, set in assembly.
var trapTargetPC, bareTargetPC uintptr
