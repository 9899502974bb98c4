package e2e

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/profi-dev/profi/internal/ops"
	"github.com/profi-dev/profi/internal/testutil"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// The full mix: runtime launches through every launch API (each going down
// into the stub driver), direct driver launches, peer/2D copies, managed
// and pinned memory, memsets, synchronisation, cudaSetDevice.
var mixArgs = []string{"--driver", "5", "--extra", "--ptsz"}

// Every probed call exactly once, in each kernel mode and probe profile:
// runtime launches that enter the driver are not counted twice, the
// diagnostic functions appear only with --probe-profile full, and
// --kernel-mode off produces no launch series at all.
func TestModesAndProfiles(t *testing.T) {
	for _, m := range []mode{
		{ops.KernelModeAnonymous, ops.ProfileLean},
		{ops.KernelModeAnonymous, ops.ProfileFull},
		{ops.KernelModeOff, ops.ProfileLean},
		{ops.KernelModeOff, ops.ProfileFull},
		{ops.KernelModeFull, ops.ProfileLean},
		{ops.KernelModeFull, ops.ProfileFull},
	} {
		t.Run(m.kernel+"/"+m.profile, func(t *testing.T) {
			a := startAgent(t, "--kernel-mode", m.kernel, "--probe-profile", m.profile)
			w := startWorkload(t, fixtures.WorkloadDlopen, append([]string{"--lib", fixtures.Cudart}, mixArgs...))
			if err := w.Load(); err != nil {
				t.Fatal(err)
			}
			waitAttached(t, a, w.PID)
			gt := runPhase(t, w)
			requireExact(t, a, expectedFor(m, []*testutil.GroundTruth{gt}), w.PID)
		})
	}
}

// Kernel names in full mode for a process started before the agent: its
// kernels were registered before any probe existed, so runtime launches
// are named from the ELF symbols of the host stubs, driver launches from
// the cuModuleGetFunction/cuLibraryGetKernel calls seen after attach.
func TestFullModeNamesProcessStartedBefore(t *testing.T) {
	m := mode{ops.KernelModeFull, ops.ProfileLean}
	w := startWorkload(t, fixtures.Workload, mixArgs)
	a := startAgent(t, "--kernel-mode", m.kernel)
	waitAttached(t, a, w.PID)
	gt := runPhase(t, w)
	requireExact(t, a, expectedFor(m, []*testutil.GroundTruth{gt}), w.PID)
}

// --sample-rate N: calls and bytes stay exact; only latency is sampled, at
// random, and scaled by N in BPF, so each histogram count estimates the
// call count within the binomial bound (6 standard deviations).
func TestSampling(t *testing.T) {
	const n = 4
	a := startAgent(t, "--sample-rate", strconv.Itoa(n))
	w := startWorkload(t, fixtures.Workload, defaultArgs)
	waitAttached(t, a, w.PID)
	gt := runPhase(t, w)

	want := expected([]*testutil.GroundTruth{gt})
	hist := values{}
	for k, v := range want {
		if strings.HasPrefix(k, "profi_cuda_duration_") {
			hist[k] = v
			delete(want, k)
		}
	}
	mfs := requireExactExcept(t, a, want, []int{w.PID}, hist)
	got := observed(mfs, w.PID)
	sampled := false
	for k, calls := range hist {
		sampled = sampled || got[k] != calls
		est := got[k]
		bound := 6 * math.Sqrt(calls*(n-1))
		if math.Mod(est, n) != 0 || math.Abs(est-calls) > bound {
			t.Errorf("%s: estimate %v for %v calls: not a multiple of %d or beyond ±%.0f", k, est, calls, n, bound)
		}
	}
	if !sampled {
		t.Error("every latency count equals its call count: nothing was sampled")
	}
}

