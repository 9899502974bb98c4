package e2e

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/profi-dev/profi/internal/testutil"
)

// A kernel warning in the uprobe code stops every probe on the node: the
// test writes one into /dev/kmsg (from userspace, so the agent runs with
// the hidden --kmsg-trust-user; a real warning has the kernel facility)
// while a workload runs. /status says degraded with the reason and lists
// no attached file and no loader hook (no link left), the metric counts
// one stop of library "all", the workload's later calls are not counted
// (its counts stay exactly those of its first phase), a process started
// afterwards is not probed, and the agent keeps serving /metrics and
// /health.
func TestKernelWarningStopsProbes(t *testing.T) {
	a := startAgent(t, "--kmsg-trust-user")
	w := startWorkload(t, fixtures.Workload, breakerArgs)
	waitAttached(t, a, w.PID)
	gt := runPhase(t, w)
	requireExact(t, a, expected([]*testutil.GroundTruth{gt}), w.PID)

	line := writeUprobeWarning(t, w.PID)
	written := time.Now()
	st := waitQuarantined(t, a, 1, "node")
	q := st.Quarantined[0]
	if q.Library != "all" || q.Reason != "kernel_warning" || !slices.Contains(q.PIDs, w.PID) || q.LiftsAt != nil {
		t.Errorf("stop %+v; want library all, reason kernel_warning, pid %d among the pids, no lift", q, w.PID)
	}
	t.Logf("kernel warning to every link closed: %.3f s (detach %.6f s)", time.Since(written).Seconds(), q.DetachSeconds)
	if !st.Degraded || len(st.DegradedReasons) != 1 || !strings.Contains(st.DegradedReasons[0], "every probe on the node is off (kernel_warning)") ||
		!strings.Contains(st.DegradedReasons[0], line) {
		t.Errorf("degraded %v %q; want one reason with the kernel's line", st.Degraded, st.DegradedReasons)
	}
	var links struct {
		Attached    []any `json:"attached_libraries"`
		LoaderHooks []any `json:"loader_hooks"`
	}
	if err := a.Status(&links); err != nil {
		t.Fatal(err)
	}
	if len(links.Attached) != 0 || len(links.LoaderHooks) != 0 {
		t.Errorf("still attached after the stop: %+v", links)
	}
	if got, _ := quarantineCount(t, a); len(got) != 1 || got["all/kernel_warning/node"] != 1 {
		t.Errorf("profi_system_probe_quarantines_total %v, want all/kernel_warning 1", got)
	}
	if lines := a.LogLines("every probe on the node is off"); len(lines) != 1 || !strings.Contains(lines[0], "level=ERROR") {
		t.Errorf("log lines about the stop %q, want one ERROR line", lines)
	}

	gt2 := runPhase(t, w)
	if gt2.TotalCalls() <= gt.TotalCalls() {
		t.Fatalf("the second phase made no calls: %d then %d", gt.TotalCalls(), gt2.TotalCalls())
	}
	late := startWorkload(t, fixtures.Workload, breakerArgs)
	gtLate := runPhase(t, late)
	waitDrainAfter(t, a, time.Now())
	mfs, err := a.Metrics()
	if err != nil {
		t.Fatalf("/metrics after the stop: %v", err)
	}
	if d := diff(expected([]*testutil.GroundTruth{gt}), observed(mfs, w.PID, late.PID)); d != "" {
		t.Errorf("after the stop, the workload counts only its first phase and the late one (%d calls) nothing:\n%s", gtLate.TotalCalls(), d)
	}
	if code, body, err := a.Get("/health"); err != nil || code != 200 {
		t.Errorf("/health %d %q %v after the stop, want 200", code, body, err)
	}
	if err := w.Stop(); err != nil {
		t.Errorf("the workload did not exit cleanly: %v", err)
	}
}

// writeUprobeWarning writes into /dev/kmsg a kernel warning report from the
// uprobe code naming pid, as the kernel prints one (the agent trusts it
// with --kmsg-trust-user); a unique suffix keeps reports apart. It
// returns the warning's line.
func writeUprobeWarning(t *testing.T, pid int) string {
	t.Helper()
	kmsg, err := os.OpenFile("/dev/kmsg", os.O_WRONLY, 0)
	if err != nil {
		t.Fatalf("open /dev/kmsg: %v", err)
	}
	defer kmsg.Close()
	line := fmt.Sprintf("WARNING: CPU: 0 PID: %d at kernel/events/uprobes.c:2163 handle_swbp+0x3c4/0x4d0 (profi e2e %d)", pid, time.Now().UnixNano())
	for _, l := range []string{"------------[ cut here ]------------", line, "Call Trace:", " uprobe_notify_resume+0x2e/0x40", "---[ end trace 0000000000000000 ]---"} {
		if _, err := fmt.Fprintf(kmsg, "<4>%s\n", l); err != nil {
			t.Fatal(err)
		}
	}
	return line
}
