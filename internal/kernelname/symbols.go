package kernelname

import (
	"bufio"
	"cmp"
	"container/list"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/profi-dev/profi/internal/discover"
	"github.com/profi-dev/profi/internal/elfsym"
)

// DefaultCacheFiles is the symbol-table cache size NewSymbolizer uses when
// given cacheFiles <= 0.
const DefaultCacheFiles = 16

const (
	// maxFuncs bounds the functions kept from one file. Each cached
	// table holds at most this many symbols and elfsym.MaxNameBytes of
	// names; libtorch_cuda.so, the largest file met, defines on the order
	// of 100k functions.
	maxFuncs = 1 << 20
	// maxBackScan bounds how many symbols below an address are tried when
	// the nearest one does not contain it (nested or overlapping symbols).
	maxBackScan = 64
	// mapsReadBuf is the buffer for /proc/PID/maps lines; a longer line
	// (a path near PATH_MAX) is skipped.
	mapsReadBuf = 16 << 10
)

// Errors of Symbolizer.Resolve, besides the wrapped open errors (and
// discover.ErrProcessGone when the process has exited).
var (
	// ErrNoMapping: no file mapping of the process contains the address
	// (anonymous memory such as a CUfunction handle, or an unmapped
	// address).
	ErrNoMapping = errors.New("address is not in a file mapping")
	// ErrNoSymbol: the mapped file has no FUNC symbol containing the
	// address, or the address is outside its loadable segments.
	ErrNoSymbol = errors.New("no function symbol at address")
	// ErrNotELF: the mapped file is not a usable ELF file (bad magic,
	// truncated or malformed headers or symbol tables, tables over the
	// caps of internal/elfsym). The elfsym error is wrapped too.
	ErrNotELF = errors.New("not a usable ELF file")
)

// Symbolizer names code addresses of running processes from the ELF
// symbol tables of their mapped files: the fallback for kernels that were
// registered before the agent attached, whose host-side stub address is
// all the launch probe sees. Parsed tables are cached per (dev, inode) of
// the mapped file, least recently used first out, so a library shared by
// many processes is parsed once. A Symbolizer is safe for concurrent use;
// make one with NewSymbolizer. A file rewritten in place (same inode)
// keeps its cached table until evicted; libraries are replaced by rename,
// which gives a new inode.
type Symbolizer struct {
	procRoot string
	capacity int

	mu    sync.Mutex
	lru   *list.List // of *cacheEntry, most recently used first
	files map[fileKey]*list.Element

	parses atomic.Int64 // files parsed, for tests of the cache
}

// fileKey identifies a mapped file as /proc/PID/maps prints it.
type fileKey struct{ dev, ino uint64 }

// cacheEntry is a parsed file: its table, or the error that parsing it
// gave (a file that is not ELF stays that way, so failures are cached too).
type cacheEntry struct {
	key fileKey
	tab *symtab
	err error
}

// NewSymbolizer returns a Symbolizer that reads processes under procRoot
// ("" means /proc, "/host/proc" when the agent runs in a container) and
// caches the symbol tables of cacheFiles files (DefaultCacheFiles if
// cacheFiles <= 0).
func NewSymbolizer(procRoot string, cacheFiles int) *Symbolizer {
	if procRoot == "" {
		procRoot = discover.DefaultProcRoot
	}
	if cacheFiles <= 0 {
		cacheFiles = DefaultCacheFiles
	}
	return &Symbolizer{
		procRoot: procRoot,
		capacity: cacheFiles,
		lru:      list.New(),
		files:    make(map[fileKey]*list.Element),
	}
}

