package kernelname

import (
	"bufio"
	"bytes"
	"cmp"
	"debug/elf"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/profi-dev/profi/internal/discover"
	"github.com/profi-dev/profi/internal/elfsym"
)

func TestReadSymtab(t *testing.T) {
	t.Parallel()
	lookups := []struct {
		vaddr uint64
		want  string // "" = no symbol
	}{
		{tinyText, "_Z3fooi"}, // the GLOBAL name wins over the LOCAL alias
		{tinyText + 0xf, "_Z3fooi"},
		{tinyText + 0x10, "_ZN4vllm25paged_attention_v1_kernelIfEEvPf"},
		{tinyText + 0x24, ""}, // an OBJECT symbol is not a function
		{tinyText + 0x30, "exact"},
		{tinyText + 0x31, ""}, // size 0: exact address only
		{tinyText + 0x38, ""}, // undefined symbols are skipped
		{tinyTextOff, "decoy"},
		{0, ""},
		{^uint64(0), ""},
	}
	for _, o := range []tinyOpts{{}, {dynsym: true}} {
		t.Run(fmt.Sprintf("dynsym=%v", o.dynsym), func(t *testing.T) {
			t.Parallel()
			data := tinyELF(o)
			tab, err := readSymtab(bytes.NewReader(data), int64(len(data)))
			if err != nil {
				t.Fatal(err)
			}
			if want := []segment{{off: 0, filesz: tinyTextOff + tinyTextLen, vaddr: tinyBase}}; !reflect.DeepEqual(tab.segs, want) {
				t.Errorf("segments = %+v, want %+v", tab.segs, want)
			}
			for _, l := range lookups {
				got, ok := tab.lookup(l.vaddr)
				if got != l.want || ok != (l.want != "") {
					t.Errorf("lookup(%#x) = %q, %v; want %q", l.vaddr, got, ok, l.want)
				}
			}
			// File offset → virtual address through the PT_LOAD.
			if v, ok := tab.vaddr(tinyTextOff + 4); !ok || v != tinyText+4 {
				t.Errorf("vaddr(%#x) = %#x, %v; want %#x", tinyTextOff+4, v, ok, tinyText+4)
			}
			if _, ok := tab.vaddr(tinyTextOff + tinyTextLen); ok {
				t.Errorf("vaddr past the segment's file size succeeded")
			}
		})
	}
}

// panicReader panics on every read, standing in for a debug/elf bug.
type panicReader struct{}

func (panicReader) ReadAt([]byte, int64) (int, error) { panic("boom") }

func TestReadSymtabMalformed(t *testing.T) {
	t.Parallel()
	tiny := tinyELF(tinyOpts{})
	for name, data := range corruptSeeds(tiny) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			tab, err := readSymtab(bytes.NewReader(data), int64(len(data)))
			if err == nil && tab == nil {
				t.Fatal("nil table without an error")
			}
		})
	}
	t.Run("parser panic", func(t *testing.T) {
		t.Parallel()
		if _, err := readSymtab(panicReader{}, 1<<20); err == nil || !strings.Contains(err.Error(), "panicked") {
			t.Fatalf("err = %v, want the recovered panic", err)
		}
	})
	t.Run("not ELF", func(t *testing.T) {
		t.Parallel()
		const script = "#!/bin/sh\nexec true\n"
		if _, err := readSymtab(strings.NewReader(script), int64(len(script))); !errors.Is(err, elfsym.ErrNotELF) {
			t.Fatalf("err = %v, want elfsym.ErrNotELF", err)
		}
	})
}

