package elfsym

import (
	"bytes"
	"debug/elf"
	"fmt"
	"io"
)

// rawSym is one ELF64 symbol table entry.
type rawSym struct {
	name  uint32
	info  byte
	shndx uint16
	value uint64
	size  uint64
}

func parseSym(b []byte) rawSym {
	return rawSym{name: le.Uint32(b), info: b[4], shndx: le.Uint16(b[6:]), value: le.Uint64(b[8:]), size: le.Uint64(b[16:])}
}

// definedFunc: a function the file itself provides an address for.
func (s rawSym) definedFunc() bool {
	return elf.ST_TYPE(s.info) == elf.STT_FUNC && elf.SectionIndex(s.shndx) != elf.SHN_UNDEF && s.value != 0 && s.name != 0
}

func (s rawSym) symbol(name string) Symbol {
	return Symbol{Name: name, Value: s.value, Size: s.size, Bind: elf.ST_BIND(s.info)}
}

// readAhead is what a string table read takes beyond the bytes asked
// for: names near each other in the table (the usual layout) then cost
// one read, and a hostile table whose names are scattered costs at most
// this much per symbol.
const readAhead = 1 << 10

// window caches one stretch of a string table (at most MaxNameLen+1
// bytes, allocated once).
type window struct {
	buf  []byte
	strs section
	base uint64 // offset in the section of buf[0]
}

// get returns up to n (at most MaxNameLen+1) bytes of strs at offset off;
// fewer at the end of the section.
func (w *window) get(r io.ReaderAt, strs section, off uint64, n int) ([]byte, error) {
	if off >= strs.size {
		return nil, fmt.Errorf("%w: string offset %#x past the string table (%d bytes)", ErrMalformed, off, strs.size)
	}
	n = min(n, MaxNameLen+1)
	want := min(uint64(n), strs.size-off)
	if w.strs == strs && off >= w.base && off+want <= w.base+uint64(len(w.buf)) {
		return w.buf[off-w.base : off-w.base+want], nil
	}
	if w.buf == nil {
		w.buf = make([]byte, MaxNameLen+1)
	}
	ln := min(uint64(max(n, readAhead)), uint64(cap(w.buf)), strs.size-off)
	w.buf = w.buf[:ln]
	w.strs, w.base = section{}, 0
	if _, err := readFull(r, w.buf, strs.off+off); err != nil {
		w.buf = w.buf[:0]
		return nil, fmt.Errorf("read string table: %w", err)
	}
	w.strs, w.base = strs, off
	return w.buf[:want], nil
}

// name returns the NUL-terminated string at off; ok is false when it is
// longer than max (or not terminated before the end of the table).
func (f *File) name(strs section, off uint64, max int) (name []byte, ok bool, err error) {
	b, err := f.win.get(f.r, strs, off, min(max+1, readAhead))
	if err != nil {
		return nil, false, err
	}
	if i := bytes.IndexByte(b, 0); i >= 0 {
		return b[:i], true, nil
	}
	if len(b) == max+1 || uint64(len(b)) == strs.size-off {
		return nil, false, nil // too long, or not terminated
	}
	if b, err = f.win.get(f.r, strs, off, max+1); err != nil {
		return nil, false, err
	}
	if i := bytes.IndexByte(b, 0); i >= 0 {
		return b[:i], true, nil
	}
	return nil, false, nil
}

func (f *File) sym(t *symtab, i uint64) (rawSym, error) {
	var b [symSize]byte
	if i >= t.n {
		return rawSym{}, fmt.Errorf("%w: symbol %d of %d", ErrMalformed, i, t.n)
	}
	if _, err := readFull(f.r, b[:], t.syms.off+i*symSize); err != nil {
		return rawSym{}, fmt.Errorf("read symbol %d: %w", i, err)
	}
	return parseSym(b[:]), nil
}

func (f *File) word(s *section, off uint64) (uint32, error) {
	var b [4]byte
	if off > s.size || s.size-off < 4 {
		return 0, fmt.Errorf("%w: hash table entry at %#x past its end (%d bytes)", ErrMalformed, off, s.size)
	}
	if _, err := readFull(f.r, b[:], s.off+off); err != nil {
		return 0, fmt.Errorf("read hash table: %w", err)
	}
	return le.Uint32(b[:]), nil
}

// hidden reports whether .gnu.version marks dynamic symbol i as a
// non-default version (foo@V1 beside the default foo@@V2).
func (f *File) hidden(i uint64) bool {
	if f.versym == nil {
		return false
	}
	var b [2]byte
	if _, err := readFull(f.r, b[:], f.versym.off+2*i); err != nil {
		return false
	}
	return le.Uint16(b[:])&0x8000 != 0
}

