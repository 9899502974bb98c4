package e2e

import (
	"bufio"
	"encoding/json"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/profi-dev/profi/internal/testutil"
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

// runClient starts one of the small ground-truth clients
// (test/workloads/launch13.c, drvmem.c): it prints "ready PID", waits until
// the agent has attached, is told "go", and prints its ground truth as one
// JSON line, decoded into truth. It returns the client's pid.
func runClient(t *testing.T, a *testutil.Agent, truth any, bin string, args ...string) int {
	t.Helper()
	cmd := exec.Command(bin, args...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stdin.Close(); _ = cmd.Wait() })
	r := bufio.NewReader(stdout)
	if line, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(line, "ready ") {
		t.Fatalf("%s: %q, %v", bin, line, err)
	}
	pid := cmd.Process.Pid
	waitAttached(t, a, pid)
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	line, err := r.ReadString('\n')
	if err != nil {
		t.Fatalf("%s output: %v", bin, err)
	}
	if err := json.Unmarshal([]byte(line), truth); err != nil {
		t.Fatalf("%s output %q: %v", bin, line, err)
	}
	return pid
}

// runLaunch13 runs the CUDA 13-style launcher: n __cudaLaunchKernel and m
// __cudaLaunchKernel_ptsz launches.
func runLaunch13(t *testing.T, a *testutil.Agent, n, m int) (int, launch13Truth) {
	t.Helper()
	var gt launch13Truth
	pid := runClient(t, a, &gt, fixtures.Launch13, strconv.Itoa(n), strconv.Itoa(m))
	return pid, gt
}

// Code built by nvcc 13 launches through __cudaGetKernel and
// __cudaLaunchKernel[_ptsz], never cudaLaunchKernel: each launch is counted
// once (the driver launch the runtime makes below it is merged), with its
// geometry, in anonymous mode; kernel mode off counts none.
func TestCUDA13Launches(t *testing.T) {
	const n, m = 300, 200
	for _, mode := range []string{"anonymous", "off"} {
		t.Run(mode, func(t *testing.T) {
			a := startAgent(t, "--kernel-mode", mode)
			pid, gt := runLaunch13(t, a, n, m)
			if gt.Calls["__cudaLaunchKernel"] != n || gt.Calls["__cudaLaunchKernel_ptsz"] != m {
				t.Fatalf("launch13 ground truth %+v, want %d and %d launches", gt, n, m)
			}
			p := "pid=" + strconv.Itoa(pid)
			// Every process has its memory series, here 0.
			want := values{key("profi_cuda_malloc_bytes_total", p): 0, key("profi_cuda_active_memory_bytes", p): 0}
			if mode == "anonymous" {
				for k, v := range (values{
					key("profi_cuda_calls_total", "operation=__cudaLaunchKernel", p, "stream=default"):      float64(n),
					key("profi_cuda_calls_total", "operation=__cudaLaunchKernel_ptsz", p, "stream=default"): float64(m),
					key("profi_cuda_kernel_launches_total", "kernel=anonymous", p):                          float64(n + m),
					key("profi_cuda_kernel_grid_blocks_total", p):                                           float64(gt.GridBlocks),
					key("profi_cuda_kernel_block_threads_total", p):                                         float64(gt.BlockThreads),
					key("profi_cuda_kernel_shared_memory_bytes_total", p):                                   float64(gt.SharedBytes),
				}) {
					want[k] = v
				}
			}
			requireExact(t, a, want, pid)
		})
	}
}

// In full mode __cudaGetKernel is a name source: each launch of a handle
// is labelled with its kernel's name (here the host stub's ELF symbol:
// nothing registers these kernels), timed, and counted once.
func TestCUDA13LaunchesFullMode(t *testing.T) {
	const n, m = 300, 200
	a := startAgent(t, "--kernel-mode", "full")
	pid, gt := runLaunch13(t, a, n, m)
	p := "pid=" + strconv.Itoa(pid)
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
	requireExact(t, a, want, pid)
}
