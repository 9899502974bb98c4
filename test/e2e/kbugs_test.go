package e2e

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/profi-dev/profi/internal/testutil"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// On a kernel whose return probes kill a process behind a seccomp filter
// (docs/KERNELS.md, x86-uretprobe-syscall-seccomp: Debian's 6.12.10 has
// neither the fix nor its 6.12.14 backport; --assume-kernel injects it),
// the agent attaches no return probe (issue 42 item 4): /status says so,
// the workload's launches are counted exactly at entry and none of its
// calls is timed. The kernel running the test is not classified. On
// arm64, which has no return probe system call, the same kernel keeps its
// return probes: the timed series are there.
func TestKernelWithReturnProbeBug(t *testing.T) {
	degraded := runtime.GOARCH == "amd64"
	a := startAgent(t, "--assume-kernel", "6.12.10-amd64|#1 SMP PREEMPT_DYNAMIC Debian 6.12.10-1 (2025-01-20)")
	w := startWorkload(t, fixtures.Workload, defaultArgs)
	waitAttached(t, a, w.PID)
	gt := runPhase(t, w)
	launches := func(v values) values {
		out := values{}
		for k, x := range v {
			if strings.HasPrefix(k, "profi_cuda_kernel_launches_total") {
				out[k] = x
			}
		}
		return out
	}
	want := launches(expected([]*testutil.GroundTruth{gt}))
	if len(want) == 0 {
		t.Fatal("the workload made no launches")
	}
	err := testenv.Eventually(15*time.Second, func() error {
		mfs, err := a.Metrics()
		if err != nil {
			return err
		}
		got := observed(mfs, w.PID)
		if d := diff(want, launches(got)); d != "" {
			return fmt.Errorf("launches differ from ground truth:\n%s", d)
		}
		timed := 0
		for k := range got {
			if strings.Contains(k, "duration") {
				timed++
			}
		}
		if degraded && timed > 0 {
			return fmt.Errorf("%d timed series without return probes", timed)
		}
		if !degraded {
			if d := diff(expected([]*testutil.GroundTruth{gt}), got); d != "" {
				return fmt.Errorf("not degraded on %s, every series exact:\n%s", runtime.GOARCH, d)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Features struct {
			NoReturnProbes bool `json:"no_return_probes"`
		} `json:"kernel_features"`
	}
	if err := a.Status(&st); err != nil {
		t.Fatal(err)
	}
	if st.Features.NoReturnProbes != degraded {
		t.Errorf("/status kernel_features.no_return_probes %v, want %v on %s", st.Features.NoReturnProbes, degraded, runtime.GOARCH)
	}
	lines := a.LogLines("calls are not timed (no return probes)")
	if degraded && (len(lines) != 1 || !strings.Contains(lines[0], "x86-uretprobe-syscall-seccomp")) || !degraded && len(lines) != 0 {
		t.Errorf("log lines about the downgrade %q, want one naming the bug on amd64, none elsewhere", lines)
	}
}
