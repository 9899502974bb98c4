package e2e

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/profi-dev/profi/internal/discover"
	"github.com/profi-dev/profi/internal/testutil"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// waitLibAttached waits until /status lists pid among the processes of an
// attached file of lib.
func waitLibAttached(t *testing.T, a *testutil.Agent, pid int, lib discover.Library) {
	t.Helper()
	err := testenv.Eventually(15*time.Second, func() error {
		var st status
		if err := a.Status(&st); err != nil {
			return err
		}
		for _, l := range st.AttachedLibraries {
			if l.Library == string(lib) && slices.Contains(l.PIDs, pid) {
				return nil
			}
		}
		return fmt.Errorf("pid %d has no attached %s; status: %+v", pid, lib, st)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// launchesByPhase sums profi_cuda_kernel_launches_total of pid by phase,
// and lists the (kernel, kernel_class, phase) label combinations seen.
func launchesByPhase(t *testing.T, a *testutil.Agent, pid int) (map[string]uint64, []string, error) {
	t.Helper()
	mfs, err := a.Metrics()
	if err != nil {
		return nil, nil, err
	}
	got := map[string]uint64{}
	combos := map[string]bool{}
	for _, s := range testutil.Samples(mfs["profi_cuda_kernel_launches_total"]) {
		if s.Labels["pid"] != strconv.Itoa(pid) {
			continue
		}
		got[s.Labels["phase"]] += uint64(s.Value)
		combos[s.Labels["kernel"]+"/"+s.Labels["kernel_class"]+"/"+s.Labels["phase"]] = true
	}
	return got, slices.Sorted(maps.Keys(combos)), nil
}

// wantPhases is the ground truth without its zero entries: a phase with no
// launch has no series.
func wantPhases(gt *testutil.GroundTruth) map[string]uint64 {
	want := map[string]uint64{}
	for p, n := range gt.LaunchesByPhase {
		if n > 0 {
			want[p] = n
		}
	}
	return want
}

// requirePhases waits until the launches of pid by phase equal want
// exactly, and every series is kernel="anonymous", kernel_class="other".
func requirePhases(t *testing.T, a *testutil.Agent, pid int, want map[string]uint64) {
	t.Helper()
	err := testenv.Eventually(15*time.Second, func() error {
		got, combos, err := launchesByPhase(t, a, pid)
		if err != nil {
			return err
		}
		for _, c := range combos {
			if !strings.HasPrefix(c, "anonymous/other/") {
				return fmt.Errorf("launch series with labels kernel/kernel_class/phase %q, want anonymous/other/<phase>", c)
			}
		}
		if !maps.Equal(got, want) {
			return fmt.Errorf("launches by phase %v, ground truth %v (series %q)", got, want, combos)
		}
		return nil
	})
	if err != nil {
		mfs, _ := a.Metrics()
		t.Fatalf("%v\n%s", err, dropCounters(mfs))
	}
}

// With --enable-nvtx-tracing every launch carries the phase of its
// thread's NVTX range stack on the default aggregated path, exactly as
// the workload computed it: nesting, rule order, wide and domain ranges,
// a pop with nothing open. Both NVTX library names are recognised.
func TestNVTXPhases(t *testing.T) {
	for _, tc := range []struct {
		name string
		args func() []string
	}{
		{"libnvToolsExt", func() []string { return []string{"--nvtx"} }},
		{"libnvtx3interop", func() []string { return []string{"--nvtx-lib", fixtures.Nvtx3Interop} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := startAgent(t, "--enable-nvtx-tracing")
			w := startWorkload(t, fixtures.Workload, tc.args())
			waitLibAttached(t, a, w.PID, discover.LibCudart)
			waitLibAttached(t, a, w.PID, discover.LibNVTX)
			gt := runPhase(t, w)
			if len(gt.LaunchesByPhase) == 0 {
				t.Fatalf("workload reported no launches_by_phase: %+v", gt)
			}
			requirePhases(t, a, w.PID, wantPhases(gt))
			// Every other series is unchanged by NVTX tracing.
			requireExact(t, a, expected([]*testutil.GroundTruth{gt}), w.PID)

			// Cumulative across phases.
			gt = runPhase(t, w)
			requirePhases(t, a, w.PID, wantPhases(gt))
		})
	}
}

// NVTX ranges and NCCL calls on one thread: an empty NCCL group before
// every launch, inside open ranges and outside, leaves every launch's
// phase as the ranges say (an NCCL return once dropped the thread's
// ranges), and the NCCL calls are counted exactly.
func TestNVTXWithNCCL(t *testing.T) {
	a := startAgent(t, "--enable-nvtx-tracing")
	w := startWorkload(t, fixtures.Workload, []string{"--nvtx", "--nccl-lib", fixtures.Nccl})
	waitLibAttached(t, a, w.PID, discover.LibCudart)
	waitLibAttached(t, a, w.PID, discover.LibNVTX)
	waitLibAttached(t, a, w.PID, discover.LibNCCL)
	for range 2 { // cumulative across phases
		gt := runPhase(t, w)
		if gt.NCCLCalls["ncclGroupEnd"] == 0 {
			t.Fatalf("workload made no NCCL calls: %+v", gt.NCCLCalls)
		}
		requirePhases(t, a, w.PID, wantPhases(gt))
		err := testenv.Eventually(15*time.Second, func() error {
			mfs, err := a.Metrics()
			if err != nil {
				return err
			}
			got := map[string]uint64{}
			for _, s := range testutil.Samples(mfs["profi_nccl_calls_total"]) {
				if s.Labels["pid"] == strconv.Itoa(w.PID) {
					got[s.Labels["operation"]] += uint64(s.Value)
				}
			}
			if !maps.Equal(got, gt.NCCLCalls) {
				return fmt.Errorf("NCCL calls %v, ground truth %v", got, gt.NCCLCalls)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// Without --enable-nvtx-tracing the NVTX library is not attached and the
// phase label stays empty, whatever ranges the process opens.
func TestNVTXOff(t *testing.T) {
	a := startAgent(t)
	w := startWorkload(t, fixtures.Workload, []string{"--nvtx"})
	waitLibAttached(t, a, w.PID, discover.LibCudart)
	gt := runPhase(t, w)
	var total uint64
	for _, n := range gt.LaunchesByPhase {
		total += n
	}
	if total == 0 {
		t.Fatalf("workload reported no launches_by_phase: %+v", gt)
	}
	requirePhases(t, a, w.PID, map[string]uint64{"": total})
	requireExact(t, a, expected([]*testutil.GroundTruth{gt}), w.PID)
	var st status
	if err := a.Status(&st); err != nil {
		t.Fatal(err)
	}
	if n := countLib(st, string(discover.LibNVTX)); n != 0 {
		t.Errorf("%d NVTX library files attached without --enable-nvtx-tracing: %+v", n, st.AttachedLibraries)
	}
}
