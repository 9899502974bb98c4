package e2e

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/profi-dev/profi/internal/testutil"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// handoverStatus is what /status says of the handover: the runtime launch
// probes the driver counts for, and the drop counters of launches the
// runtime made (runtime_to_driver: counted at the runtime, skipped at the
// driver; nested: CUDA 13's tail jump).
type handoverStatus struct {
	AttachedLibraries []struct {
		Library string `json:"library"`
		Probes  []struct {
			Symbol          string `json:"symbol"`
			CountedAtDriver bool   `json:"counted_at_driver"`
		} `json:"probes"`
	} `json:"attached_libraries"`
	Drops map[string]uint64 `json:"drops"`
}

func handover(t *testing.T, a *testutil.Agent) (counted []string, drops map[string]uint64) {
	t.Helper()
	var st handoverStatus
	if err := a.Status(&st); err != nil {
		t.Fatal(err)
	}
	for _, l := range st.AttachedLibraries {
		for _, p := range l.Probes {
			if p.CountedAtDriver {
				counted = append(counted, p.Symbol)
			}
		}
	}
	slices.Sort(counted)
	return counted, st.Drops
}

// One trap per launch (issue 18): a runtime whose launches all reach the
// driver at sites of their own hands them to the driver's probe while a
// process launches through it (it launches until /status shows the
// handover), and a second process then launches through the same
// runtime file with one probe hit per launch: no launch counted at the
// runtime and skipped at the driver. A runtime that launches some other
// way keeps its probes. Every count stays exact through the switch, also
// with both processes stopped for 60 ms at a time while they launch
// (stalled: a thread off the CPU between two probes of one launch; each
// launches until it was stopped minStalls times).
func TestOneTrapPerLaunch(t *testing.T) {
	n, m := testutil.ScaleDown(6000), testutil.ScaleDown(4000)
	wantCounted := map[string][]string{
		"via-driver":   {"__cudaLaunchKernel", "__cudaLaunchKernel_ptsz", "cudaLaunchKernel", "cudaLaunchKernel_ptsz"},
		"runtime-only": nil,
	}
	for behaviour, env := range stubLaunch {
		for _, stalled := range []bool{false, true} {
			name := behaviour
			if stalled {
				name += "/stalled"
			}
			t.Run(name, func(t *testing.T) {
				oneTrapPerLaunch(t, env, stalled, n, m, wantCounted[behaviour], behaviour == "via-driver")
			})
		}
	}
}

// oneTrapPerLaunch is one case of TestOneTrapPerLaunch: wantCounted are the
// runtime launch probes handed to the driver.
func oneTrapPerLaunch(t *testing.T, env []string, stalled bool, n, m int, wantCounted []string, viaDriver bool) {
	a := startAgent(t, "--kernel-mode", "anonymous")
	handedOver := func() error {
		if counted, _ := handover(t, a); !slices.Equal(counted, wantCounted) {
			return fmt.Errorf("launch probes counted at the driver %v, want %v", counted, wantCounted)
		}
		return nil
	}
	// A launches until the switch is over (at least n and m launches),
	// then stays (holding the file). Unstalled, it pauses 1 ms every 50
	// launches (LAUNCH13_PACE): how long the switch takes bounds how many
	// it makes; stalled, the stops pace it.
	envA := env
	if !stalled {
		envA = append([]string{"LAUNCH13_PACE=50"}, env...)
	}
	pidA, gtA := runLaunch13Until(t, a, fixtures.Launch13, envA, n, m, stalled, handedOver)
	nA, mA := gtA.launches()
	pA := "pid=" + strconv.Itoa(pidA)
	want := values{key("profi_cuda_malloc_bytes_total", pA): 0, key("profi_cuda_active_memory_bytes", pA): 0}
	maps.Copy(want, anonymousLaunches(pA, nA, mA, gtA))
	requireExact(t, a, want, pidA)
	if err := handedOver(); err != nil {
		t.Fatalf("after process A: %v", err)
	}
	_, before := handover(t, a)

	pidB, gtB := runLaunch13Stalled(t, a, fixtures.Launch13, env, n/2, m/2, stalled)
	nB, mB := gtB.launches()
	pB := "pid=" + strconv.Itoa(pidB)
	want = values{key("profi_cuda_malloc_bytes_total", pB): 0, key("profi_cuda_active_memory_bytes", pB): 0}
	maps.Copy(want, anonymousLaunches(pB, nB, mB, gtB))
	requireExact(t, a, want, pidB)
	_, after := handover(t, a)
	skipped := after["runtime_to_driver"] - before["runtime_to_driver"]
	tails := after["nested"] - before["nested"]
	if viaDriver && (skipped != 0 || tails != 0) {
		t.Errorf("after the switch, %d launches were also counted at the runtime (runtime_to_driver) and %d tail jumps trapped (nested), want 0 and 0", skipped, tails)
	}
	if !viaDriver && (skipped != 0 || tails != uint64(nB+mB)) {
		t.Errorf("runtime-only: runtime_to_driver +%d, nested +%d, want 0 and %d", skipped, tails, nB+mB)
	}
}

