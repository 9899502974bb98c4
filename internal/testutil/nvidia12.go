package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// NVIDIA12 names NVIDIA's CUDA 12.4 stack as scripts/fetch-nvidia.sh
// unpacks it from Debian trixie (non-free, main) and sid (contrib) into
// $PROFI_TOOLS_CACHE/nvidia/PACKAGE_VERSION/. Never copy these files into
// the repository.
type NVIDIA12 struct {
	// Cudart is libcudart.so.12.4.127 (package libcudart12); a
	// libcudart.so.12 link is next to it.
	Cudart string
	// Cuda is the driver library nvidia/current/libcuda.so.550.* (libcuda1).
	Cuda string
	// NCCL is libnccl.so.2.29.* (libnccl2, sid): its CUDA runtime is linked
	// in statically; it needs glibc 2.38, so it runs through LdSo.
	NCCL string
	// LdSo is trixie's dynamic loader (glibc 2.41, libc6); its libc is
	// beside it.
	LdSo string
	// NVCC is nvcc 12.4.131 (nvidia-cuda-toolkit) with the private
	// nvcc.profile the script writes beside it.
	NVCC string
}

// LibraryPath is an LD_LIBRARY_PATH under which libcudart.so.12,
// libcuda.so.1 and libnccl.so.2 resolve to these files.
func (n NVIDIA12) LibraryPath() string {
	return strings.Join([]string{filepath.Dir(n.Cudart), filepath.Dir(n.Cuda), filepath.Dir(n.NCCL)}, ":")
}

var nvidia12Files = []struct {
	pkg, glob string
	field     func(*NVIDIA12) *string
}{
	{"libcudart12_12.*", "usr/lib/*/libcudart.so.12.*.*", func(n *NVIDIA12) *string { return &n.Cudart }},
	{"libcuda1_550.*", "usr/lib/*/nvidia/current/libcuda.so.*.*", func(n *NVIDIA12) *string { return &n.Cuda }},
	{"libnccl2_2.29.*", "usr/lib/*/libnccl.so.2.*.*", func(n *NVIDIA12) *string { return &n.NCCL }},
	{"libc6_2.41*", "usr/lib/*/ld-linux-x86-64.so.2", func(n *NVIDIA12) *string { return &n.LdSo }},
	{"nvidia-cuda-toolkit_12.*", "usr/lib/nvidia-cuda-toolkit/bin/nvcc", func(n *NVIDIA12) *string { return &n.NVCC }},
}

// FindNVIDIA12 locates the CUDA 12.4 files fetch-nvidia.sh fetched (only
// package directories it marked complete), or says which one is missing.
func FindNVIDIA12() (NVIDIA12, error) {
	cache := testenv.ToolsCache()
	var n NVIDIA12
	for _, f := range nvidia12Files {
		dirs, _ := filepath.Glob(filepath.Join(cache, "nvidia", f.pkg))
		var found string
		for _, d := range dirs {
			if _, err := os.Stat(filepath.Join(d, ".complete")); err != nil {
				continue
			}
			if m, _ := filepath.Glob(filepath.Join(d, f.glob)); len(m) > 0 {
				found = m[len(m)-1]
			}
		}
		if found == "" {
			name, _, _ := strings.Cut(f.pkg, "_")
			return NVIDIA12{}, fmt.Errorf("NVIDIA's %s (%s) is not fetched into %s: run scripts/fetch-nvidia.sh "+
				"(sudo make test does)", name, f.pkg, filepath.Join(cache, "nvidia"))
		}
		*f.field(&n) = found
	}
	return n, nil
}

// NVIDIA12Libs returns the CUDA 12.4 stack, or skips the test when it is
// not fetched (or nvcc's host compiler g++-12 is missing), or fails it when
// PROFI_E2E=1 forbids skipping.
func NVIDIA12Libs(tb testing.TB) NVIDIA12 {
	tb.Helper()
	n, err := FindNVIDIA12()
	if err == nil {
		if _, lerr := exec.LookPath(NVCCHost); lerr != nil {
			err = fmt.Errorf("nvcc 12.4's host compiler %s: %w", NVCCHost, lerr)
		}
	}
	if err != nil {
		if os.Getenv(testenv.E2EEnv) == "1" {
			tb.Fatalf("test of NVIDIA's CUDA 12.4 cannot run (%v) and %s=1 forbids skipping", err, testenv.E2EEnv)
		}
		tb.Skipf("skipping test of NVIDIA's CUDA 12.4: %v (set %s=1 to make this a failure)", err, testenv.E2EEnv)
	}
	return n
}

// NVCCHost is the host compiler nvcc 12.4 runs (it accepts g++ up to 13;
// bookworm's g++-12).
const NVCCHost = "g++-12"

// BuildNVCC compiles src (relative to the repository root) with nvcc 12.4
// and flags into a file under dir, and returns its path.
func (n NVIDIA12) BuildNVCC(dir, src, out string, flags ...string) (string, error) {
	root, err := testenv.RepoRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, out)
	args := append([]string{"-ccbin", NVCCHost, "-o", bin}, flags...)
	cmd := exec.Command(n.NVCC, append(args, filepath.Join(root, src))...)
	cmd.Dir = dir
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("nvcc %s: %w\n%s", strings.Join(cmd.Args[1:], " "), err, b)
	}
	return bin, nil
}
