package uprobe

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"runtime"

	"github.com/profi-dev/profi/internal/elfsym"
	"github.com/profi-dev/profi/internal/status"
)

// Where a probe goes is decided from the file's own bytes, by the
// decoder of the file's ELF machine (x86.go, arm64.go): the kernel of
// each architecture emulates some instructions under a uprobe, single-steps
// the rest out of line (a second trap) and refuses a few
// (docs/PROBES.md, "Probe placement").

// Reasons a probed function gets no probe (/status refused_probes).
const (
	RefusedByKernel = status.RefusedByKernel
)

// Placements of a probe other than the symbol's first instruction
// (/status probes[].placement).
const (
	PlacementPastEndbr64 = status.PlacementPastEndbr64
	PlacementPastRefused = status.PlacementPastRefused
)

// How the kernel runs the instruction under an entry probe
// (/status probes[].entry).
const (
	EntrySimulated      = status.EntrySimulated
	EntryStepped        = status.EntryStepped
	EntrySimulatedSince = status.EntrySimulatedSince613
)

// Func is a function a file defines, with where to probe it.
type Func struct {
	Addr   uint64 // file offset of the symbol: the uprobe address given to cilium/ebpf
	Offset uint64 // probe offset from the symbol
	// Placement says why Offset is not 0 (Placement*); "" at the symbol.
	Placement string
	// Entry says how the kernel runs the probed instruction (Entry*);
	// "" when the decoder does not tell.
	Entry string
	// Refused: the kernel refuses a uprobe at Addr+Offset (from the
	// file's bytes): the function is never offered to it.
	Refused *Refusal
}

// ProbeAddr is the file offset the uprobe goes on.
func (s Func) ProbeAddr() uint64 { return s.Addr + s.Offset }

// Refusal is why a function gets no probe.
type Refusal struct {
	Reason string // Refused*
	Code   []byte // the first bytes at the refused address, when read
	Err    string // the kernel's answer, when found by trying
}

// codeShown is how many bytes of a refused instruction /status shows.
const codeShown = 8

// maxScan bounds the bytes of a function read to look for branches back
// to its start before a probe moves past its first instruction; a longer
// or sizeless function keeps its refused probe.
const maxScan = 16 << 10

// HostMachine is the ELF machine whose code this kernel probes: a uprobe
// writes the kernel's own breakpoint instruction, so a file of another
// machine (run by an emulator such as qemu-user) must never get one.
func HostMachine() elf.Machine {
	switch runtime.GOARCH {
	case "amd64":
		return elf.EM_X86_64
	case "arm64":
		return elf.EM_AARCH64
	}
	return elf.EM_NONE
}

// placers decide, per ELF machine, where to probe the function s at file
// offset addr.
var placers = map[elf.Machine]func(ef *elfsym.File, s elfsym.Symbol, addr uint64) Func{
	elf.EM_X86_64:  placeX86,
	elf.EM_AARCH64: placeARM64,
}

// body reads the function s (at most maxScan bytes); nil when it cannot.
func body(ef *elfsym.File, s elfsym.Symbol) []byte {
	out := make([]byte, 0, s.Size)
	for off := uint64(0); off < s.Size; off += elfsym.MaxCode {
		chunk, err := ef.Code(s.Value+off, int(min(s.Size-off, elfsym.MaxCode)))
		if err != nil {
			return nil
		}
		out = append(out, chunk...)
	}
	return out
}

// DefinedFuncs returns which of names the shared object f defines as
// functions in .dynsym (the table the dynamic linker, and so every
// caller, uses), each with its file offset and its probe offset read from
// the file's bytes. Files are tenant-controlled: internal/elfsym bounds
// every read and allocation (issue 17), and only the probed names are
// looked up. withSymtab adds those of .symtab (a statically linked
// runtime's functions are there unless the executable is stripped), where
// .dynsym lacks them. machine is the ELF machine the file must be
// (HostMachine); EM_NONE takes any machine a decoder exists for. A panic
// is returned as an error, never raised.
func DefinedFuncs(f *os.File, names []string, withSymtab bool, machine elf.Machine) (out map[string]Func, err error) {
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
	placeFn, ok := placers[ef.Machine()]
	switch {
	case machine != elf.EM_NONE && ef.Machine() != machine:
		return nil, fmt.Errorf("ELF machine %v: this kernel probes %v code", ef.Machine(), machine)
	case !ok:
		return nil, fmt.Errorf("ELF machine %v: no instruction decoder", ef.Machine())
	}
	found, err := ef.Lookup(names)
	if err != nil && (!withSymtab || !errors.Is(err, elfsym.ErrNoSymbols)) {
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
	out = make(map[string]Func, len(found))
	for name, s := range found {
		addr, ok := ef.Offset(s.Value)
		if !ok {
			continue // not in the file's code: nothing to probe
		}
		out[name] = placeFn(ef, s, addr)
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
