package e2e

import (
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/profi-dev/profi/internal/testutil"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// gpuLabels is where a device of the GPU workload should land: the gpu and
// gpu_uuid labels.
type gpuLabels struct{ gpu, uuid string }

// TestGPUAttribution: threads that call cudaSetDevice with different
// ordinals, in processes started with permuted CUDA_VISIBLE_DEVICES, have
// every call counted on the physical GPU of their ordinal; the main
// thread, which sets no device, on CUDA's default device (ordinal 0); and
// each cudaFree on its allocation's GPU, not the freeing thread's. Without
// NVML, gpu is the index the visible list names and gpu_uuid the GPU-
// UUID it names (docs/INTERFACE.md 5.2; docs/METRICS.md, GPU attribution).
func TestGPUAttribution(t *testing.T) {
	a := startAgent(t, "--disable-nvml")
	bin, err := testutil.BuildGPUWorkload(fixtures, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	const uuid = "GPU-11111111-2222-3333-4444-555555555555"
	cases := []struct {
		visible  string
		ordinals string
		where    map[int]gpuLabels // ordinal → labels; -1 is the default device
	}{
		{"2,0,1", "0,1,2", map[int]gpuLabels{0: {"2", ""}, 1: {"0", ""}, 2: {"1", ""}, -1: {"2", ""}}},
		{uuid + ",3", "1,0", map[int]gpuLabels{0: {"", uuid}, 1: {"3", ""}, -1: {"", uuid}}},
	}
	type run struct {
		w     *testutil.Workload
		where map[int]gpuLabels
	}
	var runs []run
	for _, c := range cases {
		env := append(os.Environ(), "CUDA_VISIBLE_DEVICES="+c.visible)
		w := startWorkload(t, bin, []string{"--calls", "50", "--ordinals", c.ordinals}, testutil.WithEnv(env))
		runs = append(runs, run{w, c.where})
	}
	want := values{}
	var pids []int
	for _, r := range runs {
		waitAttached(t, a, r.w.PID)
		gt, err := r.w.RunGPU()
		if err != nil {
			t.Fatal(err)
		}
		pids = append(pids, r.w.PID)
		add := func(fam string, ord int, v uint64, labels ...string) {
			l := r.where[ord]
			want[key(fam, append([]string{"pid=" + strconv.Itoa(r.w.PID), "gpu=" + l.gpu, "gpu_uuid=" + l.uuid}, labels...)...)] += float64(v)
		}
		calls := "profi_cuda_calls_total"
		add(calls, -1, gt.MainMemcpy, "operation=cudaMemcpy")
		add("profi_cuda_memcpy_bytes_total", -1, 32*gt.MainMemcpy, "direction=d2d")
		for _, th := range gt.Threads {
			add(calls, th.Ordinal, th.SetDevice, "operation=cudaSetDevice")
			add(calls, th.Ordinal, th.Memcpy, "operation=cudaMemcpy")
			add("profi_cuda_memcpy_bytes_total", th.Ordinal, 32*th.Memcpy, "direction=d2d")
			add(calls, th.Ordinal, th.Launches, "operation=cudaLaunchKernel")
			add(calls, th.Ordinal, 1, "operation=cudaMalloc")
			add(calls, th.Ordinal, th.Frees, "operation=cudaFree") // freed by the main thread
			add("profi_cuda_malloc_bytes_total", th.Ordinal, th.MallocBytes)
			add("profi_cuda_active_memory_bytes", th.Ordinal, 0)
			add("profi_cuda_kernel_launches_total", th.Ordinal, th.Launches)
		}
	}
	// The main thread's default device is ordinal 0's GPU: their calls
	// share one series (one series per GPU, not per device ordinal).
	err = testenv.Eventually(15*time.Second, func() error {
		mfs, err := a.Metrics()
		if err != nil {
			return err
		}
		got := values{}
		for fam, labels := range map[string][]string{
			"profi_cuda_calls_total":           {"pid", "gpu", "gpu_uuid", "operation"},
			"profi_cuda_memcpy_bytes_total":    {"pid", "gpu", "gpu_uuid", "direction"},
			"profi_cuda_malloc_bytes_total":    {"pid", "gpu", "gpu_uuid"},
			"profi_cuda_active_memory_bytes":   {"pid", "gpu", "gpu_uuid"},
			"profi_cuda_kernel_launches_total": {"pid", "gpu", "gpu_uuid"},
		} {
			for _, s := range testutil.Samples(mfs[fam]) {
				for _, p := range pids {
					if s.Labels["pid"] == strconv.Itoa(p) {
						got[key(fam, pick(s.Labels, labels)...)] += s.Value
					}
				}
			}
		}
		if d := diff(want, got); d != "" {
			return fmt.Errorf("per-GPU series differ from ground truth:\n%s", d)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
