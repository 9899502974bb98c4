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
	offset uint64 // probe offset from the symbol (place)
	// placement says why offset is not 0 (Placement*); "" at the symbol.
	placement string
	// refused: the kernel refuses a uprobe at addr+offset (from the
	// file's bytes): the function is never offered to it.
	refused *refusal
}

// probeAddr is the file offset the uprobe goes on.
func (s funcSym) probeAddr() uint64 { return s.addr + s.offset }

// refusal is why a function gets no probe.
type refusal struct {
	reason string // Refused*
	code   []byte // the first bytes at the refused address, when read
	err    string // the kernel's answer, when found by trying
}

// codeShown is how many bytes of a refused instruction /status shows.
const codeShown = 8

// maxScan bounds the bytes of a function read to look for branches back
// to its start (branchesTo) before a probe moves past its first
// instruction; a longer or sizeless function keeps its refused probe.
const maxScan = 16 << 10

// place decides where to probe the function s (at file offset addr, code
// its first bytes): past an endbr64 followed by a push (prologueOffset);
// past a first instruction the kernel refuses when that instruction
// changes no register the probes read and no stack slot (movableLen), the
// next one is accepted, and no branch of the function leads back to them;
// else at the symbol, marked refused when the kernel would refuse it.
func place(ef *elfsym.File, s elfsym.Symbol, addr uint64, code []byte) funcSym {
	fs := funcSym{addr: addr}
	if off := prologueOffset(code); off != 0 {
		fs.offset, fs.placement = off, PlacementPastEndbr64
		return fs
	}
	why := refusedPrefix(code)
	if why == "" {
		return fs
	}
	if n, ok := movableLen(code); ok && len(code) >= n+maxInsn && refusedPrefix(code[n:]) == "" &&
		uint64(n) < s.Size && s.Size <= maxScan && !loopsBack(ef, s, n) {
		fs.offset, fs.placement = uint64(n), PlacementPastRefused
		return fs
	}
	fs.refused = &refusal{reason: why, code: slices.Clone(code[:min(len(code), codeShown)])}
	return fs
}

// loopsBack reads the function s (at most maxScan bytes, asked for by
// place) and reports whether a branch in it may lead to an offset in
// [0, to], or its bytes cannot be read: unsure.
func loopsBack(ef *elfsym.File, s elfsym.Symbol, to int) bool {
	body := make([]byte, 0, s.Size)
	for off := uint64(0); off < s.Size; off += elfsym.MaxCode {
		chunk, err := ef.Code(s.Value+off, int(min(s.Size-off, elfsym.MaxCode)))
		if err != nil {
			return true
		}
		body = append(body, chunk...)
	}
	return branchesTo(body, to)
}

// firstCode reads the first bytes of the function at vaddr: enough for
// two instructions, fewer near the end of its segment (nil: none).
func firstCode(ef *elfsym.File, vaddr uint64) []byte {
	for _, n := range []int{2 * 16, 16, 6} {
		if code, err := ef.Code(vaddr, n); err == nil {
			return code
		}
	}
	return nil
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
		out[name] = place(ef, s, addr, firstCode(ef, s.Value))
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
