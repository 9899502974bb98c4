package elfsym

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Caps. Real files pass them by orders of magnitude; a hostile header
// meets one of them before the agent reads or allocates much. Measured:
// NVIDIA's libcudart 11.8 has ~400 dynamic symbols, libcuda 535 a few
// thousand; libtorch_cuda.so, the largest library profi meets, has on the
// order of 100k dynamic symbols (a few MiB of .dynsym) and a .symtab of
// tens of MiB when not stripped. Every shared object or executable has
// fewer than 20 program headers and, with debug sections, under 100
// section headers.
const (
	// MaxProgs caps program headers (a hostile 65,000 made every symbol
	// lookup walk them all: 3 s of CPU for 20k symbols).
	MaxProgs = 256
	// MaxSections caps section headers (256 KiB of headers).
	MaxSections = 4096
	// MaxSymtabBytes caps one symbol table: 2.8 million symbols. A sparse
	// 256 MiB .dynsym (16 KiB on disk) is refused here; one at the cap
	// is scanned in 64 KiB reads, never held.
	MaxSymtabBytes = 64 << 20
	// MaxStrtabBytes caps a string table. Names are read one at a time
	// (at most MaxNameLen bytes each), so this bounds offsets, not memory.
	MaxStrtabBytes = 256 << 20
	// MaxHashBytes caps .gnu.hash and .hash; they are read a word at a time.
	MaxHashBytes = 64 << 20
	// MaxChain caps the symbols one hash chain walk visits (per name
	// looked up). The linker sizes buckets so that chains average a few
	// entries; the longest in real libraries are tens.
	MaxChain = 4096
	// MaxNameLen caps one symbol name. Template-heavy C++ kernel names
	// (CUTLASS) reach a few KiB; Funcs skips and counts longer ones.
	MaxNameLen = 8 << 10
	// MaxNameBytes caps the name bytes one Funcs call returns, so that
	// symbols sharing one long name cannot multiply it.
	MaxNameBytes = 64 << 20
	// MaxCode caps Code's length.
	MaxCode = 64
)

// Errors. Each error Open, Lookup and Funcs return wraps one of them.
var (
	// ErrNotELF: no ELF magic.
	ErrNotELF = errors.New("not an ELF file")
	// ErrUnsupported: ELF, but not a little-endian ELF64 shared object or
	// executable.
	ErrUnsupported = errors.New("unsupported ELF file")
	// ErrMalformed: a header or table that contradicts the file (past its
	// end, bad entry size, a broken hash chain).
	ErrMalformed = errors.New("malformed ELF file")
	// ErrTooLarge: a table or header count above its cap (see the Max
	// constants).
	ErrTooLarge = errors.New("ELF table over its cap")
	// ErrNoSymbols: the file has no symbol table of the kind asked for.
	ErrNoSymbols = errors.New("no symbol table")
	// ErrLimit: Funcs found more symbols than it was allowed to return.
	ErrLimit = errors.New("symbol limit reached")
)

// Table selects a symbol table.
type Table int

const (
	DynSym Table = iota // .dynsym: what the dynamic linker, and so every caller, uses
	SymTab              // .symtab: every symbol, when not stripped
)

func (t Table) String() string {
	if t == SymTab {
		return ".symtab"
	}
	return ".dynsym"
}

// Symbol is a defined function: its section is not SHN_UNDEF, its type
// STT_FUNC and its value not 0.
type Symbol struct {
	Name  string
	Value uint64 // virtual address
	Size  uint64
	Bind  elf.SymBind
}

// Segment is a PT_LOAD program header with file contents.
type Segment struct {
	Off, Filesz, Vaddr uint64
	Exec               bool // PF_X
}

// File is an opened ELF file. It reads through the io.ReaderAt given to
// Open, which must stay open while the File is used. A File is not safe
// for concurrent use.
type File struct {
	r    io.ReaderAt
	size uint64
	typ  elf.Type
	mach elf.Machine
	segs []Segment // loadable, in header order

	tabs    [2]*symtab // by Table
	gnuHash *section   // of .dynsym
	sysHash *section   // of .dynsym
	versym  *section   // of .dynsym

	win window // string table reads
}

