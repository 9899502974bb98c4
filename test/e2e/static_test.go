package e2e

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/profi-dev/profi/internal/testutil"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// layersOf returns pid's layers from /status, layer -> state.
func layersOf(a *testutil.Agent, pid int) (map[string]string, error) {
	var st struct {
		Processes []struct {
			PID    int `json:"pid"`
			Layers []struct {
				Layer string `json:"layer"`
				State string `json:"state"`
			} `json:"layers"`
		} `json:"processes"`
	}
	if err := a.Status(&st); err != nil {
		return nil, err
	}
	for _, p := range st.Processes {
		if p.PID == pid {
			out := map[string]string{}
			for _, l := range p.Layers {
				out[l.Layer] = l.State
			}
			return out, nil
		}
	}
	return nil, fmt.Errorf("pid %d not in /status processes", pid)
}

// requireLayers waits until /status and profi_system_process_layers both
// say want for pid.
func requireLayers(t *testing.T, a *testutil.Agent, pid int, want map[string]string) {
	t.Helper()
	err := testenv.Eventually(15*time.Second, func() error {
		got, err := layersOf(a, pid)
		if err != nil {
			return err
		}
		if !maps.Equal(got, want) {
			return fmt.Errorf("/status layers of pid %d: %v, want %v", pid, got, want)
		}
		mfs, err := a.Metrics()
		if err != nil {
			return err
		}
		fromMetric := map[string]string{}
		if mf := mfs["profi_system_process_layers"]; mf != nil {
			for _, m := range mf.GetMetric() {
				l := map[string]string{}
				for _, lp := range m.GetLabel() {
					l[lp.GetName()] = lp.GetValue()
				}
				if l["pid"] == strconv.Itoa(pid) && m.GetGauge().GetValue() == 1 {
					fromMetric[l["layer"]] = l["state"]
				}
			}
		}
		if !maps.Equal(fromMetric, want) {
			return fmt.Errorf("profi_system_process_layers of pid %d: %v, want %v", pid, fromMetric, want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// nvcc's default build links the CUDA runtime into the executable
// (-cudart static): no libcudart.so is mapped. Unstripped, the runtime's
// functions are in .symtab and profi probes them there: the launches count
// as CUDA 13 runtime launches, once (the driver launch below is merged),
// and the runtime layer is "static". Stripped, the runtime is invisible: the
// driver layer counts every launch as a driver launch, once, and the
// runtime layer is "blind".
func TestStaticRuntime(t *testing.T) {
	const n, m = 300, 200
	t.Run("symbols", func(t *testing.T) {
		a := startAgent(t)
		pid, gt := runLaunch13(t, a, fixtures.Launch13Static, nil, n, m)
		p := "pid=" + strconv.Itoa(pid)
		want := values{key("profi_cuda_malloc_bytes_total", p): 0, key("profi_cuda_active_memory_bytes", p): 0}
		maps.Copy(want, anonymousLaunches(p, n, m, gt))
		requireExact(t, a, want, pid)
		requireLayers(t, a, pid, map[string]string{"runtime": "static", "driver": "probed", "nccl": "absent", "nvtx": "absent"})
	})
	t.Run("stripped", func(t *testing.T) {
		a := startAgent(t)
		c := startClient(t, nil, fixtures.Launch13Stripped, strconv.Itoa(n), strconv.Itoa(m))
		// The stripped executable is a failed runtime target; wait for the driver.
		var gt launch13Truth
		pid := c.run(t, a, &gt)
		p := "pid=" + strconv.Itoa(pid)
		requireExact(t, a, values{
			key("profi_cuda_malloc_bytes_total", p): 0, key("profi_cuda_active_memory_bytes", p): 0,
			// The stub runtime launches __cudaLaunchKernel through cuLaunchKernel, _ptsz through _ptsz.
			key("profi_cuda_calls_total", "operation=cuLaunchKernel", p, "stream=default"):      float64(n),
			key("profi_cuda_calls_total", "operation=cuLaunchKernel_ptsz", p, "stream=default"): float64(m),
			key("profi_cuda_kernel_launches_total", "kernel=anonymous", p):                      float64(n + m),
			key("profi_cuda_kernel_grid_blocks_total", p):                                       float64(gt.GridBlocks),
			key("profi_cuda_kernel_block_threads_total", p):                                     float64(gt.BlockThreads),
			key("profi_cuda_kernel_shared_memory_bytes_total", p):                               float64(gt.SharedBytes),
		}, pid)
		requireLayers(t, a, pid, map[string]string{"runtime": "blind", "driver": "probed", "nccl": "absent", "nvtx": "absent"})
		var st status
		if err := a.Status(&st); err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(st.AttachFailures, func(f statusFailure) bool {
			return f.Path == fixtures.Launch13Stripped && f.Reason == "symbol_not_found" && slices.Contains(f.PIDs, pid)
		}) {
			t.Errorf("attach failures %+v: want %s, symbol_not_found", st.AttachFailures, fixtures.Launch13Stripped)
		}
	})
}
