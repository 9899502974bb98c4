package elfsym

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// libSrc is a small shared library: plain functions, a data object, a
// versioned function with a default and a hidden version (as NVIDIA's
// libcudart exports cudaLaunchKernel@@libcudart.so.11.0), and a static one.
const libSrc = `
int counter;
int cudaLaunchKernel(void) { return 1; }
int cudaMalloc(void) { return 2; }
int old_impl(void) { return 3; }
int new_impl(void) { return 4; }
__asm__(".symver old_impl,versioned@V1");
__asm__(".symver new_impl,versioned@@V2");
static int hidden_helper(void) { return 5; }
int __cudaRegisterFunction(void) { return hidden_helper(); }
`

const libMap = `V1 { global: versioned; local: old_impl; new_impl; }; V2 { global: versioned; cudaLaunchKernel; cudaMalloc; __cudaRegisterFunction; counter; } V1;`

// libs are the built variants of libSrc, by name: one per hash style,
// with and without CET (endbr64).
type libs map[string]string

var (
	buildOnce sync.Once
	built     libs
	buildErr  error
)

func buildLibs(t testing.TB) libs {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc not found: cannot build test libraries")
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "elfsym")
		if err != nil {
			buildErr = err
			return
		}
		src, vmap := filepath.Join(dir, "lib.c"), filepath.Join(dir, "lib.map")
		if err := os.WriteFile(src, []byte(libSrc), 0o644); err != nil {
			buildErr = err
			return
		}
		if err := os.WriteFile(vmap, []byte(libMap), 0o644); err != nil {
			buildErr = err
			return
		}
		built = libs{}
		for name, flags := range map[string][]string{
			"gnu":      {"-Wl,--hash-style=gnu"},
			"sysv":     {"-Wl,--hash-style=sysv"},
			"both":     {"-Wl,--hash-style=both"},
			"cet":      {"-Wl,--hash-style=gnu", "-fcf-protection=full"},
			"stripped": {"-Wl,--hash-style=gnu", "-s"},
		} {
			out := filepath.Join(dir, "lib"+name+".so")
			args := append([]string{"-shared", "-fPIC", "-O1", "-o", out, src, "-Wl,--version-script=" + vmap}, flags...)
			if b, err := exec.Command("gcc", args...).CombinedOutput(); err != nil {
				buildErr = fmt.Errorf("gcc %v: %v\n%s", args, err, b)
				return
			}
			built[name] = out
		}
		exe := filepath.Join(dir, "static-runtime")
		cmd := exec.Command("gcc", "-O1", "-rdynamic", "-o", exe, "-x", "c", "-")
		cmd.Stdin = strings.NewReader("int cudaLaunchKernel(void){return 7;}\nint main(void){return cudaLaunchKernel()-7;}\n")
		if b, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("gcc executable: %v\n%s", err, b)
			return
		}
		built["exe"] = exe
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return built
}

func openFile(t testing.TB, path string) (*File, *os.File) {
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
	f, err := Open(fd, st.Size())
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	return f, fd
}

// groundTruth is what debug/elf says: the defined functions of a table,
// by name (the default version where there are several).
func groundTruth(t testing.TB, path string, table Table) map[string]elf.Symbol {
	t.Helper()
	ef, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	var syms []elf.Symbol
	if table == DynSym {
		syms, err = ef.DynamicSymbols()
	} else {
		syms, err = ef.Symbols()
	}
	if err != nil && !errors.Is(err, elf.ErrNoSymbols) {
		t.Fatal(err)
	}
	out := map[string]elf.Symbol{}
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) != elf.STT_FUNC || s.Section == elf.SHN_UNDEF || s.Value == 0 || s.Name == "" {
			continue
		}
		if prev, ok := out[s.Name]; ok && (!prev.HasVersion || prev.VersionIndex&0x8000 == 0) {
			continue // keep the first, unless it was a hidden version
		}
		out[s.Name] = s
	}
	return out
}