type section struct {
	typ        elf.SectionType
	off, size  uint64
	link, info uint32
}

// symtab is a symbol table and its string table.
type symtab struct {
	syms, strs section
	n          uint64 // entries
}

const (
	ehdrSize = 64
	phdrSize = 56
	shdrSize = 64
	symSize  = 24

	shtGNUHash = elf.SectionType(0x6ffffff6)
	shtVersym  = elf.SectionType(0x6fffffff) // SHT_GNU_versym
)

var le = binary.LittleEndian

// Open reads the headers of the ELF file r, whose real size is size (the
// fstat size: for a sparse file, the apparent size). It returns an error
// wrapping one of the package's errors for anything else than a
// well-formed little-endian ELF64 shared object or executable within the
// caps.
func Open(r io.ReaderAt, size int64) (f *File, err error) {
	defer func() {
		if p := recover(); p != nil { // a bug here must not take the agent down
			f, err = nil, fmt.Errorf("%w: reader panicked: %v", ErrMalformed, p)
		}
	}()
	if size < 0 {
		return nil, fmt.Errorf("%w: negative size %d", ErrMalformed, size)
	}
	f = &File{r: r, size: uint64(size)}
	var h [ehdrSize]byte
	n, err := readFull(r, h[:], 0)
	if n < 4 || string(h[:4]) != elf.ELFMAG {
		if err != nil && n < 4 && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, fmt.Errorf("read ELF header: %w", err)
		}
		return nil, ErrNotELF
	}
	if n < ehdrSize {
		if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, fmt.Errorf("read ELF header: %w", err)
		}
		return nil, fmt.Errorf("%w: %d bytes, shorter than the ELF header", ErrMalformed, n)
	}
	if elf.Class(h[elf.EI_CLASS]) != elf.ELFCLASS64 || elf.Data(h[elf.EI_DATA]) != elf.ELFDATA2LSB {
		return nil, fmt.Errorf("%w: %v %v, want ELFCLASS64 ELFDATA2LSB", ErrUnsupported, elf.Class(h[elf.EI_CLASS]), elf.Data(h[elf.EI_DATA]))
	}
	if elf.Version(h[elf.EI_VERSION]) != elf.EV_CURRENT {
		return nil, fmt.Errorf("%w: ELF version %d", ErrUnsupported, h[elf.EI_VERSION])
	}
	f.typ = elf.Type(le.Uint16(h[16:]))
	f.mach = elf.Machine(le.Uint16(h[18:]))
	if f.typ != elf.ET_DYN && f.typ != elf.ET_EXEC {
		return nil, fmt.Errorf("%w: type %v, want a shared object or executable", ErrUnsupported, f.typ)
	}
	phoff, shoff := le.Uint64(h[32:]), le.Uint64(h[40:])
	phentsize, phnum := le.Uint16(h[54:]), uint64(le.Uint16(h[56:]))
	shentsize, shnum := le.Uint16(h[58:]), uint64(le.Uint16(h[60:]))
	shstrndx := uint64(le.Uint16(h[62:]))

	// Section header 0 holds the real counts of extended numbering.
	var sh0 section
	if shoff != 0 {
		if shentsize != shdrSize {
			return nil, fmt.Errorf("%w: section header size %d, want %d", ErrMalformed, shentsize, shdrSize)
		}
		if sh0, err = f.readShdr(shoff); err != nil {
			return nil, err
		}
		if shnum == 0 {
			shnum = sh0.size
		}
		if shstrndx == uint64(elf.SHN_XINDEX) {
			shstrndx = uint64(sh0.link)
		}
	} else {
		shnum = 0
	}
	if phnum == 0xffff && shoff != 0 { // PN_XNUM
		phnum = uint64(sh0.info)
	}
	_ = shstrndx // sections are found by type; their names are never read

	if err := f.readProgs(phoff, phentsize, phnum); err != nil {
		return nil, err
	}
	if err := f.readSections(shoff, shnum); err != nil {
		return nil, err
	}
	return f, nil
}

// Type is the file's ELF type (ET_DYN or ET_EXEC).
func (f *File) Type() elf.Type { return f.typ }

