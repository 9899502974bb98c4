package attach

import (
	"os"
	"testing"

	"github.com/profi-dev/profi/internal/ops"
)

func TestPrologueOffset(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		code []byte
		want uint64
	}{
		{"endbr64; push %rbp", []byte{0xf3, 0x0f, 0x1e, 0xfa, 0x55, 0x48}, 4},
		{"endbr64; push %rbx", []byte{0xf3, 0x0f, 0x1e, 0xfa, 0x53, 0x48}, 4},
		{"endbr64; push %r12", []byte{0xf3, 0x0f, 0x1e, 0xfa, 0x41, 0x54}, 4},
		{"endbr64; push %r15", []byte{0xf3, 0x0f, 0x1e, 0xfa, 0x41, 0x57}, 4},
		{"endbr64; mov (single-stepped anyway)", []byte{0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x89}, 0},
		{"endbr64; rex.B but not a push", []byte{0xf3, 0x0f, 0x1e, 0xfa, 0x41, 0x89}, 0},
		{"endbr64 at the end of the bytes", []byte{0xf3, 0x0f, 0x1e, 0xfa}, 0},
		{"push %rbp first (already one trap)", []byte{0x55, 0x48, 0x89, 0xe5, 0, 0}, 0},
		{"endbr32 is not endbr64", []byte{0xf3, 0x0f, 0x1e, 0xfb, 0x55, 0}, 0},
		{"nothing", nil, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := prologueOffset(tc.code); got != tc.want {
				t.Errorf("prologueOffset(% x) = %d, want %d", tc.code, got, tc.want)
			}
		})
	}
}

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
		syms, err := definedFuncs(f, probedSymbols("libcudart.so", ops.KernelModeFull, ops.ProfileFull), false)
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
			if s.offset != want {
				t.Errorf("%s: %s probe offset %d, want %d", path, p.Symbol, s.offset, want)
			}
		}
	}
}
