//go:build linux && (amd64 || arm64)

package budget

import (
	"fmt"
	"runtime"
	"slices"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/profi-dev/profi/internal/discover"
)

// Calibrate measures what one uprobe trap costs on this machine: it
// times calls of a function of the agent's own with and without an empty
// probe on it and returns the difference per call (the median of rounds).
func Calibrate() (time.Duration, error) {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.Kprobe,
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
		License:      "GPL",
	})
	if err != nil {
		return 0, fmt.Errorf("load calibration program: %w", err)
	}
	defer prog.Close()
	off, err := discover.SelfFileOffset(trapTargetPC)
	if err != nil {
		return 0, err
	}
	ex, err := link.OpenExecutable("/proc/self/exe")
	if err != nil {
		return 0, fmt.Errorf("open own executable: %w", err)
	}
	// No PID filter: only the agent runs this code, and profi's own probes
	// have none either (a filter adds its own cost to every hit).
	l, err := ex.Uprobe("trapTarget", prog, &link.UprobeOptions{Address: off})
	if err != nil {
		return 0, fmt.Errorf("attach calibration probe: %w", err)
	}
	defer l.Close()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	// A finished GC cycle first: a concurrent mark on the sibling
	// hyperthread made single calibrations up to 2x too high.
	runtime.GC()
	// Probed and bare calls alternate, so that both see the same machine
	// state, and the rounds spread over 0.2 s, so that a burst of steal
	// or of another thread's work on the sibling hyperthread affects a
	// minority of them: the median of the rounds' differences drops them.
	const calls, rounds = 1000, 21
	diffs := make([]time.Duration, rounds)
	for i := range diffs {
		time.Sleep(10 * time.Millisecond)
		probed := timeCalls(trapTargetPC, calls)
		diffs[i] = probed - timeCalls(bareTargetPC, calls)
	}
	per := median(diffs) / calls
	if per <= 0 {
		return 0, fmt.Errorf("calibration probe did not slow calls down (median difference %v per %d calls): probe not hit", median(diffs), calls)
	}
	return per, nil
}

// timeCalls measures the calling thread's CPU time, which is what traps
// cost a process, rather than wall time, which preemption inflates on a
// busy node.
func timeCalls(pc uintptr, n int) time.Duration {
	t0 := threadCPU()
	callN(pc, n)
	return threadCPU() - t0
}

func threadCPU() time.Duration {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts) // cannot fail for this clock
	return time.Duration(ts.Nano())
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}
