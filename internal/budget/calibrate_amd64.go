package budget

// Implemented in calibrate_amd64.s.

//nolint:unused // called only from callTarget, in assembly
func trapTarget()

func callTarget(n int)

//nolint:unused // called only from callBare, in assembly
func bareTarget()

func callBare(n int)

// trapTargetPC is the ABI0 entry of trapTarget, set in assembly.
var trapTargetPC uintptr