// Resolve returns the raw (mangled) name of the FUNC symbol that contains
// addr in process pid; pass it to Normalize for a label.
//
// The mapping of /proc/PID/maps containing addr gives the file and the
// file offset (addr - start + offset). The PT_LOAD program header whose
// file range holds that offset converts it to an ELF virtual address
// (offset - p_offset + p_vaddr): segment addresses and file offsets differ
// in general (non-PIE executables, data segments, custom linker layouts).
// The symbol is looked up in .symtab, or in .dynsym for stripped files. A
// symbol of size 0 matches only its exact address.
//
// The file is opened inside the process's root (discover.OpenInRoot); a
// mapping of a deleted file is opened through /proc/PID/map_files, which
// needs CAP_SYS_ADMIN (or CAP_CHECKPOINT_RESTORE). Errors wrap ErrNoMapping, ErrNoSymbol, ErrNotELF
// (with the elfsym error), discover.ErrProcessGone, or the open error.
func (s *Symbolizer) Resolve(pid int, addr uint64) (name string, err error) {
	if pid <= 0 {
		return "", fmt.Errorf("resolve 0x%x: invalid pid %d", addr, pid)
	}
	m, err := s.findMapping(pid, addr)
	if err != nil {
		return "", fmt.Errorf("resolve 0x%x in pid %d: %w", addr, pid, err)
	}
	tab, err := s.table(pid, m)
	if err != nil {
		return "", fmt.Errorf("resolve 0x%x in pid %d: %w", addr, pid, err)
	}
	off := addr - m.Start + m.Offset
	if off < m.Offset {
		return "", fmt.Errorf("resolve 0x%x in pid %d: file offset overflows: %w", addr, pid, ErrNoSymbol)
	}
	vaddr, ok := tab.vaddr(off)
	if !ok {
		return "", fmt.Errorf("resolve 0x%x in pid %d: offset 0x%x of %s is in no loadable segment: %w",
			addr, pid, off, m.Path, ErrNoSymbol)
	}
	name, ok = tab.lookup(vaddr)
	if !ok {
		return "", fmt.Errorf("resolve 0x%x in pid %d: %s at 0x%x: %w", addr, pid, m.Path, vaddr, ErrNoSymbol)
	}
	return name, nil
}

// findMapping returns the file mapping of pid that contains addr.
func (s *Symbolizer) findMapping(pid int, addr uint64) (discover.MapsEntry, error) {
	f, err := os.Open(s.procRoot + "/" + strconv.Itoa(pid) + "/maps")
	if err != nil {
		if gone(err) {
			return discover.MapsEntry{}, fmt.Errorf("%w: %w", discover.ErrProcessGone, err)
		}
		return discover.MapsEntry{}, err
	}
	defer f.Close()
	br := bufio.NewReaderSize(f, mapsReadBuf)
	for {
		line, err := br.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			for err == bufio.ErrBufferFull {
				_, err = br.ReadSlice('\n')
			}
			line = nil
		}
		if len(line) > 0 {
			// Lines that do not parse or have no file are skipped; maps is
			// sorted by address, so the search ends at the first file
			// mapping above addr.
			e, ok, perr := discover.ParseMapsLine(string(line))
			if perr == nil && ok {
				if e.Start <= addr && addr < e.End {
					return e, nil
				}
				if e.Start > addr {
					break
				}
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			if gone(err) {
				err = fmt.Errorf("%w: %w", discover.ErrProcessGone, err)
			}
			return discover.MapsEntry{}, fmt.Errorf("read maps: %w", err)
		}
	}
	return discover.MapsEntry{}, ErrNoMapping
}

// table returns the symbol table of the file of mapping m, from the cache
// or parsed now. Open errors are not cached: they depend on the process
// and may be transient.
func (s *Symbolizer) table(pid int, m discover.MapsEntry) (*symtab, error) {
	key := fileKey{m.Dev, m.Inode}
	cacheable := m.Inode != 0
	if cacheable {
		if e, ok := s.cached(key); ok {
			return e.tab, e.err
		}
	}
	f, err := s.open(pid, m)
	if err != nil {
		return nil, err
	}
	var tab *symtab
	if st, serr := f.Stat(); serr != nil {
		err = fmt.Errorf("stat: %w", serr)
	} else {
		tab, err = readSymtab(f, st.Size())
	}
	f.Close()
	s.parses.Add(1)
	if err != nil {
		err = fmt.Errorf("read symbols of %s: %w: %w", m.Path, ErrNotELF, err)
	}
	if cacheable {
		s.store(&cacheEntry{key: key, tab: tab, err: err})
	}
	return tab, err
}

// open opens the file of mapping m as process pid sees it.
func (s *Symbolizer) open(pid int, m discover.MapsEntry) (*os.File, error) {
	if !m.Deleted {
		return discover.OpenInRoot(s.procRoot, pid, m.Path)
	}
	// The path names another file now, or none; map_files links to the
	// mapped file itself.
	p := fmt.Sprintf("%s/%d/map_files/%x-%x", s.procRoot, pid, m.Start, m.End)
	f, err := os.Open(p)
	if err != nil {
		if gone(err) {
			return nil, fmt.Errorf("open deleted %s: %w: %w", m.Path, discover.ErrProcessGone, err)
		}
		return nil, fmt.Errorf("open deleted %s: %w", m.Path, err)
	}
	return f, nil
}

func (s *Symbolizer) cached(key fileKey) (*cacheEntry, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	el, ok := s.files[key]
	if !ok {
		return nil, false
	}
	s.lru.MoveToFront(el)
	return el.Value.(*cacheEntry), true
}

