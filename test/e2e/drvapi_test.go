package e2e

import (
	"strconv"
	"testing"
)

// drvapiTruth is what test/workloads/drvapi.c prints.
type drvapiTruth struct {
	Calls       map[string]uint64 `json:"calls"`
	Errors      map[string]uint64 `json:"errors"`
	MemcpyBytes map[string]uint64 `json:"memcpy_bytes"`
	MemsetBytes uint64            `json:"memset_bytes"`
	// The part of MemsetBytes set on drvapi's stream.
	StreamMemsetBytes uint64 `json:"stream_memset_bytes"`
	MallocBytes       uint64 `json:"malloc_bytes"`
	ActiveBytes       uint64 `json:"active_bytes"`
	// Kernel launches (cuGraphLaunch[_ptsz] not included) and their geometry.
	KernelLaunches uint64 `json:"kernel_launches"`
	GridBlocks     uint64 `json:"grid_blocks"`
	BlockThreads   uint64 `json:"block_threads"`
	SharedBytes    uint64 `json:"shared_bytes"`
}

// drvapiStreamed are the calls drvapi makes on its stream (0x5100); the
// others name none (the default stream).
var drvapiStreamed = map[string]bool{
	"cuMemAllocAsync": true, "cuMemFreeAsync": true, "cuMemcpyAsync": true, "cuMemcpyHtoDAsync_v2": true,
	"cuMemcpyDtoHAsync_v2": true, "cuMemcpyDtoDAsync_v2": true, "cuMemcpyHtoDAsync_v2_ptsz": true,
	"cuMemcpyAsync_ptsz": true, "cuMemsetD32Async": true, "cuMemsetD2D32Async": true,
	"cuMemcpy2DAsync_v2": true, "cuMemcpy3DAsync_v2": true, "cuMemcpy3DPeerAsync": true,
	"cuMemAllocFromPoolAsync": true,
	"cuLaunchKernel":          true, "cuLaunchKernel_ptsz": true, "cuLaunchKernelEx": true, "cuLaunchKernelEx_ptsz": true,
	"cuLaunchCooperativeKernel": true, "cuLaunchCooperativeKernel_ptsz": true, "cuGraphLaunch": true,
	"cuGraphLaunch_ptsz": true,
}

// drvapiLaunches are drvapi's kernel launch functions: counted at entry
// (anonymous mode), so no latency.
var drvapiLaunches = map[string]bool{
	"cuLaunchKernel": true, "cuLaunchKernel_ptsz": true, "cuLaunchKernelEx": true, "cuLaunchKernelEx_ptsz": true,
	"cuLaunchCooperativeKernel": true, "cuLaunchCooperativeKernel_ptsz": true,
}

// The driver API called directly (Triton, NCCL, static runtimes): every
// memory call counted once with its return code, bytes by direction, sets
// by element size, and active device memory across plain, async, managed
// and VMM allocations, brought back down exactly by frees and releases;
// every launch entry point and its _ptsz variant counted once with its
// geometry, graph launches timed.
func TestDriverAPI(t *testing.T) {
	const iters, launches = 200, 300
	a := startAgent(t, "--probe-profile", "full")
	var gt drvapiTruth
	pid := runClient(t, a, &gt, fixtures.DrvAPI, strconv.Itoa(iters), strconv.Itoa(launches))
	if len(gt.Calls) != 47 || gt.Errors["cuMemFree_v2"] != iters || gt.Errors["cuMemcpy3DPeer"] != iters/10 ||
		gt.Errors["cuMemAllocPitch_v2"] != iters/10 || gt.KernelLaunches != 6*launches {
		t.Fatalf("drvapi ground truth %+v: want 47 functions, %d failed frees, %d failed 3D peer copies and pitched allocations, %d launches",
			gt, iters, iters/10, 6*launches)
	}

	p := "pid=" + strconv.Itoa(pid)
	want := values{
		key("profi_cuda_malloc_bytes_total", p):  float64(gt.MallocBytes),
		key("profi_cuda_active_memory_bytes", p): float64(gt.ActiveBytes),
	}
	want[key("profi_cuda_kernel_launches_total", "kernel=anonymous", p)] = float64(gt.KernelLaunches)
	want[key("profi_cuda_kernel_grid_blocks_total", p)] = float64(gt.GridBlocks)
	want[key("profi_cuda_kernel_block_threads_total", p)] = float64(gt.BlockThreads)
	want[key("profi_cuda_kernel_shared_memory_bytes_total", p)] = float64(gt.SharedBytes)
	for fn, n := range gt.Calls {
		op := "operation=" + fn
		stream := "stream=default"
		if drvapiStreamed[fn] {
			stream = "stream=0x5100"
		}
		want[key("profi_cuda_calls_total", op, p, stream)] = float64(n)
		if drvapiLaunches[fn] {
			continue
		}
		want[key("profi_cuda_duration_count_total", op)] = float64(n)
		want[key("profi_cuda_duration_bucket_total", op, "le=+Inf")] = float64(n)
		want[key("profi_cuda_duration_seconds", op)] = float64(n)
	}
	for fn, n := range gt.Errors {
		want[key("profi_cuda_errors_total", "operation="+fn, p, "error_code=1")] = float64(n)
	}
	for dir, n := range gt.MemcpyBytes {
		want[key("profi_cuda_memcpy_bytes_total", "direction="+dir, p)] = float64(n)
	}
	// cuMemsetD32Async and cuMemsetD2D32Async set on drvapi's stream.
	want[key("profi_cuda_memset_bytes_total", p, "stream=0x5100")] = float64(gt.StreamMemsetBytes)
	want[key("profi_cuda_memset_bytes_total", p, "stream=default")] = float64(gt.MemsetBytes - gt.StreamMemsetBytes)
	requireExact(t, a, want, pid)
}