// A process that maps the runtime without a probed driver (here the stub
// driver under a file name profi does not recognise, found through a
// libcuda.so.1 symlink) would have its launches counted nowhere once the
// runtime's launch probes are detached: they are attached again while it
// lives, and handed over again after it exits. Counts stay exact in each
// state.
func TestOneTrapPerLaunchTakenBack(t *testing.T) {
	const n, m = 3000, 2000
	all := []string{"__cudaLaunchKernel", "__cudaLaunchKernel_ptsz", "cudaLaunchKernel", "cudaLaunchKernel_ptsz"}
	a := startAgent(t, "--kernel-mode", "anonymous")
	waitCounted := func(want []string) map[string]uint64 {
		t.Helper()
		var drops map[string]uint64
		err := testenv.Eventually(10*time.Second, func() error {
			var counted []string
			counted, drops = handover(t, a)
			if !slices.Equal(counted, want) {
				return fmt.Errorf("launch probes counted at the driver %v, want %v", counted, want)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return drops
	}
	// run launches n/2 + m/2 times and returns how many of them were
	// counted at the runtime and skipped at the driver.
	run := func(env []string, n, m int) uint64 {
		t.Helper()
		_, before := handover(t, a)
		pid, gt := runLaunch13(t, a, fixtures.Launch13, env, n, m)
		p := "pid=" + strconv.Itoa(pid)
		want := values{key("profi_cuda_malloc_bytes_total", p): 0, key("profi_cuda_active_memory_bytes", p): 0}
		maps.Copy(want, anonymousLaunches(p, n, m, gt))
		requireExact(t, a, want, pid)
		_, after := handover(t, a)
		return after["runtime_to_driver"] - before["runtime_to_driver"]
	}

	run([]string{"LAUNCH13_SPREAD_MS=3000"}, n, m)
	waitCounted(all)

	dir := t.TempDir()
	if err := testutil.CopyFile(fixtures.Cuda, filepath.Join(dir, "libprofi-hidden-drv.so")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("libprofi-hidden-drv.so", filepath.Join(dir, "libcuda.so.1")); err != nil {
		t.Fatal(err)
	}
	blind := exec.Command("sleep", "60")
	blind.Env = append(os.Environ(), "LD_LIBRARY_PATH="+dir, "LD_PRELOAD="+fixtures.Cudart13)
	if err := blind.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = blind.Process.Kill(); _ = blind.Wait() })
	waitCounted(nil)
	if got := run(nil, n/2, m/2); got != uint64(n/2+m/2) {
		t.Errorf("with the runtime's probes back, %d launches merged at the driver, want %d", got, n/2+m/2)
	}

	_ = blind.Process.Kill()
	_ = blind.Wait()
	waitCounted(all)
	if got := run(nil, n/2, m/2); got != 0 {
		t.Errorf("handed over again, %d launches still counted at the runtime, want 0", got)
	}
}

// Every runtime launch API of the workload (--extra --ptsz), through the
// stub runtime, which launches as test/stubs/cudart.c documents:
// cudaLaunchKernel -> cuLaunchKernel and cudaLaunchKernel_ptsz ->
// cuLaunchKernel_ptsz, each from its own call; cudaLaunchCooperativeKernel
// and its _ptsz variant both -> cuLaunchCooperativeKernel, and
// cudaLaunchKernelExC and its _ptsz variant both -> cuLaunchKernelEx, from
// one call each: sites two ops share, which the driver cannot tell apart,
// so those four keep their runtime probes. With --errors, cudaLaunchKernel
// is also called with a NULL function, which the runtime rejects without
// calling the driver: it keeps its probe too. The first phase teaches
// profi; the second runs after the handover; both exact.
func TestOneTrapPerLaunchEveryAPI(t *testing.T) {
	for _, tc := range []struct {
		errors string
		want   []string
	}{
		{"--no-errors", []string{"cudaLaunchKernel", "cudaLaunchKernel_ptsz"}},
		{"--errors", []string{"cudaLaunchKernel_ptsz"}},
	} {
		t.Run(tc.errors, func(t *testing.T) {
			a := startAgent(t, "--kernel-mode", "anonymous")
			w := startWorkload(t, fixtures.Workload, []string{"--extra", "--ptsz", tc.errors})
			waitAttached(t, a, w.PID)
			gt := runPhase(t, w)
			requireExact(t, a, expected([]*testutil.GroundTruth{gt}), w.PID)
			err := testenv.Eventually(10*time.Second, func() error {
				if counted, _ := handover(t, a); !slices.Equal(counted, tc.want) {
					return fmt.Errorf("launch probes counted at the driver %v, want %v", counted, tc.want)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			gt = runPhase(t, w)
			requireExact(t, a, expected([]*testutil.GroundTruth{gt}), w.PID)
		})
	}
}

// After the handover, a runtime that reaches the driver from a call site it
// did not use while learning (issue 30 item 6): nothing proves the runtime
// counted those launches (its probe is detached, no live marker, no site
// in rt_counted), so the driver counts them, under the driver's op. Before
// the fix the driver skipped them as the runtime's: 300 of 300 lost.
func TestOneTrapPerLaunchUnseenSite(t *testing.T) {
	n, m := testutil.ScaleDown(2000), testutil.ScaleDown(1000)
	a := startAgent(t, "--kernel-mode", "anonymous")
	pidA, gtA := runLaunch13Stalled(t, a, fixtures.Launch13, []string{"LAUNCH13_SPREAD_MS=4000"}, n, m, false)
	pA := "pid=" + strconv.Itoa(pidA)
	wantA := values{key("profi_cuda_malloc_bytes_total", pA): 0, key("profi_cuda_active_memory_bytes", pA): 0}
	maps.Copy(wantA, anonymousLaunches(pA, n, m, gtA))
	requireExact(t, a, wantA, pidA)
	want := []string{"__cudaLaunchKernel", "__cudaLaunchKernel_ptsz", "cudaLaunchKernel", "cudaLaunchKernel_ptsz"}
	var before map[string]uint64
	err := testenv.Eventually(5*time.Second, func() error {
		var counted []string
		counted, before = handover(t, a)
		if !slices.Equal(counted, want) {
			return fmt.Errorf("launch probes counted at the driver %v, want %v", counted, want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	const nb, mb = 300, 200
	pidB, gtB := runLaunch13Stalled(t, a, fixtures.Launch13, []string{"PROFI_STUB_LAUNCH=second-site"}, nb, mb, false)
	pB := "pid=" + strconv.Itoa(pidB)
	requireExact(t, a, values{
		key("profi_cuda_malloc_bytes_total", pB):                                             0,
		key("profi_cuda_active_memory_bytes", pB):                                            0,
		key("profi_cuda_calls_total", "operation=cuLaunchKernel", pB, "stream=default"):      nb,
		key("profi_cuda_calls_total", "operation=cuLaunchKernel_ptsz", pB, "stream=default"): mb,
		key("profi_cuda_kernel_launches_total", "kernel=anonymous", pB):                      nb + mb,
		key("profi_cuda_kernel_grid_blocks_total", pB):                                       float64(gtB.GridBlocks),
		key("profi_cuda_kernel_block_threads_total", pB):                                     float64(gtB.BlockThreads),
		key("profi_cuda_kernel_shared_memory_bytes_total", pB):                               float64(gtB.SharedBytes),
	}, pidB)
	_, after := handover(t, a)
	if d := after["runtime_to_driver"] - before["runtime_to_driver"]; d != 0 {
		t.Errorf("runtime_to_driver +%d: launches skipped at the driver with no runtime probe to count them, want 0", d)
	}
}
