package e2e

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/profi-dev/profi/internal/discover"
	"github.com/profi-dev/profi/internal/testutil"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// rtclientTruth is what test/workloads/rtclient.c prints.
type rtclientTruth struct {
	Calls  map[string]map[string]uint64 `json:"calls"` // function -> return code -> calls
	Ranges uint64                       `json:"ranges"`
}

// waitLibrary waits until /status lists lib (a file whose path contains
// pathPart) as attached for pid.
func waitLibrary(t *testing.T, a *testutil.Agent, pid int, lib discover.Library, pathPart string) {
	t.Helper()
	err := testenv.Eventually(15*time.Second, func() error {
		var st status
		if err := a.Status(&st); err != nil {
			return err
		}
		for _, l := range st.AttachedLibraries {
			if l.Library == string(lib) && strings.Contains(l.Path, pathPart) && slices.Contains(l.PIDs, pid) {
				return nil
			}
		}
		return fmt.Errorf("pid %d: no %s under %s attached: %+v", pid, lib, pathPart, st.AttachedLibraries)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// NVIDIA's own CUDA 11.8 runtime (stripped, versioned .dynsym, no endbr64)
// driven through its API on a machine without a GPU: every probed runtime
// function is called a known number of times and fails cleanly, with
// cudaErrorNoDevice (100) when the runtime finds NVIDIA's driver library
// (dlopened lazily at the first call, from a directory outside the default
// search path, and unloaded when initialisation fails),
// cudaErrorInsufficientDriver (35) when it does not. Each
// call is counted once, with its return code, in full mode with the full
// profile (every function timed); the launches run inside an NVTX range of
// NVIDIA's libnvToolsExt and carry its phase.
func TestNVIDIARuntime(t *testing.T) {
	nv := testutil.NVIDIALibs(t)
	const iters = 40
	for name, tc := range map[string]struct {
		env []string
		rc  string
	}{
		"with-driver":    {env: []string{"LD_LIBRARY_PATH=" + filepath.Dir(nv.Cuda)}, rc: "100"},
		"without-driver": {rc: "35"},
	} {
		t.Run(name, func(t *testing.T) {
			a := startAgent(t, "--kernel-mode", "full", "--probe-profile", "full", "--enable-nvtx-tracing")
			c := startClient(t, tc.env, fixtures.RTClient, nv.Cudart, nv.NVTX, strconv.Itoa(iters))
			waitLibrary(t, a, c.PID, discover.LibNVTX, filepath.Dir(nv.NVTX))
			var gt rtclientTruth
			pid := c.run(t, a, &gt)
			// With the driver the runtime dlopens it at its first call (100
			// says it found it); after cuInit fails it unloads it again, so
			// whether the agent attached it in that window depends on
			// timing, and no probed driver function is reached anyway.
			if len(gt.Calls) != 37 || gt.Ranges != 1 {
				t.Fatalf("rtclient ground truth %+v: want the 37 runtime functions CUDA 11.8 exports, 1 range", gt)
			}
			p := "pid=" + strconv.Itoa(pid)
			want := values{key("profi_cuda_malloc_bytes_total", p): 0, key("profi_cuda_active_memory_bytes", p): 0}
			var launches uint64
			for fn, rcs := range gt.Calls {
				c, ok := countedFuncs[fn]
				if !ok {
					t.Fatalf("rtclient called %s, which countedFuncs lacks", fn)
				}
				op := "operation=" + c.label
				for rc, n := range rcs {
					if rc != tc.rc {
						t.Fatalf("%s returned %s %d times, want only %s", fn, rc, n, tc.rc)
					}
					want[key("profi_cuda_calls_total", op, p, "stream=default")] += float64(n)
					want[key("profi_cuda_errors_total", op, p, "error_code="+rc)] += float64(n)
					want[key("profi_cuda_duration_count_total", op)] += float64(n)
					want[key("profi_cuda_duration_bucket_total", op, "le=+Inf")] += float64(n)
					want[key("profi_cuda_duration_seconds", op)] += float64(n)
					if c.launch {
						launches += n
					}
				}
			}
			// Full mode counts a launch call whatever it returned (as
			// anonymous mode, which sees no return code, must): 64-thread
			// blocks, grids of 2, no shared memory, inside "decode".
			k := "kernel=" + kernelLabel("_Z12rtclient_nopv")
			want[key("profi_cuda_kernel_launches_total", k, p)] = float64(launches)
			want[key("profi_cuda_kernel_duration_count_total", k)] = float64(launches)
			want[key("profi_cuda_kernel_grid_blocks_total", p)] = float64(2 * launches)
			want[key("profi_cuda_kernel_block_threads_total", p)] = float64(64 * launches)
			want[key("profi_cuda_kernel_shared_memory_bytes_total", p)] = 0
			requireExact(t, a, want, pid)
			if got, _, err := launchesByPhase(t, a, pid); err != nil || len(got) != 1 || got["decode"] != launches {
				t.Errorf("launches by phase %v (%v), want all %d in decode", got, err, launches)
			}
		})
	}
}
