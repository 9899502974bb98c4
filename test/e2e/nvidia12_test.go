package e2e

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/profi-dev/profi/internal/testutil"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// nvccTruth is what test/nvcc/client.cu prints.
type nvccTruth struct {
	Calls        map[string]map[string]uint64 `json:"calls"` // function -> return code -> calls
	Launches     uint64                       `json:"launches"`
	LaunchSymbol string                       `json:"launch_symbol"`
}

// nvccBuilds are the clients test/nvcc/client.cu is built as, by nvcc
// 12.4: the runtime linked shared (nvcc 12.4's legacy launch sequence,
// cudaLaunchKernel), statically (nvcc's default: cudaLaunchKernel a local
// .symtab symbol of the executable), with the per-thread default stream
// (_ptds/_ptsz), and the new sequence (__cudaGetKernel once, then
// __cudaLaunchKernel, which tail-jumps into cudaLaunchKernel in NVIDIA's
// runtime).
var nvccBuilds = []struct {
	name  string
	flags []string
	// static: the runtime is in the executable.
	static bool
}{
	{"shared", []string{"-cudart", "shared"}, false},
	{"static", nil, true},
	{"per-thread", []string{"-cudart", "shared", "--default-stream", "per-thread"}, false},
	{"new-sequence", []string{"-cudart", "shared", "-Xcompiler", "-U__NV_LEGACY_LAUNCH"}, false},
}

// Clients built by NVIDIA's nvcc 12.4 at test time, run against NVIDIA's
// runtime 12.4.127 and driver library 550.163.01 on a machine without a
// GPU: every call returns 100 (no device) and the launch entry points are
// still called. Every call, return code and launch attempt is counted
// exactly, in anonymous mode (lean profile) and in full mode (full
// profile; the kernel named from the real fatbin registration). Stalled:
// the static client (the runtime in the executable) and the new sequence
// stopped at random points between their probes, minStalls times.
func TestNVIDIA12Clients(t *testing.T) {
	nv := testutil.NVIDIA12Libs(t)
	dir := t.TempDir()
	const iters = 30
	for _, b := range nvccBuilds {
		bin, err := nv.BuildNVCC(dir, "test/nvcc/client.cu", b.name, b.flags...)
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			m       mode
			stalled bool
		}{{defaultMode, false}, {mode{"full", "full"}, false}, {defaultMode, true}} {
			if tc.stalled && !b.static && b.name != "new-sequence" {
				continue
			}
			name := b.name + "/" + tc.m.kernel
			if tc.stalled {
				name += "/stalled"
			}
			t.Run(name, func(t *testing.T) {
				n := iters
				if tc.stalled {
					n = 2000
				}
				a := startAgent(t, "--kernel-mode", tc.m.kernel, "--probe-profile", tc.m.profile)
				env := []string{"LD_LIBRARY_PATH=" + filepath.Dir(nv.Cuda) + ":" + filepath.Dir(nv.Cudart)}
				var gt nvccTruth
				pid := startClient(t, env, bin, strconv.Itoa(n)).runStalled(t, a, &gt, tc.stalled)
				// Stalled, it makes at least n iterations.
				if (gt.Launches != uint64(n) && !tc.stalled) || gt.Launches < uint64(n) || len(gt.Calls) != 5 {
					t.Fatalf("%s ground truth %+v: want %d launches, 5 functions", b.name, gt, n)
				}
				if gt.Launches != uint64(n) {
					t.Logf("%s made %d iterations (at least %d asked)", b.name, gt.Launches, n)
				}
				requireExact(t, a, nvccExpected(t, tc.m, gt, pid), pid)
				// The 550 driver library stays mapped after cuInit fails.
				rtState := "probed"
				if b.static {
					rtState = "static"
				}
				requireLayers(t, a, pid, map[string]string{"runtime": rtState, "driver": "probed", "nccl": "absent", "nvtx": "absent"})
			})
		}
	}
}

