package ops

import (
	"debug/elf"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/profi-dev/profi/internal/discover"
	"github.com/profi-dev/profi/internal/testutil"
)

// The table against NVIDIA's own files (Debian's libcudart 11.8.89,
// libcuda 535.261.03, libnvToolsExt 11.8): every row of their library is
// exported there, except the ones listed here with the release that added
// them. A misspelt symbol or a wrong library fails.
func TestTableAgainstNVIDIA(t *testing.T) {
	t.Parallel()
	n := testutil.NVIDIALibs(t)
	absent := map[discover.Library][]string{
		// CUDA 13, 13, 13, 12.0, 12.3
		rt:   {"__cudaGetKernel", "__cudaLaunchKernel", "__cudaLaunchKernel_ptsz", "cudaGraphInstantiateWithParams", "cudaStreamBeginCaptureToGraph"},
		drv:  {"cuStreamBeginCaptureToGraph"}, // CUDA 12.3 (r545)
		nvtx: nil,
	}
	for lib, path := range map[discover.Library]string{rt: n.Cudart, drv: n.Cuda, nvtx: n.NVTX} {
		f, err := elf.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		syms, err := f.DynamicSymbols()
		_ = f.Close()
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		defined := map[string]bool{}
		for _, s := range syms {
			if s.Section != elf.SHN_UNDEF && elf.ST_TYPE(s.Info) == elf.STT_FUNC {
				defined[strings.Split(s.Name, "@")[0]] = true // versioned names: cudaMalloc@@libcudart.so.11.0
			}
		}
		missing := map[string]bool{}
		for _, r := range Table {
			if r.Lib == lib && !defined[r.Symbol] {
				missing[r.Symbol] = true
			}
		}
		if got := slices.Sorted(maps.Keys(missing)); !slices.Equal(got, absent[lib]) {
			t.Errorf("%s: rows not exported by %s: %q, want %q", lib, path, got, absent[lib])
		}
	}
}

// The same against NVIDIA's CUDA 12.4 stack from Debian trixie/sid
// (libcudart 12.4.127, libcuda 550.163.01, NCCL 2.29.7, whose ncclX are weak
// aliases of pncclX: both are exported).
func TestTableAgainstNVIDIA12(t *testing.T) {
	t.Parallel()
	n := testutil.NVIDIA12Libs(t)
	// Every row is exported there, CUDA 13's __cudaGetKernel and
	// __cudaLaunchKernel[_ptsz] included (12.4 has them).
	for lib, path := range map[discover.Library]string{rt: n.Cudart, drv: n.Cuda, nccl: n.NCCL} {
		if got := notExported(t, lib, path); len(got) > 0 {
			t.Errorf("%s: rows not exported by %s: %q, want none", lib, path, got)
		}
	}
}

// notExported lists the rows of lib that path does not export as a
// function, sorted.
func notExported(t *testing.T, lib discover.Library, path string) []string {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	syms, err := f.DynamicSymbols()
	_ = f.Close()
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	defined := map[string]bool{}
	for _, s := range syms {
		if s.Section != elf.SHN_UNDEF && elf.ST_TYPE(s.Info) == elf.STT_FUNC {
			defined[strings.Split(s.Name, "@")[0]] = true
		}
	}
	missing := map[string]bool{}
	for _, r := range Table {
		if r.Lib == lib && !defined[r.Symbol] {
			missing[r.Symbol] = true
		}
	}
	return slices.Sorted(maps.Keys(missing))
}