// Machine is the file's ELF machine (e_machine): which instruction set
// its code is.
func (f *File) Machine() elf.Machine { return f.mach }

// Segments returns the loadable segments with file contents, in program
// header order.
func (f *File) Segments() []Segment { return append([]Segment(nil), f.segs...) }

// Offset returns the file offset of the code at virtual address vaddr,
// inside an executable loadable segment: the address a uprobe on that
// code takes (link.UprobeOptions.Address). Never 0 for a valid file: the
// ELF header is at 0.
func (f *File) Offset(vaddr uint64) (uint64, bool) {
	for _, s := range f.segs {
		if s.Exec && vaddr >= s.Vaddr && vaddr-s.Vaddr < s.Filesz {
			off := s.Off + (vaddr - s.Vaddr)
			return off, off != 0
		}
	}
	return 0, false
}

// Code returns the first n (at most MaxCode) bytes of code at virtual
// address vaddr; all n must lie in one executable segment.
func (f *File) Code(vaddr uint64, n int) ([]byte, error) {
	if n < 0 || n > MaxCode {
		return nil, fmt.Errorf("read %d code bytes: more than %d", n, MaxCode)
	}
	for _, s := range f.segs {
		if s.Exec && vaddr >= s.Vaddr && vaddr-s.Vaddr < s.Filesz && s.Filesz-(vaddr-s.Vaddr) >= uint64(n) {
			buf := make([]byte, n)
			if _, err := readFull(f.r, buf, s.Off+(vaddr-s.Vaddr)); err != nil {
				return nil, fmt.Errorf("read code at %#x: %w", vaddr, err)
			}
			return buf, nil
		}
	}
	return nil, fmt.Errorf("code at %#x: %w: not in an executable segment", vaddr, ErrMalformed)
}

// within reports whether [off, off+n) lies inside the file.
func (f *File) within(off, n uint64) bool {
	return off <= f.size && n <= f.size-off
}

func (f *File) readShdr(off uint64) (section, error) {
	if !f.within(off, shdrSize) {
		return section{}, fmt.Errorf("%w: section header at %#x past the end of the file (%d bytes)", ErrMalformed, off, f.size)
	}
	var b [shdrSize]byte
	if _, err := readFull(f.r, b[:], off); err != nil {
		return section{}, fmt.Errorf("read section header: %w", err)
	}
	return parseShdr(b[:]), nil
}

func parseShdr(b []byte) section {
	return section{
		typ:  elf.SectionType(le.Uint32(b[4:])),
		off:  le.Uint64(b[24:]),
		size: le.Uint64(b[32:]),
		link: le.Uint32(b[40:]),
		info: le.Uint32(b[44:]),
	}
}

func (f *File) readProgs(phoff uint64, phentsize uint16, phnum uint64) error {
	if phnum == 0 {
		return nil
	}
	if phnum > MaxProgs {
		return fmt.Errorf("%w: %d program headers, more than %d", ErrTooLarge, phnum, MaxProgs)
	}
	if phentsize != phdrSize {
		return fmt.Errorf("%w: program header size %d, want %d", ErrMalformed, phentsize, phdrSize)
	}
	if !f.within(phoff, phnum*phdrSize) {
		return fmt.Errorf("%w: %d program headers at %#x past the end of the file (%d bytes)", ErrMalformed, phnum, phoff, f.size)
	}
	buf := make([]byte, phnum*phdrSize)
	if _, err := readFull(f.r, buf, phoff); err != nil {
		return fmt.Errorf("read program headers: %w", err)
	}
	for i := range phnum {
		p := buf[i*phdrSize:]
		if elf.ProgType(le.Uint32(p)) != elf.PT_LOAD {
			continue
		}
		s := Segment{
			Off:    le.Uint64(p[8:]),
			Vaddr:  le.Uint64(p[16:]),
			Filesz: le.Uint64(p[32:]),
			Exec:   elf.ProgFlag(le.Uint32(p[4:]))&elf.PF_X != 0,
		}
		if s.Filesz == 0 {
			continue
		}
		if !f.within(s.Off, s.Filesz) {
			return fmt.Errorf("%w: segment %d [%#x, +%#x) past the end of the file (%d bytes)", ErrMalformed, i, s.Off, s.Filesz, f.size)
		}
		if s.Vaddr+s.Filesz < s.Vaddr {
			return fmt.Errorf("%w: segment %d address range overflows", ErrMalformed, i)
		}
		f.segs = append(f.segs, s)
	}
	return nil
}

