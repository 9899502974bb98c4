package collector

import (
	"testing"
	"time"

	"github.com/profi-dev/profi/internal/aggregate"
	"github.com/profi-dev/profi/internal/nvml"
)

// busySnap is an NVML snapshot of GPU 0 with these processes' totals.
func busySnap(ps ...nvml.ProcessBusy) *nvml.Snapshot {
	return &nvml.Snapshot{Up: true, GPUs: []nvml.GPU{{Index: 0, UUID: "GPU-a", ProcessBusy: ps}}}
}

// Per-pod busy counters: each process's increase is folded once into its
// pod's counter as the aggregator labels it at the fold; two processes of
// one pod add up; a process exits and its pod's counter keeps its total;
// an unlabelled PID waits busyLabelWait, then counts with empty labels;
// a counter that has not grown for busyExpiry goes.
func TestBusyPods(t *testing.T) {
	t.Parallel()
	b := newBusyPods()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	pods := map[int]aggregate.Meta{
		10: {PID: 10, Namespace: "ml", Pod: "infer-0", Container: "server"},
		11: {PID: 11, Namespace: "ml", Pod: "infer-0", Container: "server"},
	}
	pod := busySeries{"0", "GPU-a", "ml", "infer-0", "server"}
	none := busySeries{"0", "GPU-a", "", "", ""}
	sm := func(got map[busySeries]busyTotal, k busySeries) float64 { return got[k].sec[0] }

	got := b.fold(busySnap(nvml.ProcessBusy{UUID: "GPU-a", PID: 10, SM: 2 * time.Second, Memory: time.Second},
		nvml.ProcessBusy{UUID: "GPU-a", PID: 99, SM: 5 * time.Second}), pods, t0)
	if sm(got, pod) != 2 || got[pod].sec[1] != 1 || len(got) != 1 {
		t.Fatalf("first fold: %+v, want infer-0's 2 s sm and 1 s memory only (pid 99 waits for labels)", got)
	}
	// The same totals again: nothing more; pid 11 adds 3 s to the pod.
	got = b.fold(busySnap(nvml.ProcessBusy{UUID: "GPU-a", PID: 10, SM: 2 * time.Second, Memory: time.Second},
		nvml.ProcessBusy{UUID: "GPU-a", PID: 11, SM: 3 * time.Second},
		nvml.ProcessBusy{UUID: "GPU-a", PID: 99, SM: 6 * time.Second}), pods, t0.Add(10*time.Second))
	if sm(got, pod) != 5 {
		t.Errorf("second fold: pod %v s, want 5", sm(got, pod))
	}
	// pid 10 exits (NVML forgets it); pid 99 has waited long enough.
	got = b.fold(busySnap(nvml.ProcessBusy{UUID: "GPU-a", PID: 11, SM: 4 * time.Second},
		nvml.ProcessBusy{UUID: "GPU-a", PID: 99, SM: 6 * time.Second}), pods, t0.Add(40*time.Second))
	if sm(got, pod) != 6 || sm(got, none) != 6 {
		t.Errorf("third fold: pod %v s, unlabelled %v s; want 6 and 6", sm(got, pod), sm(got, none))
	}
	// An hour without growth: gone.
	got = b.fold(busySnap(), pods, t0.Add(40*time.Second+busyExpiry+time.Second))
	if len(got) != 0 {
		t.Errorf("after %v without growth: %+v, want none", busyExpiry, got)
	}
}