// candidate keeps the best definition of one name seen so far: the
// default version over hidden ones, else the first.
type candidate struct {
	sym    Symbol
	found  bool
	hidden bool
}

func (c *candidate) offer(s rawSym, name string, hidden bool) {
	if !c.found || c.hidden && !hidden {
		*c = candidate{sym: s.symbol(name), found: true, hidden: hidden}
	}
}

// Lookup returns the defined functions of .dynsym named in names (bare
// names: cudaLaunchKernel finds the versioned cudaLaunchKernel@@libcudart.so.11.0,
// preferring the default version). Names the file does not define are
// absent from the result. It walks .gnu.hash or .hash chains (each walk
// bounded by the table's symbol count) or, without either, scans .dynsym
// once in 64 KiB reads. ErrNoSymbols when the file has no .dynsym.
func (f *File) Lookup(names []string) (_ map[string]Symbol, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: lookup panicked: %v", ErrMalformed, p)
		}
	}()
	t := f.tabs[DynSym]
	if t == nil {
		return nil, fmt.Errorf(".dynsym: %w", ErrNoSymbols)
	}
	found := make(map[string]*candidate, len(names))
	for _, n := range names {
		if n != "" && len(n) <= MaxNameLen {
			found[n] = &candidate{}
		}
	}
	switch {
	case f.gnuHash != nil:
		for n, c := range found {
			if err := f.lookupGNU(t, n, c); err != nil {
				return nil, fmt.Errorf(".gnu.hash: %w", err)
			}
		}
	case f.sysHash != nil:
		for n, c := range found {
			if err := f.lookupSysV(t, n, c); err != nil {
				return nil, fmt.Errorf(".hash: %w", err)
			}
		}
	default:
		longest := 0
		for n := range found {
			longest = max(longest, len(n))
		}
		err := f.scan(t, func(i uint64, s rawSym) error {
			name, ok, err := f.name(t.strs, uint64(s.name), longest)
			if err != nil || !ok {
				return err
			}
			if c := found[string(name)]; c != nil {
				c.offer(s, string(name), f.hidden(i))
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	out := make(map[string]Symbol, len(found))
	for n, c := range found {
		if c.found {
			out[n] = c.sym
		}
	}
	return out, nil
}

// check offers symbol i to c when it is a defined function named name.
func (f *File) check(t *symtab, i uint64, name string, c *candidate) error {
	s, err := f.sym(t, i)
	if err != nil {
		return err
	}
	if !s.definedFunc() {
		return nil
	}
	got, ok, err := f.name(t.strs, uint64(s.name), len(name))
	if err != nil || !ok || string(got) != name {
		return err
	}
	c.offer(s, name, f.hidden(i))
	return nil
}

func gnuHash(name string) uint32 {
	h := uint32(5381)
	for i := 0; i < len(name); i++ {
		h = h*33 + uint32(name[i])
	}
	return h
}

func sysvHash(name string) uint32 {
	var h uint32
	for i := 0; i < len(name); i++ {
		h = h<<4 + uint32(name[i])
		g := h & 0xf0000000
		h ^= g >> 24
		h &^= g
	}
	return h
}

// lookupGNU walks the .gnu.hash bucket of name (layout: nbuckets,
// symoffset, bloom words, bloom shift; bloom; buckets; chain).
func (f *File) lookupGNU(t *symtab, name string, c *candidate) error {
	h := f.gnuHash
	var hdr [4]uint32
	for i := range hdr {
		v, err := f.word(h, uint64(4*i))
		if err != nil {
			return err
		}
		hdr[i] = v
	}
	nbuckets, symoffset, bloomWords := uint64(hdr[0]), uint64(hdr[1]), uint64(hdr[2])
	if nbuckets == 0 {
		return fmt.Errorf("%w: no buckets", ErrMalformed)
	}
	buckets := 16 + 8*bloomWords
	chain := buckets + 4*nbuckets
	if chain > h.size {
		return fmt.Errorf("%w: %d buckets and %d bloom words past the table's end (%d bytes)", ErrMalformed, nbuckets, bloomWords, h.size)
	}
	hash := gnuHash(name)
	first, err := f.word(h, buckets+4*(uint64(hash)%nbuckets))
	if err != nil {
		return err
	}
	i := uint64(first)
	if i == 0 || i < symoffset {
		return nil // empty bucket
	}
	for steps := 0; i < t.n; i, steps = i+1, steps+1 {
		if steps >= MaxChain {
			return fmt.Errorf("%w: hash chain longer than %d", ErrTooLarge, MaxChain)
		}
		h2, err := f.word(h, chain+4*(i-symoffset))
		if err != nil {
			return err
		}
		if hash|1 == h2|1 {
			if err := f.check(t, i, name, c); err != nil {
				return err
			}
		}
		if h2&1 != 0 {
			return nil // end of the chain
		}
	}
	return fmt.Errorf("%w: hash chain runs past the symbol table", ErrMalformed)
}

// lookupSysV walks the .hash bucket of name (nbucket, nchain; buckets;
// chains).
func (f *File) lookupSysV(t *symtab, name string, c *candidate) error {
	h := f.sysHash
	nbucket, err := f.word(h, 0)
	if err != nil {
		return err
	}
	nchain, err := f.word(h, 4)
	if err != nil {
		return err
	}
	if nbucket == 0 {
		return fmt.Errorf("%w: no buckets", ErrMalformed)
	}
	chains := 8 + 4*uint64(nbucket)
	i, err := f.word(h, 8+4*uint64(sysvHash(name)%nbucket))
	if err != nil {
		return err
	}
	for steps := 0; i != 0; steps++ {
		if steps >= MaxChain {
			return fmt.Errorf("%w: hash chain longer than %d", ErrTooLarge, MaxChain)
		}
		if uint64(i) >= uint64(nchain) {
			return fmt.Errorf("%w: hash chain index %d of %d", ErrMalformed, i, nchain)
		}
		if err := f.check(t, uint64(i), name, c); err != nil {
			return err
		}
		if i, err = f.word(h, chains+4*uint64(i)); err != nil {
			return err
		}
	}
	return nil
}

// scanChunk is how many bytes of a symbol table one read takes.
const scanChunk = symSize * 2730 // 64 KiB

// scan calls fn for each defined function of t, in table order.
func (f *File) scan(t *symtab, fn func(i uint64, s rawSym) error) error {
	buf := make([]byte, min(scanChunk, t.syms.size))
	for start := uint64(0); start < t.n; {
		k := min(uint64(len(buf))/symSize, t.n-start)
		b := buf[:k*symSize]
		if _, err := readFull(f.r, b, t.syms.off+start*symSize); err != nil {
			return fmt.Errorf("read symbols: %w", err)
		}
		for j := range k {
			s := parseSym(b[j*symSize:])
			if !s.definedFunc() {
				continue
			}
			if err := fn(start+j, s); err != nil {
				return err
			}
		}
		start += k
	}
	return nil
}

// Funcs returns the defined functions of table t whose name keep accepts
// (every one when keep is nil), at most limit of them, in table order;
// keep must not retain the slice it is given. Names longer than
// MaxNameLen are skipped and counted in skipped. With more than limit
// matches, or more than MaxNameBytes of names, it returns those found so
// far and an error wrapping ErrLimit. ErrNoSymbols when the file has no
// such table.
func (f *File) Funcs(t Table, limit int, keep func(name []byte) bool) (syms []Symbol, skipped int, err error) {
	defer func() {
		if p := recover(); p != nil {
			syms, err = nil, fmt.Errorf("%w: %v: iteration panicked: %v", ErrMalformed, t, p)
		}
	}()
	if t != DynSym && t != SymTab {
		return nil, 0, fmt.Errorf("table %d: %w", t, ErrNoSymbols)
	}
	tab := f.tabs[t]
	if tab == nil {
		return nil, 0, fmt.Errorf("%v: %w", t, ErrNoSymbols)
	}
	var nameBytes int
	err = f.scan(tab, func(i uint64, s rawSym) error {
		name, ok, err := f.name(tab.strs, uint64(s.name), MaxNameLen)
		if err != nil {
			return err
		}
		if !ok {
			skipped++
			return nil
		}
		if keep != nil && !keep(name) {
			return nil
		}
		if len(syms) >= limit {
			return fmt.Errorf("more than %d functions: %w", limit, ErrLimit)
		}
		if nameBytes += len(name); nameBytes > MaxNameBytes {
			return fmt.Errorf("more than %d bytes of names: %w", MaxNameBytes, ErrLimit)
		}
		syms = append(syms, s.symbol(string(name)))
		return nil
	})
	if err != nil {
		return syms, skipped, fmt.Errorf("%v: %w", t, err)
	}
	return syms, skipped, nil
}