func (f *File) readSections(shoff, shnum uint64) error {
	if shnum == 0 {
		return nil
	}
	if shnum > MaxSections {
		return fmt.Errorf("%w: %d section headers, more than %d", ErrTooLarge, shnum, MaxSections)
	}
	if !f.within(shoff, shnum*shdrSize) {
		return fmt.Errorf("%w: %d section headers at %#x past the end of the file (%d bytes)", ErrMalformed, shnum, shoff, f.size)
	}
	buf := make([]byte, shnum*shdrSize)
	if _, err := readFull(f.r, buf, shoff); err != nil {
		return fmt.Errorf("read section headers: %w", err)
	}
	secs := make([]section, shnum)
	for i := range secs {
		s := parseShdr(buf[i*shdrSize:])
		if s.typ != elf.SHT_NOBITS && s.typ != elf.SHT_NULL && !f.within(s.off, s.size) {
			return fmt.Errorf("%w: section %d [%#x, +%#x) past the end of the file (%d bytes)", ErrMalformed, i, s.off, s.size, f.size)
		}
		secs[i] = s
	}
	dynIdx := -1
	for i, s := range secs {
		var t Table
		switch s.typ {
		case elf.SHT_DYNSYM:
			t = DynSym
		case elf.SHT_SYMTAB:
			t = SymTab
		default:
			continue
		}
		if f.tabs[t] != nil {
			continue // only the first of each kind, as debug/elf does
		}
		tab, err := newSymtab(t, s, secs)
		if err != nil {
			return err
		}
		f.tabs[t] = tab
		if t == DynSym {
			dynIdx = i
		}
	}
	if dynIdx < 0 {
		return nil
	}
	for i := range secs {
		s := &secs[i]
		if s.link != uint32(dynIdx) {
			continue
		}
		switch s.typ {
		case shtGNUHash, elf.SHT_HASH:
			if s.size > MaxHashBytes {
				return fmt.Errorf("%w: hash section %d: %d bytes, more than %d", ErrTooLarge, i, s.size, MaxHashBytes)
			}
			if s.typ == shtGNUHash && f.gnuHash == nil {
				f.gnuHash = s
			} else if s.typ == elf.SHT_HASH && f.sysHash == nil {
				f.sysHash = s
			}
		case shtVersym:
			if f.versym == nil && s.size >= 2*f.tabs[DynSym].n {
				f.versym = s
			}
		}
	}
	return nil
}

func newSymtab(t Table, s section, secs []section) (*symtab, error) {
	if s.size > MaxSymtabBytes {
		return nil, fmt.Errorf("%w: %v: %d bytes, more than %d", ErrTooLarge, t, s.size, MaxSymtabBytes)
	}
	if s.size%symSize != 0 {
		return nil, fmt.Errorf("%w: %v: %d bytes, not a multiple of %d", ErrMalformed, t, s.size, symSize)
	}
	if uint64(s.link) >= uint64(len(secs)) || secs[s.link].typ != elf.SHT_STRTAB {
		return nil, fmt.Errorf("%w: %v: string table %d is not a string table", ErrMalformed, t, s.link)
	}
	strs := secs[s.link]
	if strs.size > MaxStrtabBytes {
		return nil, fmt.Errorf("%w: %v strings: %d bytes, more than %d", ErrTooLarge, t, strs.size, MaxStrtabBytes)
	}
	return &symtab{syms: s, strs: strs, n: s.size / symSize}, nil
}

// readFull reads len(b) bytes at off; io.EOF with a full read is success.
func readFull(r io.ReaderAt, b []byte, off uint64) (int, error) {
	if off > 1<<62 {
		return 0, fmt.Errorf("%w: offset %#x", ErrMalformed, off)
	}
	n, err := r.ReadAt(b, int64(off))
	if n == len(b) {
		return n, nil
	}
	if err == nil || errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}