func TestLookupAgainstDebugELF(t *testing.T) {
	t.Parallel()
	l := buildLibs(t)
	names := []string{"cudaLaunchKernel", "cudaMalloc", "versioned", "__cudaRegisterFunction", "counter", "hidden_helper", "old_impl", "absent", ""}
	for _, variant := range []string{"gnu", "sysv", "both", "cet", "stripped"} {
		t.Run(variant, func(t *testing.T) {
			t.Parallel()
			path := l[variant]
			f, _ := openFile(t, path)
			switch variant {
			case "sysv":
				if f.gnuHash != nil || f.sysHash == nil {
					t.Fatalf("sysv build: gnu %v sysv %v", f.gnuHash != nil, f.sysHash != nil)
				}
			case "both", "gnu", "cet", "stripped":
				if f.gnuHash == nil {
					t.Fatal("no .gnu.hash found")
				}
			}
			got, err := f.Lookup(names)
			if err != nil {
				t.Fatal(err)
			}
			truth := groundTruth(t, path, DynSym)
			want := map[string]Symbol{}
			for _, n := range names {
				if s, ok := truth[n]; ok {
					want[n] = Symbol{Name: n, Value: s.Value, Size: s.Size, Bind: elf.ST_BIND(s.Info)}
				}
			}
			// The exported functions, and the default version of "versioned".
			for _, n := range []string{"cudaLaunchKernel", "cudaMalloc", "versioned", "__cudaRegisterFunction"} {
				if _, ok := want[n]; !ok {
					t.Fatalf("debug/elf finds no %s: the test library is wrong", n)
				}
			}
			if len(want) != 4 {
				t.Errorf("debug/elf finds %d of the names, want 4: %v", len(want), want)
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("Lookup = %v\nwant     %v", got, want)
			}
			// The same through the linear scan (no hash table).
			g, s := f.gnuHash, f.sysHash
			f.gnuHash, f.sysHash = nil, nil
			scanned, err := f.Lookup(names)
			f.gnuHash, f.sysHash = g, s
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(scanned) != fmt.Sprint(want) {
				t.Errorf("Lookup by scan = %v\nwant             %v", scanned, want)
			}
		})
	}
}

