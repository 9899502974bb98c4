package e2e

import (
	"strconv"
	"testing"
)

// drvmemTruth is what test/workloads/drvmem.c prints.
type drvmemTruth struct {
	Calls       map[string]uint64 `json:"calls"`
	Errors      map[string]uint64 `json:"errors"`
	MemcpyBytes map[string]uint64 `json:"memcpy_bytes"`
	MemsetBytes uint64            `json:"memset_bytes"`
	MallocBytes uint64            `json:"malloc_bytes"`
	ActiveBytes uint64            `json:"active_bytes"`
}

// drvmemStreamed are the calls drvmem makes on its stream (0x5100); the
// others name none (the default stream).
var drvmemStreamed = map[string]bool{
	"cuMemAllocAsync": true, "cuMemFreeAsync": true, "cuMemcpyAsync": true, "cuMemcpyHtoDAsync_v2": true,
	"cuMemcpyDtoHAsync_v2": true, "cuMemcpyDtoDAsync_v2": true, "cuMemcpyHtoDAsync_v2_ptsz": true,
	"cuMemcpyAsync_ptsz": true, "cuMemsetD32Async": true,
}

// The driver memory API called directly (Triton, NCCL, static runtimes):
// every call counted once with its return code, bytes by direction, sets
// by element size, and active device memory across plain, async, managed
// and VMM allocations, brought back down exactly by frees and releases.
func TestDriverMemoryAPI(t *testing.T) {
	const iters = 200
	a := startAgent(t, "--probe-profile", "full")
	var gt drvmemTruth
	pid := runClient(t, a, &gt, fixtures.DrvMem, strconv.Itoa(iters))
	if len(gt.Calls) != 26 || gt.Errors["cuMemFree_v2"] != iters {
		t.Fatalf("drvmem ground truth %+v: want 26 functions, %d failed frees", gt, iters)
	}

	p := "pid=" + strconv.Itoa(pid)
	want := values{
		key("profi_cuda_malloc_bytes_total", p):  float64(gt.MallocBytes),
		key("profi_cuda_active_memory_bytes", p): float64(gt.ActiveBytes),
	}
	for fn, n := range gt.Calls {
		op := "operation=" + fn
		stream := "stream=default"
		if drvmemStreamed[fn] {
			stream = "stream=0x5100"
		}
		want[key("profi_cuda_calls_total", op, p, stream)] = float64(n)
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
	// drvmem sets 2,000 of its 9,000 bytes per iteration on its stream.
	want[key("profi_cuda_memset_bytes_total", p, "stream=0x5100")] = float64(2000 * iters)
	want[key("profi_cuda_memset_bytes_total", p, "stream=default")] = float64(gt.MemsetBytes - 2000*iters)
	requireExact(t, a, want, pid)
}
