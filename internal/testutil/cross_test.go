package testutil

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// The stubs and workloads build for arm64 (running them is the arm64
// VM's job): every output is an arm64 ELF file, and every probed function
// of the stubs starts with a BTI landing pad or a PAC signing (the code
// of -mbranch-protection=standard, as NVIDIA builds its arm64 libraries),
// but the locked variants (built without branch protection: their
// cudaGraphLaunch starts with a refused instruction, which cannot be a
// landing pad), where cudaGraphLaunch's first instruction is checked. (The files are not BTI-marked: Debian
// bookworm's crt objects carry no BTI property, so the link drops it.)
func TestBuildFixturesARM64(t *testing.T) {
	t.Parallel()
	fx, err := BuildFixturesFor("arm64", t.TempDir())
	if errors.Is(err, ErrNoCompiler) && os.Getenv(testenv.E2EEnv) != "1" {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	const (
		btiC    = 0xd503245f
		paciasp = 0xd503233f
		ldxr    = 0x885f7fe9 // ldxr w9, [sp]
		ldrLit  = 0x18000009 // ldr w9, <literal> (imm19 masked off)
	)
	stubs := map[string]map[string]uint32{ // nil: every function starts with bti c or paciasp; else these first words
		fx.Cudart: nil, fx.Cudart13: nil, fx.Cuda: nil, fx.Nccl: nil,
		fx.CudartLocked:        {"cudaGraphLaunch": ldxr},
		fx.CudartLockedMovable: {"cudaGraphLaunch": ldrLit},
	}
	for _, path := range fx.all() {
		if path == fx.CudartNotELF {
			continue
		}
		f, err := elf.Open(path)
		if err != nil {
			t.Errorf("%s: %v", path, err)
			continue
		}
		if f.Machine != elf.EM_AARCH64 {
			t.Errorf("%s: machine %v, want EM_AARCH64", filepath.Base(path), f.Machine)
		}
		special, isStub := stubs[path]
		if isStub {
			checkEntries(t, path, f, special)
		}
		f.Close()
	}
}

// checkEntries checks the first instruction of every exported function
// of f (bti c or paciasp), or, when special is not nil, of the functions
// it names (their words, immediates masked off).
func checkEntries(t *testing.T, path string, f *elf.File, special map[string]uint32) {
	t.Helper()
	syms, err := f.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	text := f.Section(".text")
	code, err := text.Data()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) != elf.STT_FUNC || s.Section != elf.SectionIndex(slicesIndex(f, text)) {
			continue
		}
		off := s.Value - text.Addr
		if off+4 > uint64(len(code)) {
			t.Errorf("%s: %s outside .text", path, s.Name)
			continue
		}
		w := binary.LittleEndian.Uint32(code[off:])
		n++
		if special != nil {
			want, ok := special[s.Name]
			if ok {
				delete(special, s.Name)
			}
			if ok && w&0xff00001f != want&0xff00001f {
				t.Errorf("%s: %s starts with %#08x, want %#08x", filepath.Base(path), s.Name, w, want)
			}
			continue
		}
		if w != 0xd503245f && w != 0xd503233f {
			t.Errorf("%s: %s starts with %#08x, want bti c or paciasp", filepath.Base(path), s.Name, w)
		}
	}
	for name := range special {
		t.Errorf("%s: %s not found", path, name)
	}
	if n < 10 {
		t.Errorf("%s: %d exported functions checked", path, n)
	}
}

// slicesIndex is the section index of sec in f.
func slicesIndex(f *elf.File, sec *elf.Section) int {
	for i, s := range f.Sections {
		if s == sec {
			return i
		}
	}
	return -1
}