// corruptSeeds are malformed variants of the tiny ELF; they are also
// FuzzSymbols seeds (see TestFuzzSeeds).
func corruptSeeds(tiny []byte) map[string][]byte {
	shoff := int(binaryLE64(tiny[offShoff:]))
	symtabShdr := shoff + 2*64
	return map[string][]byte{
		"shoff-past-end":   patched(tiny, offShoff, 8, 1<<40),
		"shnum-huge":       patched(tiny, offShnum, 2, 0xffff),
		"phnum-huge":       patched(tiny, offPhnum, 2, 0xffff),
		"symtab-size-huge": patched(tiny, symtabShdr+32, 8, 1<<62),
		"symtab-bad-link":  patched(tiny, symtabShdr+40, 4, 0xffff),
		"truncated":        tiny[:200],
		"magic-only":       []byte("\x7fELF"),
		"elf32-header":     append([]byte("\x7fELF\x01\x01\x01"), make([]byte, 45)...),
	}
}

func binaryLE64(b []byte) uint64 {
	var v uint64
	for i := 7; i >= 0; i-- {
		v = v<<8 | uint64(b[i])
	}
	return v
}

// fakeProc builds a procfs root with process pid: its maps, and the files
// under its root directory.
type fakeProc struct {
	root string
	pid  int
}

func newFakeProc(t *testing.T, pid int, maps []string, files map[string][]byte) fakeProc {
	t.Helper()
	p := fakeProc{root: t.TempDir(), pid: pid}
	dir := filepath.Join(p.root, strconv.Itoa(pid))
	for name, data := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, "root"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "maps"), []byte(strings.Join(maps, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// The fake process maps the tiny ELF's first page at tinyMap: the runtime
// address tinyMap+off is file offset off, ELF address tinyBase+off.
const tinyMap = 0x7f0000001000

var fakeMaps = []string{
	"00400000-00401000 r--p 00000000 08:01 1200 /bin/app",
	"7f0000001000-7f0000002000 r-xp 00000000 08:01 1234 /lib/libtiny.so",
	"7f0000002000-7f0000003000 r--p 00001000 08:01 1234 /lib/libtiny.so",
	"7f0000003000-7f0000004000 rw-p 00000000 00:00 0",
	"7f0000004000-7f0000005000 r-xp 00000000 08:01 1236 /lib/notelf.so",
	"7f0000005000-7f0000006000 r-xp 00000000 08:01 1237 /lib/missing.so",
	"7f0000006000-7f0000007000 r-xp 00000000 08:01 1238 /lib/" + strings.Repeat("x", 20000) + ".so",
	"7f0000008000-7f0000009000 r-xp 00000000 08:01 1235 /lib/libold.so (deleted)",
	"7f000000a000-7f000000b000 r-xp 00000000 08:01 1239 /lib/libstripped.so",
	"7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0 [stack]",
}

func fakeFiles() map[string][]byte {
	return map[string][]byte{
		"root/bin/app":                        []byte("not resolved in these tests"),
		"root/lib/libtiny.so":                 tinyELF(tinyOpts{}),
		"root/lib/libstripped.so":             tinyELF(tinyOpts{dynsym: true}),
		"root/lib/notelf.so":                  []byte("#!/bin/sh\nexit 0\n"),
		"root/lib/libold.so":                  []byte("a new file at the old path"),
		"map_files/7f0000008000-7f0000009000": tinyELF(tinyOpts{}),
	}
}

func TestResolveFakeProc(t *testing.T) {
	requireLinux(t) // discover.OpenInRoot
	t.Parallel()
	p := newFakeProc(t, 42, fakeMaps, fakeFiles())
	s := NewSymbolizer(p.root, 4)
	tests := []struct {
		name    string
		addr    uint64
		want    string
		wantErr error
	}{
		{name: "start of a function", addr: tinyMap + tinyTextOff, want: "_Z3fooi"},
		{name: "inside a function", addr: tinyMap + tinyTextOff + 0x13, want: "_ZN4vllm25paged_attention_v1_kernelIfEEvPf"},
		{name: "size-0 symbol", addr: tinyMap + tinyTextOff + 0x30, want: "exact"},
		{name: "between symbols", addr: tinyMap + tinyTextOff + 0x24, wantErr: ErrNoSymbol},
		{name: "offset outside the loadable segments", addr: 0x7f0000002010, wantErr: ErrNoSymbol},
		{name: ".dynsym of a stripped file", addr: 0x7f000000a000 + tinyTextOff, want: "_Z3fooi"},
		{name: "deleted file through map_files", addr: 0x7f0000008000 + tinyTextOff + 0x10, want: "_ZN4vllm25paged_attention_v1_kernelIfEEvPf"},
		{name: "anonymous memory", addr: 0x7f0000003100, wantErr: ErrNoMapping},
		{name: "stack", addr: 0x7ffc00000100, wantErr: ErrNoMapping},
		{name: "below every mapping", addr: 0x1000, wantErr: ErrNoMapping},
		{name: "above every mapping", addr: 0xffffffffffffff00, wantErr: ErrNoMapping},
		{name: "gap between mappings", addr: 0x7f0000007800, wantErr: ErrNoMapping},
		{name: "overlong maps line skipped", addr: 0x7f0000006100, wantErr: ErrNoMapping},
		{name: "missing file", addr: 0x7f0000005100, wantErr: fs.ErrNotExist},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := s.Resolve(p.pid, tc.addr)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) || got != "" {
					t.Fatalf("Resolve(%#x) = %q, %v; want error %v", tc.addr, got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("Resolve(%#x) = %q, %v; want %q", tc.addr, got, err, tc.want)
			}
		})
	}

	t.Run("not ELF", func(t *testing.T) {
		_, err := s.Resolve(p.pid, 0x7f0000004100)
		if !errors.Is(err, ErrNotELF) || !errors.Is(err, elfsym.ErrNotELF) || errors.Is(err, ErrNoSymbol) {
			t.Fatalf("err = %v, want ErrNotELF with elfsym's error", err)
		}
	})
	t.Run("process gone", func(t *testing.T) {
		_, err := s.Resolve(4242, tinyMap+tinyTextOff)
		if !errors.Is(err, discover.ErrProcessGone) {
			t.Fatalf("err = %v, want ErrProcessGone", err)
		}
	})
	t.Run("invalid pid", func(t *testing.T) {
		if _, err := s.Resolve(0, tinyMap); err == nil {
			t.Fatal("no error for pid 0")
		}
	})
}