func TestFuncsAgainstDebugELF(t *testing.T) {
	t.Parallel()
	l := buildLibs(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	paths := []string{l["gnu"], l["exe"], self}
	for _, p := range []string{"/usr/lib/x86_64-linux-gnu/libc.so.6", "/bin/true"} {
		if _, err := os.Stat(p); err == nil {
			paths = append(paths, p)
		}
	}
	for _, path := range paths {
		for _, table := range []Table{DynSym, SymTab} {
			t.Run(filepath.Base(path)+table.String(), func(t *testing.T) {
				t.Parallel()
				f, _ := openFile(t, path)
				got, skipped, err := f.Funcs(table, 1<<20, nil)
				truth := groundTruth(t, path, table)
				if errors.Is(err, ErrNoSymbols) {
					if len(truth) != 0 {
						t.Fatalf("ErrNoSymbols, but debug/elf finds %d functions", len(truth))
					}
					return
				}
				if err != nil || skipped != 0 {
					t.Fatalf("Funcs: %v (skipped %d)", err, skipped)
				}
				gotNames := map[string]bool{}
				for _, s := range got {
					gotNames[s.Name] = true
				}
				if len(gotNames) != len(truth) {
					t.Errorf("%d distinct names, debug/elf %d", len(gotNames), len(truth))
				}
				for n, s := range truth {
					if !gotNames[n] {
						t.Errorf("missing %s", n)
						continue
					}
					if i := slices.IndexFunc(got, func(g Symbol) bool { return g.Name == n && g.Value == s.Value && g.Size == s.Size }); i < 0 {
						t.Errorf("%s: no symbol with value %#x size %d", n, s.Value, s.Size)
					}
				}
			})
		}
	}
}

func TestFuncsFilterAndLimit(t *testing.T) {
	t.Parallel()
	f, _ := openFile(t, buildLibs(t)["exe"])
	// Static-runtime detection: does the executable define cudaLaunchKernel itself?
	keep := func(n []byte) bool { return string(n) == "cudaLaunchKernel" || string(n) == "__cudaRegisterFunction" }
	got, _, err := f.Funcs(SymTab, 10, keep)
	if err != nil || len(got) != 1 || got[0].Name != "cudaLaunchKernel" {
		t.Fatalf("Funcs(keep) = %v, %v; want cudaLaunchKernel only", got, err)
	}
	all, _, err := f.Funcs(SymTab, 1<<20, nil)
	if err != nil || len(all) < 3 {
		t.Fatalf("Funcs = %d symbols, %v", len(all), err)
	}
	first, _, err := f.Funcs(SymTab, 2, nil)
	if !errors.Is(err, ErrLimit) || !strings.Contains(err.Error(), "more than 2 functions") {
		t.Fatalf("err = %v, want ErrLimit naming the cap", err)
	}
	if !slices.Equal(first, all[:2]) {
		t.Errorf("with the limit hit: %v, want the first two %v", first, all[:2])
	}
}

func TestOffsetAndCode(t *testing.T) {
	t.Parallel()
	l := buildLibs(t)
	for variant, wantEndbr := range map[string]bool{"gnu": false, "cet": true} {
		t.Run(variant, func(t *testing.T) {
			t.Parallel()
			path := l[variant]
			f, fd := openFile(t, path)
			syms, err := f.Lookup([]string{"cudaMalloc"})
			if err != nil {
				t.Fatal(err)
			}
			s := syms["cudaMalloc"]
			off, ok := f.Offset(s.Value)
			if !ok {
				t.Fatalf("no file offset for %#x", s.Value)
			}
			// Ground truth: the executable PT_LOAD of debug/elf.
			ef, err := elf.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer ef.Close()
			var want uint64
			for _, p := range ef.Progs {
				if p.Type == elf.PT_LOAD && p.Flags&elf.PF_X != 0 && s.Value >= p.Vaddr && s.Value < p.Vaddr+p.Filesz {
					want = s.Value - p.Vaddr + p.Off
				}
			}
			if off != want || off == 0 {
				t.Errorf("Offset(%#x) = %#x, want %#x", s.Value, off, want)
			}
			code, err := f.Code(s.Value, 8)
			if err != nil {
				t.Fatal(err)
			}
			raw := make([]byte, 8)
			if _, err := fd.ReadAt(raw, int64(want)); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(code, raw) {
				t.Errorf("Code = % x, file bytes % x", code, raw)
			}
			if got := bytes.HasPrefix(code, []byte{0xf3, 0x0f, 0x1e, 0xfa}); got != wantEndbr {
				t.Errorf("endbr64 first: %v, want %v (% x)", got, wantEndbr, code)
			}
			if _, ok := f.Offset(0); ok {
				t.Error("Offset(0) found code")
			}
			if _, err := f.Code(s.Value, MaxCode+1); err == nil {
				t.Error("Code past MaxCode succeeded")
			}
		})
	}
}

func TestOpenErrors(t *testing.T) {
	t.Parallel()
	good, err := os.ReadFile(buildLibs(t)["gnu"])
	if err != nil {
		t.Fatal(err)
	}
	hdr := func(off int, size int, v uint64) []byte { return patch(good, off, size, v) }
	tests := []struct {
		name string
		data []byte
		want error
		text string
	}{
		{"empty", nil, ErrNotELF, ""},
		{"text", []byte("#!/bin/sh\n"), ErrNotELF, ""},
		{"magic only", []byte("\x7fELF but not really"), ErrMalformed, "shorter than the ELF header"},
		{"32-bit", hdr(4, 1, 1), ErrUnsupported, "ELFCLASS32"},
		{"big endian", hdr(5, 1, 2), ErrUnsupported, "ELFDATA2MSB"},
		{"relocatable", hdr(16, 2, uint64(elf.ET_REL)), ErrUnsupported, "ET_REL"},
		{"65000 program headers", hdr(56, 2, 65000), ErrTooLarge, "65000 program headers, more than 256"},
		{"program headers past the end", hdr(32, 8, uint64(len(good))), ErrMalformed, "past the end"},
		{"section headers past the end", hdr(40, 8, 1<<40), ErrMalformed, "past the end"},
		{"5000 sections", hdr(60, 2, 5000), ErrTooLarge, "5000 section headers, more than 4096"},
		{"bad phentsize", hdr(54, 2, 32), ErrMalformed, "program header size 32"},
		{"truncated", good[:len(good)/2], ErrMalformed, "past the end"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := Open(bytes.NewReader(tc.data), int64(len(tc.data)))
			if !errors.Is(err, tc.want) || !strings.Contains(fmt.Sprint(err), tc.text) {
				t.Fatalf("err = %v, want %v with %q", err, tc.want, tc.text)
			}
		})
	}
}

func TestVersionedSymbolPrefersDefault(t *testing.T) {
	t.Parallel()
	path := buildLibs(t)["gnu"]
	f, _ := openFile(t, path)
	got, err := f.Lookup([]string{"versioned"})
	if err != nil {
		t.Fatal(err)
	}
	ef, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	syms, _ := ef.DynamicSymbols()
	var def, old uint64
	for _, s := range syms {
		if s.Name == "versioned" {
			if s.VersionIndex&0x8000 != 0 {
				old = s.Value
			} else {
				def = s.Value
			}
		}
	}
	if def == 0 || old == 0 || def == old {
		t.Fatalf("test library: default %#x, hidden %#x", def, old)
	}
	if got["versioned"].Value != def {
		t.Errorf("versioned = %#x, want the default version %#x (hidden %#x)", got["versioned"].Value, def, old)
	}
}

// patch returns a copy of b with the little-endian v in size bytes at off.
func patch(b []byte, off, size int, v uint64) []byte {
	c := bytes.Clone(b)
	for i := range size {
		c[off+i] = byte(v >> (8 * i))
	}
	return c
}
