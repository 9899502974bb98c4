package elfsym

import (
	"bytes"
	"os"
	"testing"
)

// fuzzSeeds are real files built by gcc (every hash style, an executable)
// and corrupt variants of one of them: the headers patched to hostile
// values, truncations.
func fuzzSeeds(f *testing.F) [][]byte {
	l := buildLibs(f)
	var seeds [][]byte
	for _, name := range []string{"gnu", "sysv", "both", "cet", "stripped", "exe"} {
		b, err := os.ReadFile(l[name])
		if err != nil {
			f.Fatal(err)
		}
		seeds = append(seeds, b)
	}
	g := seeds[0]
	seeds = append(seeds,
		patch(g, 56, 2, 0xffff), // e_phnum: PN_XNUM
		patch(g, 60, 2, 0),      // e_shnum 0: extended numbering
		patch(g, 62, 2, 0xffff), // e_shstrndx: SHN_XINDEX
		patch(g, 40, 8, 1<<62),  // e_shoff
		g[:len(g)-100], g[:200], // truncated
		[]byte("\x7fELF"),
	)
	return seeds
}

var fuzzNames = []string{"cudaLaunchKernel", "cudaMalloc", "versioned", "__cudaRegisterFunction", "main", "x"}

// FuzzOpen: any bytes open or fail with an error; what opens can be
// looked up, iterated and read without panics and within the caps.
func FuzzOpen(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		ef, err := Open(bytes.NewReader(data), int64(len(data)))
		if err != nil {
			return
		}
		if len(ef.segs) > MaxProgs {
			t.Fatalf("%d segments", len(ef.segs))
		}
		syms, _ := ef.Lookup(fuzzNames)
		for _, s := range syms {
			if off, ok := ef.Offset(s.Value); ok && off >= uint64(len(data)) {
				t.Fatalf("offset %#x past the file (%d bytes)", off, len(data))
			}
			_, _ = ef.Code(s.Value, 6)
		}
		for _, tab := range []Table{DynSym, SymTab} {
			got, _, _ := ef.Funcs(tab, 100, nil)
			if len(got) > 100 {
				t.Fatalf("%d symbols past the limit of 100", len(got))
			}
		}
	})
}

// FuzzLookup: a real library with a fuzzed name, and fuzzed bytes patched
// into its hash table region: lookups end, and find only defined
// functions of that name.
func FuzzLookup(f *testing.F) {
	seeds := fuzzSeeds(f)
	for _, s := range seeds[:3] {
		for _, n := range fuzzNames {
			f.Add(s, n, uint16(0), []byte{})
		}
	}
	f.Add(seeds[0], "cudaMalloc", uint16(0x200), []byte{0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte, name string, at uint16, patchBytes []byte) {
		data = bytes.Clone(data)
		if int(at) < len(data) {
			copy(data[at:], patchBytes)
		}
		ef, err := Open(bytes.NewReader(data), int64(len(data)))
		if err != nil {
			return
		}
		syms, err := ef.Lookup([]string{name})
		if err != nil {
			return
		}
		if s, ok := syms[name]; ok && (s.Name != name || s.Value == 0) {
			t.Fatalf("Lookup(%q) = %+v", name, s)
		}
		if len(syms) > 1 {
			t.Fatalf("Lookup of one name returned %d", len(syms))
		}
	})
}
