package elfsym

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// hostile describes a crafted shared object written as a sparse file:
// a header, three section headers (null, .dynsym, .dynstr), a few real
// symbols at the start of .dynsym and the rest holes (zeros).
type hostile struct {
	phnum      uint16
	dynsymSize uint64 // apparent size of .dynsym
	strOff     uint64 // 0: right after .dynsym
	strSize    uint64 // apparent size of .dynstr; 0: 4 KiB
	syms       []rawSym
	strs       []byte // written at the start of .dynstr
}

const (
	hostileShoff  = 0x1000
	hostileDynsym = 0x10000
)

// write makes the sparse file in dir and returns its path.
func (h hostile) write(t *testing.T) string {
	t.Helper()
	le := binary.LittleEndian
	if h.strSize == 0 {
		h.strSize = 4096
	}
	if h.strOff == 0 {
		h.strOff = hostileDynsym + h.dynsymSize
	}
	path := filepath.Join(t.TempDir(), "libcudart.so.12")
	fd, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fd.Close()
	var eh [ehdrSize]byte
	copy(eh[:], []byte{0x7f, 'E', 'L', 'F', byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT)})
	le.PutUint16(eh[16:], uint16(elf.ET_DYN))
	le.PutUint16(eh[18:], uint16(elf.EM_X86_64))
	le.PutUint32(eh[20:], uint32(elf.EV_CURRENT))
	le.PutUint64(eh[32:], ehdrSize)
	le.PutUint64(eh[40:], hostileShoff)
	le.PutUint16(eh[52:], ehdrSize)
	le.PutUint16(eh[54:], phdrSize)
	le.PutUint16(eh[56:], h.phnum)
	le.PutUint16(eh[58:], shdrSize)
	le.PutUint16(eh[60:], 3)
	write := func(b []byte, off uint64) {
		if _, err := fd.WriteAt(b, int64(off)); err != nil {
			t.Fatal(err)
		}
	}
	write(eh[:], 0)
	// One executable PT_LOAD over the first 64 KiB; the other program
	// headers are holes (PT_NULL).
	var ph [phdrSize]byte
	le.PutUint32(ph[0:], uint32(elf.PT_LOAD))
	le.PutUint32(ph[4:], uint32(elf.PF_R|elf.PF_X))
	le.PutUint64(ph[32:], hostileDynsym)
	if h.phnum > 0 {
		write(ph[:], ehdrSize)
	}
	sh := make([]byte, 3*shdrSize)
	le.PutUint32(sh[shdrSize+4:], uint32(elf.SHT_DYNSYM))
	le.PutUint64(sh[shdrSize+24:], hostileDynsym)
	le.PutUint64(sh[shdrSize+32:], h.dynsymSize)
	le.PutUint32(sh[shdrSize+40:], 2)
	le.PutUint64(sh[shdrSize+56:], symSize)
	le.PutUint32(sh[2*shdrSize+4:], uint32(elf.SHT_STRTAB))
	le.PutUint64(sh[2*shdrSize+24:], h.strOff)
	le.PutUint64(sh[2*shdrSize+32:], h.strSize)
	write(sh, hostileShoff)
	for i, s := range h.syms {
		var b [symSize]byte
		le.PutUint32(b[0:], s.name)
		b[4] = s.info
		le.PutUint16(b[6:], s.shndx)
		le.PutUint64(b[8:], s.value)
		le.PutUint64(b[16:], s.size)
		write(b[:], hostileDynsym+uint64(i+1)*symSize)
	}
	if len(h.strs) > 0 {
		write(h.strs, h.strOff)
	}
	end := max(hostileDynsym+h.dynsymSize, h.strOff+h.strSize)
	if end >= 1<<40 { // a table past the end of the file
		end = hostileDynsym + h.dynsymSize
	}
	if err := fd.Truncate(int64(end)); err != nil {
		t.Fatal(err)
	}
	return path
}

var funcInfo = elf.ST_INFO(elf.STB_GLOBAL, elf.STT_FUNC)

// allocated runs fn and returns the bytes it allocated (TotalAlloc delta:
// every allocation counts, freed or not). The hostile tests do not run in
// parallel, so nothing else allocates meanwhile.
func allocated(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// Bounds asserted below. A file is read in 64 KiB reads (one symbol
// chunk, one string window), so a lookup in any file allocates about
// 128 KiB plus its result; debug/elf allocated 394 MiB for the 64 MiB
// sparse .dynsym and 1.56 GiB for the 256 MiB one (issue 17).
const (
	lookupAllocBound = 512 << 10
	openAllocBound   = 64 << 10
)

func openPath(t *testing.T, path string) (*File, error) {
	t.Helper()
	fd, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fd.Close() })
	st, err := fd.Stat()
	if err != nil {
		t.Fatal(err)
	}
	return Open(fd, st.Size())
}