// TestSymbolizerCache checks that a file is parsed once per (dev, inode)
// while cached, across processes, and again after eviction; failures to
// parse are cached too.
func TestSymbolizerCache(t *testing.T) {
	requireLinux(t) // discover.OpenInRoot
	t.Parallel()
	p := newFakeProc(t, 42, fakeMaps, fakeFiles())
	// Process 43 maps the same file (same dev/inode) at another address.
	other := filepath.Join(p.root, "43")
	if err := os.MkdirAll(filepath.Join(other, "root", "lib"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(other, "maps"),
		[]byte("7e0000000000-7e0000001000 r-xp 00000000 08:01 1234 /lib/libtiny.so\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	s := NewSymbolizer(p.root, 1)
	resolve := func(pid int, addr uint64, wantParses int64) {
		t.Helper()
		if _, err := s.Resolve(pid, addr); err != nil && !errors.Is(err, ErrNotELF) {
			t.Fatalf("Resolve(%d, %#x): %v", pid, addr, err)
		}
		if got := s.parses.Load(); got != wantParses {
			t.Fatalf("after Resolve(%d, %#x): %d parses, want %d", pid, addr, got, wantParses)
		}
	}
	tiny := uint64(tinyMap + tinyTextOff)
	resolve(42, tiny, 1)
	resolve(42, tiny+0x10, 1)
	resolve(43, 0x7e0000000000+tinyTextOff, 1) // other process, same file: no file is opened
	resolve(42, 0x7f000000a000+tinyTextOff, 2) // another file evicts the first
	resolve(42, tiny, 3)
	resolve(42, 0x7f0000004100, 4) // not ELF
	resolve(42, 0x7f0000004100, 4) // the failure is cached

	s = NewSymbolizer(p.root, 2)
	resolve(42, tiny, 1)
	resolve(42, 0x7f000000a000+tinyTextOff, 2)
	resolve(42, tiny, 2)

	if s := NewSymbolizer("", 0); s.capacity != DefaultCacheFiles || s.procRoot != "/proc" {
		t.Errorf("NewSymbolizer(\"\", 0) = capacity %d, root %q", s.capacity, s.procRoot)
	}
}

func TestSymbolizerConcurrent(t *testing.T) {
	requireLinux(t) // discover.OpenInRoot
	t.Parallel()
	p := newFakeProc(t, 42, fakeMaps, fakeFiles())
	s := NewSymbolizer(p.root, 1)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 50 {
				addr := uint64(tinyMap + tinyTextOff)
				want := "_Z3fooi"
				if (i+j)%2 == 1 {
					addr = 0x7f000000a000 + tinyTextOff
				}
				if got, err := s.Resolve(42, addr); err != nil || got != want {
					t.Errorf("Resolve(%#x) = %q, %v", addr, got, err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// TestResolveSelf resolves a function of the test binary itself: a Go
// executable whose text segment's address differs from its file offset
// (non-PIE) or is moved by a load bias (PIE).
func TestResolveSelf(t *testing.T) {
	requireLinux(t)
	t.Parallel()
	exe, err := os.Open("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	st, err := exe.Stat()
	if err != nil {
		t.Fatal(err)
	}
	tab, err := readSymtab(exe, st.Size())
	exe.Close()
	if err != nil {
		t.Fatal(err)
	}
	const want = "github.com/profi-dev/profi/internal/kernelname.TestResolveSelf"
	if !slices.ContainsFunc(tab.syms, func(s symbol) bool { return s.name == want }) {
		t.Skip("the test binary has no Go symbol table (go test links with -s unless built with -c)")
	}
	addr := uint64(reflect.ValueOf(TestResolveSelf).Pointer())
	s := NewSymbolizer("", 0)
	for _, a := range []uint64{addr, addr + 1} {
		got, err := s.Resolve(os.Getpid(), a)
		if err != nil {
			t.Fatalf("Resolve(%#x): %v", a, err)
		}
		if got != want {
			t.Fatalf("Resolve(%#x) = %q, want %q", a, got, want)
		}
	}
}

// The C program of TestResolveGCC: functions with mangled asm labels, one
// of them static (.symtab only), and a library it dlopens. It prints the
// addresses, then waits for stdin to close.
const (
	gccProg = `#include <stdio.h>
#include <dlfcn.h>
void flash(void) __asm__("_ZN5flash16flash_fwd_kernelEv");
__attribute__((noinline)) void flash(void) { __asm__ volatile("nop; nop; nop"); }
void vec(int) __asm__("_ZN2at6native29vectorized_elementwise_kernelILi4EEEvi");
__attribute__((noinline)) void vec(int n) { __asm__ volatile("nop; nop; nop"); (void)n; }
static void local(void) __asm__("_ZN2at6native12_GLOBAL__N_119cunn_SoftMaxForwardEv");
__attribute__((noinline, used)) static void local(void) { __asm__ volatile("nop; nop; nop"); }
int main(int argc, char **argv) {
	void *h = dlopen(argv[1], RTLD_NOW);
	if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
	printf("_ZN5flash16flash_fwd_kernelEv %p\n", (void *)flash);
	printf("_ZN2at6native29vectorized_elementwise_kernelILi4EEEvi %p\n", (void *)vec);
	printf("_ZN2at6native12_GLOBAL__N_119cunn_SoftMaxForwardEv %p\n", (void *)local);
	printf("_ZN4vllm25paged_attention_v1_kernelIfEEvPf %p\n", dlsym(h, "_ZN4vllm25paged_attention_v1_kernelIfEEvPf"));
	printf("triton_poi_fused_add_0 %p\n", dlsym(h, "triton_poi_fused_add_0"));
	fflush(stdout);
	while (getchar() != EOF) {}
	return 0;
}
`
	gccLib = `void paged(float *p) __asm__("_ZN4vllm25paged_attention_v1_kernelIfEEvPf");
void paged(float *p) { __asm__ volatile("nop; nop; nop"); (void)p; }
void triton_poi_fused_add_0(void) { __asm__ volatile("nop; nop; nop"); }
`
)

// TestResolveGCC resolves functions of a running C program and of a
// library it dlopened, in builds where ELF addresses differ from file
// offsets: a non-PIE executable and a shared object linked at 0x200000
// (the library then collides with the executable and is loaded with a
// bias), and a default PIE (loaded at a random bias). The library is
// stripped, so its names come from .dynsym.
func TestResolveGCC(t *testing.T) {
	requireLinux(t)
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc not installed")
	}
	t.Parallel()
	dir := t.TempDir()
	write := func(name, src string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	prog, lib := write("prog.c", gccProg), write("lib.c", gccLib)
	build := func(out string, args ...string) string {
		path := filepath.Join(dir, out)
		cmd := exec.Command(gcc, append(args, "-o", path)...)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("gcc %v: %v\n%s", args, err, b)
		}
		return path
	}
	libSO := build("libk.so", "-O0", "-shared", "-fPIC", "-Wl,-Ttext-segment=0x200000", "-Wl,-s", lib)
	builds := map[string]string{
		"non-PIE": build("prog-nopie", "-O0", "-fno-pie", "-no-pie", "-Wl,-Ttext-segment=0x200000", prog, "-ldl"),
		"PIE":     build("prog-pie", "-O0", "-fPIE", "-pie", prog, "-ldl"),
	}
	for _, path := range []string{libSO, builds["non-PIE"]} {
		requireVaddrNotOffset(t, path)
	}

	for name, exe := range builds {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pid, addrs := startProg(t, exe, libSO)
			s := NewSymbolizer("", 4)
			for _, a := range addrs {
				for _, addr := range []uint64{a.addr, a.addr + 2} {
					got, err := s.Resolve(pid, addr)
					if err != nil || got != a.name {
						t.Errorf("Resolve(%#x) = %q, %v; want %q", addr, got, err, a.name)
					}
				}
			}
			if got := s.parses.Load(); got != 2 {
				t.Errorf("%d files parsed, want 2 (program and library)", got)
			}
		})
	}

	t.Run("normalized", func(t *testing.T) {
		t.Parallel()
		want := map[string]string{
			"_ZN5flash16flash_fwd_kernelEv":                         "flash::flash_fwd_kernel",
			"_ZN2at6native29vectorized_elementwise_kernelILi4EEEvi": "at::native::vectorized_elementwise_kernel",
			"_ZN2at6native12_GLOBAL__N_119cunn_SoftMaxForwardEv":    "at::native::(anonymous namespace)::cunn_SoftMaxForward",
			"_ZN4vllm25paged_attention_v1_kernelIfEEvPf":            "vllm::paged_attention_v1_kernel",
			"triton_poi_fused_add_0":                                "triton_poi_fused_add",
		}
		for raw, w := range want {
			if got := Normalize(raw); got != w {
				t.Errorf("Normalize(%q) = %q, want %q", raw, got, w)
			}
		}
	})

	t.Run("deleted executable", func(t *testing.T) {
		t.Parallel()
		exe := filepath.Join(dir, "prog-deleted")
		// A hard link, not a copy: a file this process wrote could still be
		// open for writing in a child another parallel test forks at that
		// moment, and exec would fail with ETXTBSY (golang/go#22315).
		if err := os.Link(builds["PIE"], exe); err != nil {
			t.Fatal(err)
		}
		pid, addrs := startProg(t, exe, libSO)
		if err := os.Remove(exe); err != nil {
			t.Fatal(err)
		}
		got, err := NewSymbolizer("", 1).Resolve(pid, addrs[0].addr)
		switch {
		case err == nil && got == addrs[0].name:
		case err != nil && os.Geteuid() != 0:
			t.Logf("without root, /proc/PID/map_files is closed: %v", err)
		default:
			t.Errorf("Resolve(%#x) = %q, %v; want %q", addrs[0].addr, got, err, addrs[0].name)
		}
	})
}

// requireVaddrNotOffset fails unless the executable segment of the ELF
// file at path has a virtual address different from its file offset, so
// that a resolver confusing the two would fail.
func requireVaddrNotOffset(t *testing.T, path string) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD && p.Flags&elf.PF_X != 0 {
			if p.Vaddr == p.Off {
				t.Fatalf("%s: text segment at vaddr %#x == offset: the test would not tell them apart", path, p.Vaddr)
			}
			return
		}
	}
	t.Fatalf("%s: no executable PT_LOAD", path)
}

type progAddr struct {
	name string
	addr uint64
}

// startProg runs the C program with the library, reads the addresses it
// prints, and stops it (by closing its stdin) when the test ends.
func startProg(t *testing.T, exe, lib string) (int, []progAddr) {
	t.Helper()
	cmd := exec.Command(exe, lib)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		if err := cmd.Wait(); err != nil {
			t.Errorf("%s: %v\n%s", exe, err, stderr.String())
		}
	})
	var addrs []progAddr
	sc := bufio.NewScanner(stdout)
	for len(addrs) < 5 && sc.Scan() {
		name, hex, ok := strings.Cut(sc.Text(), " ")
		addr, err := strconv.ParseUint(strings.TrimPrefix(hex, "0x"), 16, 64)
		if !ok || err != nil || addr == 0 {
			t.Fatalf("%s printed %q", exe, sc.Text())
		}
		addrs = append(addrs, progAddr{name, addr})
	}
	if len(addrs) < 5 {
		t.Fatalf("%s printed %d addresses: %v\n%s", exe, len(addrs), sc.Err(), stderr.String())
	}
	return cmd.Process.Pid, addrs
}

// TestReadSymtabMatchesDebugELF: on real files, the bounded reader gives
// the table that debug/elf's symbols gave before it (the same filter,
// order and deduplication).
func TestReadSymtabMatchesDebugELF(t *testing.T) {
	t.Parallel()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{self, "/usr/lib/x86_64-linux-gnu/libc.so.6", "/bin/true"} {
		ef, err := elf.Open(path)
		if err != nil {
			continue // not on this system
		}
		var want []symbol
		for _, get := range []func() ([]elf.Symbol, error){ef.Symbols, ef.DynamicSymbols} {
			syms, _ := get()
			for _, s := range syms {
				if elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Section != elf.SHN_UNDEF && s.Name != "" && s.Value != 0 {
					want = append(want, symbol{value: s.Value, size: s.Size, rank: bindingRank(elf.ST_BIND(s.Info)), name: s.Name})
				}
			}
			if len(want) > 0 {
				break
			}
		}
		ef.Close()
		slices.SortFunc(want, func(a, b symbol) int {
			return cmp.Or(cmp.Compare(a.value, b.value), cmp.Compare(a.rank, b.rank), cmp.Compare(a.name, b.name))
		})
		want = slices.CompactFunc(want, func(a, b symbol) bool { return a.value == b.value && a.name == b.name })
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		st, _ := f.Stat()
		tab, err := readSymtab(f, st.Size())
		f.Close()
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if !reflect.DeepEqual(tab.syms, want) {
			t.Errorf("%s: %d symbols, debug/elf %d", path, len(tab.syms), len(want))
		}
		t.Logf("%s: %d functions", path, len(tab.syms))
	}
}
