package e2e

import (
	"encoding/json"
	"maps"
	"strconv"
	"testing"
	"time"

	"github.com/profi-dev/profi/internal/testutil"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// launch13Truth is what test/workloads/launch13.c prints.
type launch13Truth struct {
	Calls        map[string]uint64 `json:"calls"`
	GridBlocks   uint64            `json:"grid_blocks"`
	BlockThreads uint64            `json:"block_threads"`
	SharedBytes  uint64            `json:"shared_bytes"`
	// LaunchesByKernel: launches by host stub symbol.
	LaunchesByKernel map[string]uint64 `json:"launches_by_kernel"`
}

// client is a ground-truth client (testutil.Client) under a running agent.
type client struct{ *testutil.Client }

// startClient starts bin with env added to the test's environment and
// waits for its "ready" line.
func startClient(t *testing.T, env []string, bin string, args ...string) *client {
	t.Helper()
	return &client{testutil.StartClient(t, env, bin, args...)}
}

// run waits until the agent has attached to the client, tells it "go" and
// decodes its ground truth into truth.
func (c *client) run(t *testing.T, a *testutil.Agent, truth any) int {
	t.Helper()
	return c.runStalled(t, a, truth, false)
}

// minStalls is how many times a stalled client is stopped while it makes
// its calls: it makes calls until then, however fast it makes them.
const minStalls = 30

// runStalled is run; with stalled, the client is stopped for
// testutil.StallOff at a time while it makes its calls, at random points:
// between any two probes of one call (no count may depend on timing). It
// makes at least the calls its arguments ask for, and goes on until it has
// been stopped minStalls times.
func (c *client) runStalled(t *testing.T, a *testutil.Agent, truth any, stalled bool) int {
	t.Helper()
	return c.runUntil(t, a, truth, stalled, nil)
}

// runUntil is runStalled; with until (nil: none), the client also makes
// calls until until returns nil (polled, for at most 10 s).
func (c *client) runUntil(t *testing.T, a *testutil.Agent, truth any, stalled bool, until func() error) int {
	t.Helper()
	waitAttached(t, a, c.PID)
	var line string
	if stalled || until != nil {
		c.Run(t)
		var s *testutil.Staller
		if stalled {
			s = testutil.Stall(c.PID)
			defer s.Stop()
		}
		if until != nil {
			if err := testenv.Eventually(10*time.Second, until); err != nil {
				t.Fatal(err)
			}
		}
		if stalled {
			if err := s.Wait(minStalls); err != nil {
				t.Fatalf("%s: %v", c.Bin, err)
			}
			t.Logf("%s stopped %d times while it made its calls", c.Bin, s.Stop())
		}
		line = c.Stop(t)
	} else {
		line = c.Go(t)
	}
	if err := json.Unmarshal([]byte(line), truth); err != nil {
		t.Fatalf("%s output %q: %v", c.Bin, line, err)
	}
	return c.PID
}

// runClient starts a client under a running agent and runs it.
func runClient(t *testing.T, a *testutil.Agent, truth any, bin string, args ...string) int {
	t.Helper()
	return startClient(t, nil, bin, args...).run(t, a, truth)
}

// runLaunch13 runs the CUDA 13-style launcher (bin: fixtures.Launch13 or a
// static build) under a running agent: n __cudaLaunchKernel and m
// __cudaLaunchKernel_ptsz launches; env is added to its environment.
func runLaunch13(t *testing.T, a *testutil.Agent, bin string, env []string, n, m int) (int, launch13Truth) {
	t.Helper()
	return runLaunch13Stalled(t, a, bin, env, n, m, false)
}

// runLaunch13Stalled is runLaunch13, stalled as client.runStalled says:
// stalled, it makes at least n and m launches.
func runLaunch13Stalled(t *testing.T, a *testutil.Agent, bin string, env []string, n, m int, stalled bool) (int, launch13Truth) {
	t.Helper()
	return runLaunch13Until(t, a, bin, env, n, m, stalled, nil)
}

// runLaunch13Until is runLaunch13Stalled, launching also until until
// returns nil (client.runUntil; nil: none).
func runLaunch13Until(t *testing.T, a *testutil.Agent, bin string, env []string, n, m int, stalled bool, until func() error) (int, launch13Truth) {
	t.Helper()
	var gt launch13Truth
	pid := startClient(t, env, bin, strconv.Itoa(n), strconv.Itoa(m)).runUntil(t, a, &gt, stalled, until)
	gn, gm := gt.launches()
	if exact := !stalled && until == nil; (exact && (gn != n || gm != m)) || gn < n || gm < m {
		t.Fatalf("launch13 ground truth %+v, want %d and %d launches (at least, stalled or until)", gt, n, m)
	}
	if gn != n || gm != m {
		t.Logf("launch13 made %d and %d launches (at least %d and %d asked)", gn, gm, n, m)
	}
	return pid, gt
}

// launches are the __cudaLaunchKernel and __cudaLaunchKernel_ptsz launches
// launch13 made.
func (gt launch13Truth) launches() (n, m int) {
	return int(gt.Calls["__cudaLaunchKernel"]), int(gt.Calls["__cudaLaunchKernel_ptsz"])
}

// stubLaunch are the two behaviours of the stub runtime's launches: through
// the driver's exported launch functions (as NVIDIA's runtime does, via
// cuGetProcAddress), or returning in the runtime (test/stubs/cudart.c).
var stubLaunch = map[string][]string{"via-driver": nil, "runtime-only": {"PROFI_STUB_LAUNCH=runtime"}}

// anonymousLaunches is what anonymous mode exports for launch13's launches.
func anonymousLaunches(p string, n, m int, gt launch13Truth) values {
	return values{
		key("profi_cuda_calls_total", "operation=__cudaLaunchKernel", p, "stream=default"):      float64(n),
		key("profi_cuda_calls_total", "operation=__cudaLaunchKernel_ptsz", p, "stream=default"): float64(m),
		key("profi_cuda_kernel_launches_total", "kernel=anonymous", p):                          float64(n + m),
		key("profi_cuda_kernel_grid_blocks_total", p):                                           float64(gt.GridBlocks),
		key("profi_cuda_kernel_block_threads_total", p):                                         float64(gt.BlockThreads),
		key("profi_cuda_kernel_shared_memory_bytes_total", p):                                   float64(gt.SharedBytes),
	}
}

// Code built by nvcc 13 launches through __cudaGetKernel and
// __cudaLaunchKernel[_ptsz] of libcudart.so.13, never cudaLaunchKernel:
// each launch is counted once, with its geometry, in anonymous mode,
// whether the runtime launches through the driver's exported functions (the
// driver launch is merged) or not; kernel mode off counts none. Stalled:
// the same with the process stopped for 60 ms at a time, between any two
// probes of a launch (the tail jump and the driver launch below it are
// paired by identity, not time).
func TestCUDA13Launches(t *testing.T) {
	for behaviour, env := range stubLaunch {
		for _, tc := range []struct {
			mode    string
			stalled bool
			n, m    int
		}{{"anonymous", false, 300, 200}, {"off", false, 300, 200}, {"anonymous", true, 5000, 3000}} {
			name := behaviour + "/" + tc.mode
			if tc.stalled {
				name += "/stalled"
			}
			mode := tc.mode
			t.Run(name, func(t *testing.T) {
				a := startAgent(t, "--kernel-mode", mode)
				pid, gt := runLaunch13Stalled(t, a, fixtures.Launch13, env, tc.n, tc.m, tc.stalled)
				n, m := gt.launches()
				p := "pid=" + strconv.Itoa(pid)
				// Every process has its memory series, here 0.
				want := values{key("profi_cuda_malloc_bytes_total", p): 0, key("profi_cuda_active_memory_bytes", p): 0}
				if mode == "anonymous" {
					maps.Copy(want, anonymousLaunches(p, n, m, gt))
				}
				requireExact(t, a, want, pid)
			})
		}
	}
}

// fullModeLaunches is what full mode exports for launch13's launches: each
// labelled with its kernel's name, timed, counted once.
func fullModeLaunches(p string, gt launch13Truth) values {
	want := values{
		key("profi_cuda_malloc_bytes_total", p): 0, key("profi_cuda_active_memory_bytes", p): 0,
		key("profi_cuda_kernel_grid_blocks_total", p):         float64(gt.GridBlocks),
		key("profi_cuda_kernel_block_threads_total", p):       float64(gt.BlockThreads),
		key("profi_cuda_kernel_shared_memory_bytes_total", p): float64(gt.SharedBytes),
	}
	for fn, c := range gt.Calls {
		op := "operation=" + fn
		want[key("profi_cuda_calls_total", op, p, "stream=default")] = float64(c)
		want[key("profi_cuda_duration_count_total", op)] = float64(c)
		want[key("profi_cuda_duration_bucket_total", op, "le=+Inf")] = float64(c)
		want[key("profi_cuda_duration_seconds", op)] = float64(c)
	}
	for raw, c := range gt.LaunchesByKernel {
		want[key("profi_cuda_kernel_launches_total", "kernel="+kernelLabel(raw), p)] = float64(c)
		want[key("profi_cuda_kernel_duration_count_total", "kernel="+kernelLabel(raw))] = float64(c)
	}
	return want
}

// In full mode each __cudaLaunchKernel launch is labelled with its
// kernel's name: through __cudaGetKernel (handle -> host stub, whose ELF
// symbol names it: nothing registers these kernels) for a process started
// under the agent; through the launch's call site (the nvcc-generated
// __device_stub_ function) for one that fetched its handles before the
// agent started.
func TestCUDA13LaunchesFullMode(t *testing.T) {
	const n, m = 300, 200
	t.Run("started-after", func(t *testing.T) {
		a := startAgent(t, "--kernel-mode", "full")
		pid, gt := runLaunch13(t, a, fixtures.Launch13, nil, n, m)
		if gt.Calls["__cudaGetKernel"] != 3 {
			t.Fatalf("launch13 ground truth %+v: want 3 __cudaGetKernel calls", gt)
		}
		requireExact(t, a, fullModeLaunches("pid="+strconv.Itoa(pid), gt), pid)
	})
	t.Run("started-before", func(t *testing.T) {
		c := startClient(t, nil, fixtures.Launch13, strconv.Itoa(n), strconv.Itoa(m), "early")
		a := startAgent(t, "--kernel-mode", "full")
		var gt launch13Truth
		pid := c.run(t, a, &gt)
		if _, ok := gt.Calls["__cudaGetKernel"]; ok || gt.Calls["__cudaLaunchKernel"] != n {
			t.Fatalf("launch13 ground truth %+v: want no __cudaGetKernel after start, %d launches", gt, n)
		}
		requireExact(t, a, fullModeLaunches("pid="+strconv.Itoa(pid), gt), pid)
	})
}