// nvccExpected is what mode m exports for a client's ground truth.
func nvccExpected(t *testing.T, m mode, gt nvccTruth, pid int) values {
	t.Helper()
	p := "pid=" + strconv.Itoa(pid)
	want := values{key("profi_cuda_malloc_bytes_total", p): 0, key("profi_cuda_active_memory_bytes", p): 0}
	calls := gt.Calls
	if m.kernel == "full" && gt.LaunchSymbol[:2] == "__" {
		// The new sequence's name source: once, it returns 0 (CUDA 12.4's
		// handle is the host stub).
		calls["__cudaGetKernel"] = map[string]uint64{"0": 1}
	}
	probed := m.probed()
	for fn, rcs := range calls {
		pr, ok := probed[fn]
		if !ok {
			if _, known := countedFuncs[fn]; !known {
				t.Fatalf("client called %s, which countedFuncs lacks", fn)
			}
			continue // not probed in this mode
		}
		op := "operation=" + pr.label
		for rc, n := range rcs {
			want[key("profi_cuda_calls_total", op, p, "stream=default")] += float64(n)
			if !pr.timed {
				continue
			}
			if rc != "0" {
				want[key("profi_cuda_errors_total", op, p, "error_code="+rc)] += float64(n)
			}
			want[key("profi_cuda_duration_count_total", op)] += float64(n)
			want[key("profi_cuda_duration_bucket_total", op, "le=+Inf")] += float64(n)
			want[key("profi_cuda_duration_seconds", op)] += float64(n)
		}
	}
	k := "kernel=anonymous"
	if m.kernel == "full" {
		k = "kernel=" + kernelLabel("_Z8nvcc_nopPi")
		want[key("profi_cuda_kernel_duration_count_total", k)] = float64(gt.Launches)
	}
	want[key("profi_cuda_kernel_launches_total", k, p)] = float64(gt.Launches)
	want[key("profi_cuda_kernel_grid_blocks_total", p)] = float64(2 * gt.Launches)
	want[key("profi_cuda_kernel_block_threads_total", p)] = float64(64 * gt.Launches)
	want[key("profi_cuda_kernel_shared_memory_bytes_total", p)] = 0
	return want
}

// NVIDIA's NCCL 2.29.7 (Debian's build: endbr64 at every export, ncclX weak
// aliases of pncclX at the same address, the CUDA runtime linked in
// statically) run through trixie's loader (it needs glibc 2.38) with the
// 550 driver library, without a GPU: every probed call and return code is
// counted once (one probe per address, not one per alias): group start 0,
// the collective on a NULL communicator 4, group end 4 (the group's
// error), ncclCommInitRank 1 (unhandled CUDA error, no communicator).
func TestNVIDIANCCL(t *testing.T) {
	nv := testutil.NVIDIA12Libs(t)
	bin := filepath.Join(t.TempDir(), "ncclclient")
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if b, err := exec.Command("cc", "-O1", "-o", bin, filepath.Join(root, "test/nvcc/ncclclient.c"), "-ldl").CombinedOutput(); err != nil {
		t.Fatalf("cc ncclclient: %v\n%s", err, b)
	}
	const iters = 200
	a := startAgent(t)
	libPath := strings.Join([]string{filepath.Dir(nv.LdSo), filepath.Dir(nv.Cuda), "/usr/lib/x86_64-linux-gnu"}, ":")
	c := startClient(t, nil, nv.LdSo, "--library-path", libPath, bin, nv.NCCL, strconv.Itoa(iters))
	var gt struct {
		Calls map[string]map[string]uint64 `json:"calls"`
	}
	pid := c.run(t, a, &gt)
	want := values{}
	p := "pid=" + strconv.Itoa(pid)
	for _, op := range ncclProbed {
		for rc, n := range gt.Calls[op] {
			want[key("profi_nccl_calls_total", "operation="+op, p)] += float64(n)
			if op != "ncclGroupStart" {
				want[key("profi_nccl_duration_count_total", "operation="+op)] += float64(n)
			}
			if rc != "0" {
				want[key("profi_cuda_errors_total", "operation="+op, p, "error_code="+rc)] += float64(n)
			}
		}
	}
	if gt.Calls["ncclAllReduce"]["4"] != iters || gt.Calls["ncclCommInitRank"]["1"] != 1 {
		t.Fatalf("ncclclient ground truth %+v: want %d collectives returning 4, ncclCommInitRank 1", gt, iters)
	}
	// A collective's bytes are counted at entry, failed or not.
	want[key("profi_nccl_bytes_total", "operation=ncclAllReduce", p)] = float64(iters * 1024 * 4)
	err = testenv.Eventually(10*time.Second, func() error {
		mfs, err := a.Metrics()
		if err != nil {
			return err
		}
		if d := diff(want, ncclObserved(mfs, []int{pid})); d != "" {
			return fmt.Errorf("NCCL metrics differ from the ground truth:\n%s", d)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// NCCL's runtime is linked into libnccl.so.2: the runtime layer is
	// blind and says so (attach.Layers); the driver stays mapped after
	// cuInit fails (docs/REAL-CUDA.md) and is probed.
	requireLayers(t, a, pid, map[string]string{"runtime": "blind", "driver": "probed", "nccl": "probed", "nvtx": "absent"})
}
