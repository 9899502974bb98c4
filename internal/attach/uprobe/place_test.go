package uprobe

import (
	"debug/elf"
	"os"
	"testing"

	"github.com/profi-dev/profi/internal/discover"
	"github.com/profi-dev/profi/internal/ops"
)

// The offsets come from the library file's own bytes: 4 for every probed
// function of the CET build (endbr64; push %rbp), 0 for the plain build
// (push %rbp first).
func TestDefinedFuncsOffsets(t *testing.T) {
	t.Parallel()
	fx := fixtures(t)
	for path, want := range map[string]uint64{fx.Cudart: 0, fx.CudartCET: 4} {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		syms, err := DefinedFuncs(f, probedNames("libcudart.so"), false, elf.EM_X86_64)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ops.Probes("libcudart.so", ops.KernelModeFull, ops.ProfileFull) {
			s, ok := syms[p.Symbol]
			if !ok && ops.Info(p.Op).Since == "CUDA 13.0" {
				continue // the CUDA 12 stub lacks CUDA 13's entry points
			}
			if !ok {
				t.Errorf("%s: %s not defined", path, p.Symbol)
				continue
			}
			if s.Offset != want {
				t.Errorf("%s: %s probe offset %d, want %d", path, p.Symbol, s.Offset, want)
			}
		}
	}
}

// probedNames are the symbols of every probe of lib in full mode and profile.
func probedNames(lib discover.Library) []string {
	var names []string
	for _, p := range ops.Probes(lib, ops.KernelModeFull, ops.ProfileFull) {
		names = append(names, p.Symbol)
	}
	return names
}
