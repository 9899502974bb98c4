package attach

import (
	"debug/elf"
	"errors"
	"fmt"
	"io"
)

// Why probe past the first instruction: the kernel emulates some
// instructions under a uprobe (push, jumps, calls) and single-steps the
// rest out of line, which costs a second trap. endbr64, the first
// instruction of every function built with -fcf-protection, is
// single-stepped. When it is followed by a push the kernel emulates, the
// probe goes on the push: one trap instead of two, with the same
// registers and stack as at the symbol (docs/PROBES.md, "Probe placement").

var endbr64 = [4]byte{0xf3, 0x0f, 0x1e, 0xfa}

// prologueOffset decides, from the first bytes of a function, where to put
// its probes: 4 (past endbr64) when the next instruction is a push of a
// general register, else 0.
func prologueOffset(code []byte) uint64 {
	if len(code) < 5 || [4]byte(code[:4]) != endbr64 {
		return 0
	}
	next := code[4:]
	switch {
	case next[0] >= 0x50 && next[0] <= 0x57: // push %rax..%rdi
		return 4
	case len(next) >= 2 && next[0] == 0x41 && next[1] >= 0x50 && next[1] <= 0x57: // push %r8..%r15
		return 4
	}
	return 0
}

// funcSym is a function a shared object defines, with where to probe it.
type funcSym struct {
	offset uint64 // probe offset from the symbol (prologueOffset)
}

// definedFuncs returns the function symbols a shared object defines in
// .dynsym (the table the dynamic linker, and so every caller, uses), each
// with its probe offset read from the file's bytes. withSymtab adds those
// of .symtab (a statically linked runtime's functions are there unless the
// executable is stripped).
func definedFuncs(f io.ReaderAt, withSymtab bool) (map[string]funcSym, error) {
	var magic [4]byte
	if _, err := f.ReadAt(magic[:], 0); err != nil || string(magic[:]) != elf.ELFMAG {
		return nil, errors.New("not an ELF file")
	}
	ef, err := elf.NewFile(f)
	if err != nil {
		return nil, fmt.Errorf("parse ELF: %w", err)
	}
	syms, err := ef.DynamicSymbols()
	if err != nil && !(withSymtab && errors.Is(err, elf.ErrNoSymbols)) {
		return nil, fmt.Errorf("read dynamic symbols: %w", err)
	}
	if withSymtab {
		st, err := ef.Symbols()
		if err != nil && !errors.Is(err, elf.ErrNoSymbols) {
			return nil, fmt.Errorf("read symbols: %w", err)
		}
		syms = append(syms, st...)
	}
	out := make(map[string]funcSym, len(syms))
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) != elf.STT_FUNC || s.Section == elf.SHN_UNDEF || s.Value == 0 {
			continue
		}
		out[s.Name] = funcSym{offset: prologueOffset(codeAt(ef, f, s.Value))}
	}
	return out, nil
}

// codeAt reads the first bytes of the code at virtual address vaddr, via
// the executable PT_LOAD segment that contains it; nil if none does.
func codeAt(ef *elf.File, f io.ReaderAt, vaddr uint64) []byte {
	for _, p := range ef.Progs {
		if p.Type != elf.PT_LOAD || p.Flags&elf.PF_X == 0 || vaddr < p.Vaddr || vaddr+6 > p.Vaddr+p.Filesz {
			continue
		}
		buf := make([]byte, 6)
		if _, err := f.ReadAt(buf, int64(p.Off+(vaddr-p.Vaddr))); err != nil {
			return nil
		}
		return buf
	}
	return nil
}
