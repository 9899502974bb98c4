package testutil

import (
	"debug/elf"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// TestFindNVIDIA: a package directory counts only when marked complete.
func TestFindNVIDIA(t *testing.T) {
	cache := t.TempDir()
	t.Setenv(testenv.ToolsCacheEnv, cache)
	files := map[string]string{
		"libcudart11.0_11.8.89~11.8.0-5~deb12u1":  "usr/lib/x86_64-linux-gnu/libcudart.so.11.8.89",
		"libcuda1_535.261.03-1":                   "usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.535.261.03",
		"libnvtoolsext1_11.8.86~11.8.0-5~deb12u1": "usr/lib/x86_64-linux-gnu/libnvToolsExt.so.1",
	}
	for pkg, f := range files {
		p := filepath.Join(cache, "nvidia", pkg, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := FindNVIDIA(); err == nil || !strings.Contains(err.Error(), "scripts/fetch-nvidia.sh") {
		t.Fatalf("FindNVIDIA without .complete markers: %v, want an error naming scripts/fetch-nvidia.sh", err)
	}
	for pkg := range files {
		if err := os.WriteFile(filepath.Join(cache, "nvidia", pkg, ".complete"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	n, err := FindNVIDIA()
	if err != nil {
		t.Fatal(err)
	}
	want := NVIDIA{
		Cudart: filepath.Join(cache, "nvidia", "libcudart11.0_11.8.89~11.8.0-5~deb12u1", files["libcudart11.0_11.8.89~11.8.0-5~deb12u1"]),
		Cuda:   filepath.Join(cache, "nvidia", "libcuda1_535.261.03-1", files["libcuda1_535.261.03-1"]),
		NVTX:   filepath.Join(cache, "nvidia", "libnvtoolsext1_11.8.86~11.8.0-5~deb12u1", files["libnvtoolsext1_11.8.86~11.8.0-5~deb12u1"]),
	}
	if n != want {
		t.Fatalf("FindNVIDIA = %+v, want %+v", n, want)
	}
}

// TestNVIDIALibs: the fetched files are NVIDIA's libraries, with the SONAMEs
// and entry points profi probes.
func TestNVIDIALibs(t *testing.T) {
	n := NVIDIALibs(t)
	for _, c := range []struct {
		path, soname, sym string
	}{
		{n.Cudart, "libcudart.so.11.0", "cudaLaunchKernel"},
		{n.Cuda, "libcuda.so.1", "cuLaunchKernel"},
		{n.NVTX, "libnvToolsExt.so.1", "nvtxRangePushA"},
	} {
		f, err := elf.Open(c.path)
		if err != nil {
			t.Fatal(err)
		}
		sonames, err := f.DynString(elf.DT_SONAME)
		if err != nil || !slices.Equal(sonames, []string{c.soname}) {
			t.Errorf("%s: SONAME %q (%v), want %s", c.path, sonames, err, c.soname)
		}
		syms, err := f.DynamicSymbols()
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(syms, func(s elf.Symbol) bool {
			return s.Name == c.sym && elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Section != elf.SHN_UNDEF
		}) {
			t.Errorf("%s exports no %s", c.path, c.sym)
		}
		f.Close()
	}
}