// Caps never misattribute: streams beyond --max-streams-per-pid and kernels
// beyond --max-kernels-per-pid go to "other", every admitted series holds
// exactly its own count, and the totals are unchanged.
func TestCardinalityCaps(t *testing.T) {
	a := startAgent(t, "--kernel-mode", "full", "--max-streams-per-pid", "2", "--max-kernels-per-pid", "3")
	w := startWorkload(t, fixtures.Workload, mixArgs)
	waitAttached(t, a, w.PID)
	gt := runPhase(t, w)
	pid := strconv.Itoa(w.PID)

	err := testenv.Eventually(15*time.Second, func() error {
		mfs, err := a.Metrics()
		if err != nil {
			return err
		}
		// Kernels: at most 3 names, each exact; "other" holds the rest.
		wantByKernel := map[string]float64{}
		var total float64
		for raw, c := range gt.LaunchesByKernel {
			wantByKernel[kernelLabel(raw)] += float64(c)
			total += float64(c)
		}
		// Summed over the gpu label: the workload's threads set different devices.
		named, sum := 0, 0.0
		gotByKernel := map[string]float64{}
		for _, s := range testutil.Samples(mfs["profi_cuda_kernel_launches_total"]) {
			if s.Labels["pid"] != pid {
				continue
			}
			sum += s.Value
			gotByKernel[s.Labels["kernel"]] += s.Value
		}
		for k, v := range gotByKernel {
			if k != "other" {
				named++
				if v != wantByKernel[k] {
					return fmt.Errorf("kernel %s: %v launches, want %v", k, v, wantByKernel[k])
				}
			}
		}
		if named != 3 || sum != total {
			return fmt.Errorf("%d named kernels (want 3), %v launches in all (want %v)", named, sum, total)
		}
		// Streams: per operation, default + at most 2 handles + other; totals exact.
		for fn, byStream := range gt.CallsByStream {
			p, ok := defaultMode.probed()[fn]
			if !ok {
				continue
			}
			op := p.label
			var want, got float64
			for _, c := range byStream {
				want += float64(c)
			}
			handles := map[string]bool{}
			gotByStream := map[string]float64{} // summed over the gpu label
			for _, s := range testutil.Samples(mfs["profi_cuda_calls_total"]) {
				if s.Labels["pid"] != pid || s.Labels["operation"] != op {
					continue
				}
				got += s.Value
				gotByStream[s.Labels["stream"]] += s.Value
			}
			for st, v := range gotByStream {
				switch st {
				case "other":
				default:
					if st != "default" {
						handles[st] = true
					}
					if float64(byStream[st]) != v {
						return fmt.Errorf("%s stream %s: %v calls, want %v", op, st, v, byStream[st])
					}
				}
			}
			if len(handles) > 2 || got != want {
				return fmt.Errorf("%s: %d stream handles (cap 2), %v calls (want %v)", op, len(handles), got, want)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// --detailed-launches sends one event per launch besides the aggregated
// path, which stays exact: events received + ring drops = launches.
func TestDetailedLaunches(t *testing.T) {
	a := startAgent(t, "--detailed-launches")
	w := startWorkload(t, fixtures.Workload, defaultArgs)
	waitAttached(t, a, w.PID)
	gt := runPhase(t, w)
	requireExact(t, a, expected([]*testutil.GroundTruth{gt}), w.PID)
	err := testenv.Eventually(15*time.Second, func() error {
		mfs, err := a.Metrics()
		if err != nil {
			return err
		}
		one := func(name string) float64 {
			s := testutil.Samples(mfs[name])
			if len(s) != 1 {
				return -1
			}
			return s[0].Value
		}
		events, drops := one("profi_system_detailed_launch_events_total"), one("profi_dropped_events_total")
		if events+drops != float64(gt.Launches) {
			return fmt.Errorf("launch events %v + ring drops %v != %d launches", events, drops, gt.Launches)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Recent []struct {
			PID       int    `json:"pid"`
			Operation string `json:"operation"`
		} `json:"recent_launches"`
	}
	if err := a.Status(&st); err != nil {
		t.Fatal(err)
	}
	if len(st.Recent) != 256 {
		t.Fatalf("/status holds %d recent launches, want 256", len(st.Recent))
	}
	for _, e := range st.Recent {
		if e.PID != w.PID || e.Operation != "cudaLaunchKernel" {
			t.Fatalf("recent launch %+v: want pid %d, cudaLaunchKernel", e, w.PID)
		}
	}
}

// A CET-built library (every function starts endbr64; push %rbp) is probed
// just past the endbr64, on the push the kernel emulates: counts stay
// exact, every timed and launch probe reports offset 4 in /status.
func TestProbesSkipEndbr64(t *testing.T) {
	a := startAgent(t)
	w := startWorkload(t, fixtures.WorkloadDlopen, append([]string{"--lib", fixtures.CudartCET, "--lib-cuda", fixtures.Cuda}, mixArgs...))
	if err := w.Load(); err != nil {
		t.Fatal(err)
	}
	waitAttached(t, a, w.PID)
	gt := runPhase(t, w)
	requireExact(t, a, expected([]*testutil.GroundTruth{gt}), w.PID)

	var st struct {
		Attached []struct {
			Path   string `json:"path"`
			Probes []struct {
				Symbol string `json:"symbol"`
				Offset uint64 `json:"offset"`
			} `json:"probes"`
		} `json:"attached_libraries"`
	}
	if err := a.Status(&st); err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, l := range st.Attached {
		for _, p := range l.Probes {
			want := uint64(0) // the driver stub is not built with CET
			if l.Path == fixtures.CudartCET {
				want = 4
			}
			if p.Offset != want {
				t.Errorf("%s %s: offset %d, want %d", l.Path, p.Symbol, p.Offset, want)
			}
			checked++
		}
	}
	if checked == 0 {
		t.Fatal("no probes in /status")
	}
}