// store adds e, replacing an entry for the same file that a concurrent
// Resolve parsed meanwhile, and evicts the least recently used entries
// beyond the capacity.
func (s *Symbolizer) store(e *cacheEntry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if el, ok := s.files[e.key]; ok {
		el.Value = e
		s.lru.MoveToFront(el)
		return
	}
	s.files[e.key] = s.lru.PushFront(e)
	for s.lru.Len() > s.capacity {
		last := s.lru.Back()
		s.lru.Remove(last)
		delete(s.files, last.Value.(*cacheEntry).key)
	}
}

// symtab is what Resolve needs from one ELF file.
type symtab struct {
	segs []segment // PT_LOAD headers with file contents, in file order
	syms []symbol  // FUNC symbols by value, then binding rank, then name
}

// segment is the file range of a PT_LOAD header and its virtual address.
type segment struct{ off, filesz, vaddr uint64 }

type symbol struct {
	value, size uint64
	rank        uint8 // binding preference among symbols at one address
	name        string
}

// vaddr converts a file offset to the ELF virtual address that the
// loadable segment holding it gives it.
func (t *symtab) vaddr(off uint64) (uint64, bool) {
	for _, s := range t.segs {
		if off >= s.off && off-s.off < s.filesz {
			return off - s.off + s.vaddr, true
		}
	}
	return 0, false
}

// lookup returns the symbol containing v: value <= v < value+size, or
// v == value for a symbol of size 0. Among symbols at one address the
// best ranked wins; the nearest address below v is tried first.
func (t *symtab) lookup(v uint64) (string, bool) {
	i := sort.Search(len(t.syms), func(i int) bool { return t.syms[i].value > v })
	for tried := 0; i > 0 && tried < maxBackScan; {
		g := i - 1
		for g > 0 && t.syms[g-1].value == t.syms[i-1].value {
			g--
		}
		for _, s := range t.syms[g:i] {
			if v == s.value || v-s.value < s.size {
				return s.name, true
			}
		}
		tried += i - g
		i = g
	}
	return "", false
}

// bindingRank orders symbols at one address: exported names first, since
// a local alias is usually compiler-made (foo.localalias, .cold parts).
func bindingRank(b elf.SymBind) uint8 {
	switch b {
	case elf.STB_GLOBAL:
		return 0
	case elf.STB_WEAK:
		return 1
	case elf.STB_LOCAL:
		return 2
	}
	return 3
}

// readSymtab parses an ELF file of size bytes into a symtab: its
// loadable segments and its defined FUNC symbols from .symtab, or from
// .dynsym when .symtab is missing or has none. The file is read through
// internal/elfsym, which bounds every read and allocation whatever the
// headers say (a sparse file's apparent size included); more than
// maxFuncs functions is an error. It returns an error, never panics, on
// malformed input.
func readSymtab(r io.ReaderAt, size int64) (tab *symtab, err error) {
	defer func() {
		if p := recover(); p != nil {
			tab, err = nil, fmt.Errorf("malformed ELF file: parser panicked: %v", p)
		}
	}()
	f, err := elfsym.Open(r, size)
	if err != nil {
		return nil, err
	}
	tab = &symtab{}
	for _, s := range f.Segments() {
		tab.segs = append(tab.segs, segment{off: s.Off, filesz: s.Filesz, vaddr: s.Vaddr})
	}
	var errs []error
	for _, t := range []elfsym.Table{elfsym.SymTab, elfsym.DynSym} {
		syms, err := readFuncs(f, t)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if len(syms) > 0 {
			tab.syms = syms
			return tab, nil
		}
	}
	if len(errs) == 2 {
		return nil, errors.Join(errs...)
	}
	return tab, nil
}

// readFuncs returns the defined, named FUNC symbols of table t, sorted
// and without duplicates. A missing table is not an error.
func readFuncs(f *elfsym.File, t elfsym.Table) ([]symbol, error) {
	syms, _, err := f.Funcs(t, maxFuncs, nil)
	if errors.Is(err, elfsym.ErrNoSymbols) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := make([]symbol, 0, len(syms))
	for _, sym := range syms {
		out = append(out, symbol{value: sym.Value, size: sym.Size, rank: bindingRank(sym.Bind), name: sym.Name})
	}
	slices.SortFunc(out, func(a, b symbol) int {
		return cmp.Or(cmp.Compare(a.value, b.value), cmp.Compare(a.rank, b.rank), cmp.Compare(a.name, b.name))
	})
	return slices.CompactFunc(out, func(a, b symbol) bool { return a.value == b.value && a.name == b.name }), nil
}