func TestHostileSparseDynsym(t *testing.T) {
	name := []byte("\x00cudaLaunchKernel\x00")
	real := rawSym{name: 1, info: funcInfo, shndx: 1, value: 0x2000, size: 16}

	t.Run("64 MiB apparent: scanned in bounded reads", func(t *testing.T) {
		path := hostile{phnum: 1, dynsymSize: MaxSymtabBytes / symSize * symSize, syms: []rawSym{real}, strs: name}.write(t)
		var (
			f    *File
			syms map[string]Symbol
			err  error
		)
		n := allocated(func() {
			if f, err = openPath(t, path); err != nil {
				return
			}
			syms, err = f.Lookup([]string{"cudaLaunchKernel", "cudaMalloc"})
		})
		if err != nil {
			t.Fatal(err)
		}
		if got := syms["cudaLaunchKernel"]; len(syms) != 1 || got.Value != 0x2000 {
			t.Fatalf("Lookup = %v, want cudaLaunchKernel at 0x2000 only", syms)
		}
		if n > lookupAllocBound {
			t.Errorf("Open and Lookup allocated %d bytes, bound %d", n, lookupAllocBound)
		}
		all, skipped, err := f.Funcs(DynSym, 10, nil)
		if err != nil || skipped != 0 || len(all) != 1 {
			t.Errorf("Funcs = %v, %d skipped, %v", all, skipped, err)
		}
		t.Logf("64 MiB apparent .dynsym: Open and Lookup allocated %d bytes", n)
	})

	t.Run("256 MiB apparent: refused at Open", func(t *testing.T) {
		path := hostile{phnum: 1, dynsymSize: 256 << 20, syms: []rawSym{real}, strs: name}.write(t)
		var err error
		n := allocated(func() { _, err = openPath(t, path) })
		if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), ".dynsym: 268435456 bytes, more than 67108864") {
			t.Fatalf("err = %v, want ErrTooLarge naming the size and the cap", err)
		}
		if n > openAllocBound {
			t.Errorf("Open allocated %d bytes, bound %d", n, openAllocBound)
		}
	})

	t.Run("65,000 program headers", func(t *testing.T) {
		path := hostile{phnum: 65000, dynsymSize: 20000 * symSize}.write(t)
		var err error
		n := allocated(func() { _, err = openPath(t, path) })
		if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "65000 program headers, more than 256") {
			t.Fatalf("err = %v, want ErrTooLarge", err)
		}
		if n > openAllocBound {
			t.Errorf("Open allocated %d bytes, bound %d", n, openAllocBound)
		}
	})

	t.Run("string table offset past the end", func(t *testing.T) {
		path := hostile{phnum: 1, dynsymSize: 4096 * symSize, strOff: 1 << 40}.write(t)
		_, err := openPath(t, path)
		if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "section 2 [0x10000000000, +0x1000) past the end") {
			t.Fatalf("err = %v, want ErrMalformed naming the section", err)
		}
	})

	t.Run("1 GiB apparent string table", func(t *testing.T) {
		path := hostile{phnum: 1, dynsymSize: 4096 * symSize, strSize: 1 << 30}.write(t)
		_, err := openPath(t, path)
		if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), ".dynsym strings: 1073741824 bytes, more than 268435456") {
			t.Fatalf("err = %v, want ErrTooLarge", err)
		}
	})

	t.Run("name offsets past the string table", func(t *testing.T) {
		bad := real
		bad.name = 0xffffffff
		path := hostile{phnum: 1, dynsymSize: 16 * symSize, syms: []rawSym{bad}, strs: name}.write(t)
		f, err := openPath(t, path)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Lookup([]string{"cudaLaunchKernel"}); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "string offset 0xffffffff past the string table") {
			t.Fatalf("Lookup: err = %v, want ErrMalformed", err)
		}
	})

	t.Run("unterminated names are skipped and counted", func(t *testing.T) {
		long := append([]byte{0}, bytes.Repeat([]byte{'A'}, 2*MaxNameLen)...)
		syms := make([]rawSym, 1000)
		for i := range syms {
			syms[i] = rawSym{name: 1, info: funcInfo, shndx: 1, value: 0x2000, size: 1}
		}
		path := hostile{phnum: 1, dynsymSize: 2000 * symSize, strSize: 200 << 20, syms: syms, strs: long}.write(t)
		f, err := openPath(t, path)
		if err != nil {
			t.Fatal(err)
		}
		var got []Symbol
		var skipped int
		n := allocated(func() { got, skipped, err = f.Funcs(DynSym, 1<<20, nil) })
		if err != nil || len(got) != 0 || skipped != 1000 {
			t.Fatalf("Funcs = %d symbols, %d skipped, %v; want 0, 1000, nil", len(got), skipped, err)
		}
		if n > lookupAllocBound {
			t.Errorf("Funcs allocated %d bytes, bound %d", n, lookupAllocBound)
		}
	})

	t.Run("one long name shared by many symbols", func(t *testing.T) {
		long := append(append([]byte{0}, bytes.Repeat([]byte{'B'}, MaxNameLen-1)...), 0)
		syms := make([]rawSym, 10000) // 10000 x 8 KiB = 80 MiB of names
		for i := range syms {
			syms[i] = rawSym{name: 1, info: funcInfo, shndx: 1, value: 0x2000, size: 1}
		}
		path := hostile{phnum: 1, dynsymSize: uint64(len(syms)+1) * symSize, strSize: 64 << 10, syms: syms, strs: long}.write(t)
		f, err := openPath(t, path)
		if err != nil {
			t.Fatal(err)
		}
		var got []Symbol
		n := allocated(func() { got, _, err = f.Funcs(DynSym, 1<<20, nil) })
		if !errors.Is(err, ErrLimit) || !strings.Contains(err.Error(), "more than 67108864 bytes of names") {
			t.Fatalf("err = %v, want ErrLimit on name bytes", err)
		}
		if want := MaxNameBytes / (MaxNameLen - 1); len(got) != want {
			t.Errorf("%d symbols before the cap, want %d", len(got), want)
		}
		if bound := uint64(MaxNameBytes + 4<<20); n > bound {
			t.Errorf("Funcs allocated %d bytes, bound %d (MaxNameBytes + 4 MiB)", n, bound)
		}
	})
}
