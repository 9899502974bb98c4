package testutil

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// NVIDIA names NVIDIA's own released libraries, as scripts/fetch-nvidia.sh
// unpacks them from Debian bookworm's non-free packages into
// $PROFI_TOOLS_CACHE (default /var/cache/profi-tools)/nvidia/PACKAGE_VERSION/.
// They run without a GPU: every CUDA call fails cleanly (no device). Never
// copy them into the repository: NVIDIA's licence allows running them only.
type NVIDIA struct {
	// Cudart is the CUDA 11.8 runtime, libcudart.so.11.8.89 (SONAME
	// libcudart.so.11.0, a symlink next to it), package libcudart11.0.
	Cudart string
	// Cuda is the driver library, nvidia/current/libcuda.so.535.* (SONAME
	// libcuda.so.1, a symlink next to it), package libcuda1.
	Cuda string
	// NVTX is libnvToolsExt.so.1 (a symlink to libnvToolsExt.so.1.0.0),
	// package libnvtoolsext1.
	NVTX string
}

// LibraryPath is an LD_LIBRARY_PATH value under which libcudart.so.11.0,
// libcuda.so.1 and libnvToolsExt.so.1 resolve to these files (the runtime
// dlopens libcuda.so.1 through the default search path).
func (n NVIDIA) LibraryPath() string {
	return strings.Join([]string{filepath.Dir(n.Cudart), filepath.Dir(n.Cuda), filepath.Dir(n.NVTX)}, ":")
}

// The packages fetch-nvidia.sh unpacks (PACKAGE_VERSIONPREFIX: libcuda1 is
// there twice, 535 and 550) and the file each provides, as a glob under the
// package's directory.
var nvidiaFiles = []struct {
	pkg, glob string
	field     func(*NVIDIA) *string
}{
	{"libcudart11.0_11", "usr/lib/*/libcudart.so.11.*.*", func(n *NVIDIA) *string { return &n.Cudart }},
	{"libcuda1_535", "usr/lib/*/nvidia/current/libcuda.so.*.*", func(n *NVIDIA) *string { return &n.Cuda }},
	{"libnvtoolsext1_11", "usr/lib/*/libnvToolsExt.so.1", func(n *NVIDIA) *string { return &n.NVTX }},
}

// FindNVIDIA locates the libraries that scripts/fetch-nvidia.sh fetched, or
// says which one is missing. A package directory counts only once the
// script has marked it complete (.complete), so a half-unpacked one is not
// used.
func FindNVIDIA() (NVIDIA, error) {
	cache := testenv.ToolsCache()
	var n NVIDIA
	for _, f := range nvidiaFiles {
		dirs, _ := filepath.Glob(filepath.Join(cache, "nvidia", f.pkg+".*"))
		var found string
		for _, d := range dirs { // sorted: the last complete match wins
			if _, err := os.Stat(filepath.Join(d, ".complete")); err != nil {
				continue
			}
			if m, _ := filepath.Glob(filepath.Join(d, f.glob)); len(m) > 0 {
				found = m[len(m)-1]
			}
		}
		if found == "" {
			return NVIDIA{}, fmt.Errorf("NVIDIA's %s is not fetched into %s: run scripts/fetch-nvidia.sh "+
				"(sudo make test does)", f.pkg, filepath.Join(cache, "nvidia"))
		}
		*f.field(&n) = found
	}
	return n, nil
}

// NVIDIALibs returns NVIDIA's libraries, or skips the test when they are
// not fetched, or fails it when PROFI_E2E=1 forbids skipping.
func NVIDIALibs(tb testing.TB) NVIDIA {
	tb.Helper()
	n, err := FindNVIDIA()
	if err != nil {
		if os.Getenv(testenv.E2EEnv) == "1" {
			tb.Fatalf("test of NVIDIA's libraries cannot run (%v) and %s=1 forbids skipping", err, testenv.E2EEnv)
		}
		tb.Skipf("skipping test of NVIDIA's libraries: %v (set %s=1 to make this a failure)", err, testenv.E2EEnv)
	}
	return n
}
