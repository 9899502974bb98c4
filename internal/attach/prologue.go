package attach

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"slices"

	"github.com/profi-dev/profi/internal/discover"
	"github.com/profi-dev/profi/internal/elfsym"
	"github.com/profi-dev/profi/internal/ops"
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
	addr   uint64 // file offset of the symbol: the uprobe address given to cilium/ebpf
	offset uint64 // probe offset from the symbol (prologueOffset)
}

// probedSymbols are the symbols any probe of lib may need: the global
// mode's and, for full-mode upgrades of single processes (reattach with
// the symbols read at attach), full mode's.
func probedSymbols(lib discover.Library, mode, profile string) []string {
	var names []string
	for _, m := range []string{mode, ops.KernelModeFull} {
		for _, p := range ops.Probes(lib, m, profile) {
			if !slices.Contains(names, p.Symbol) {
				names = append(names, p.Symbol)
			}
		}
	}
	return names
}

// definedFuncs returns which of names the shared object f defines as
// functions in .dynsym (the table the dynamic linker, and so every
// caller, uses), each with its file offset and its probe offset read from
// the file's bytes. Files are tenant-controlled: internal/elfsym bounds
// every read and allocation (issue 17), and only the probed names are
// looked up. withSymtab adds those of .symtab (a statically linked
// runtime's functions are there unless the executable is stripped), where
// .dynsym lacks them. A panic is returned as an error, never raised.
func definedFuncs(f *os.File, names []string, withSymtab bool) (out map[string]funcSym, err error) {
	defer func() {
		if p := recover(); p != nil {
			out, err = nil, fmt.Errorf("parse ELF: parser panicked: %v", p)
		}
	}()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat: %w", err)
	}
	ef, err := elfsym.Open(f, st.Size())
	if errors.Is(err, elfsym.ErrNotELF) {
		return nil, errors.New("not an ELF file")
	}
	if err != nil {
		return nil, fmt.Errorf("parse ELF: %w", err)
	}
	found, err := ef.Lookup(names)
	if err != nil && !(withSymtab && errors.Is(err, elfsym.ErrNoSymbols)) {
		return nil, fmt.Errorf("read dynamic symbols: %w", err)
	}
	if found == nil {
		found = map[string]elfsym.Symbol{}
	}
	if withSymtab {
		if err := staticFuncs(ef, names, found); err != nil {
			return nil, fmt.Errorf("read symbols: %w", err)
		}
	}
	out = make(map[string]funcSym, len(found))
	for name, s := range found {
		addr, ok := ef.Offset(s.Value)
		if !ok {
			continue // not in the file's code: nothing to probe
		}
		code, _ := ef.Code(s.Value, 6) // nil near the segment's end: no skip
		out[name] = funcSym{addr: addr, offset: prologueOffset(code)}
	}
	return out, nil
}

// maxStaticMatches bounds the .symtab entries kept while looking for the
// probed names: local functions of one name in several objects repeat it.
const maxStaticMatches = 4096

// staticFuncs adds to found the .symtab definitions of the names .dynsym
// lacks, a global one over a local one of the same name.
func staticFuncs(ef *elfsym.File, names []string, found map[string]elfsym.Symbol) error {
	want := map[string]bool{}
	for _, n := range names {
		if _, ok := found[n]; !ok {
			want[n] = true
		}
	}
	if len(want) == 0 {
		return nil
	}
	syms, _, err := ef.Funcs(elfsym.SymTab, maxStaticMatches, func(name []byte) bool { return want[string(name)] })
	if err != nil && !errors.Is(err, elfsym.ErrNoSymbols) && !errors.Is(err, elfsym.ErrLimit) {
		return err
	}
	for _, s := range syms { // with ErrLimit: the first maxStaticMatches, still usable
		if prev, ok := found[s.Name]; !ok || prev.Bind == elf.STB_LOCAL && s.Bind != elf.STB_LOCAL {
			found[s.Name] = s
		}
	}
	return nil
}
