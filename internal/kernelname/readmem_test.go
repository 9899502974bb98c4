package kernelname

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"github.com/profi-dev/profi/internal/discover"
)

func requireLinux(t *testing.T) {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("needs Linux procfs")
	}
}

// addrOf returns the address of b's first byte. Go's heap does not move,
// and callers keep b alive with runtime.KeepAlive.
func addrOf(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(&b[0]))) }

// TestReadStringSelf reads strings out of the test process's own memory,
// which needs no privilege.
func TestReadStringSelf(t *testing.T) {
	requireLinux(t)
	t.Parallel()
	pid := os.Getpid()
	tests := []struct {
		name    string
		mem     []byte
		max     int
		want    string
		wantErr error
		reason  string
	}{
		{name: "NUL-terminated", mem: []byte("_Z3fooi\x00garbage"), want: "_Z3fooi"},
		{name: "stops at the first NUL", mem: []byte("a\x00b\x00"), want: "a"},
		{name: "cut at max", mem: []byte("triton_poi_fused_add_0\x00"), max: 6, want: "triton"},
		{name: "max above the cap means the cap", mem: []byte("k\x00"), max: 1 << 20, want: "k"},
		{name: "partial rune at max dropped", mem: []byte("hé\x00"), max: 2, want: "h"},
		{name: "UTF-8", mem: []byte("ядро\x00"), want: "ядро"},
		{name: "empty", mem: []byte{0, 'x'}, wantErr: ErrEmpty, reason: "empty"},
		{name: "invalid UTF-8", mem: []byte("a\xff\xfeb\x00"), wantErr: ErrNotUTF8, reason: "not_utf8"},
		{name: "only a partial rune", mem: []byte("\xd0\xb0"), max: 1, wantErr: ErrNotUTF8, reason: "not_utf8"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ReadString("", pid, addrOf(tc.mem), tc.max)
			runtime.KeepAlive(tc.mem)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) || got != "" {
					t.Fatalf("ReadString = %q, %v; want error %v", got, err, tc.wantErr)
				}
				if r := Reason(err); r != tc.reason {
					t.Errorf("Reason(%v) = %q, want %q", err, r, tc.reason)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ReadString = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// TestReadStringLong reads a string longer than a page, across page
// boundaries, up to the 4096-byte cap.
func TestReadStringLong(t *testing.T) {
	requireLinux(t)
	t.Parallel()
	mem := []byte(strings.Repeat("k", 3*MaxStringLen) + "\x00")
	got, err := ReadString("", os.Getpid(), addrOf(mem)+100, 0)
	runtime.KeepAlive(mem)
	if err != nil || got != strings.Repeat("k", MaxStringLen) {
		t.Fatalf("ReadString = %d bytes, %v; want %d bytes", len(got), err, MaxStringLen)
	}
}

func TestReadStringOpenErrors(t *testing.T) {
	t.Parallel()
	root := t.TempDir() // a procfs root without processes
	_, err := ReadString(root, 1234, 0x1000, 0)
	if !errors.Is(err, ErrOpen) || !errors.Is(err, discover.ErrProcessGone) {
		t.Errorf("missing process: %v, want ErrOpen and ErrProcessGone", err)
	}
	if r := Reason(err); r != "open_failed" {
		t.Errorf("Reason = %q, want open_failed", r)
	}
	for _, pid := range []int{0, -1} {
		if _, err := ReadString(root, pid, 0x1000, 0); !errors.Is(err, ErrOpen) {
			t.Errorf("pid %d: %v, want ErrOpen", pid, err)
		}
	}
	// Not a process's mem file: a directory cannot be read.
	if err := os.MkdirAll(filepath.Join(root, "7", "mem"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadString(root, 7, 0x1000, 0); !errors.Is(err, ErrRead) {
		t.Errorf("unreadable mem: %v, want ErrRead", err)
	}
}

func TestReason(t *testing.T) {
	t.Parallel()
	for err, want := range map[error]string{
		nil:                                      "",
		ErrOpen:                                  "open_failed",
		ErrRead:                                  "read_failed",
		ErrNotUTF8:                               "not_utf8",
		ErrEmpty:                                 "empty",
		fmt.Errorf("x: %w", ErrEmpty):            "empty",
		fmt.Errorf("x: %w: %w", ErrOpen, io.EOF): "open_failed",
		errors.New("something else"):             "read_failed",
	} {
		if got := Reason(err); got != want {
			t.Errorf("Reason(%v) = %q, want %q", err, got, want)
		}
	}
}

var errFakeIO = errors.New("input/output error")

// pagedReader serves mem as if it started at address base, fails reads
// that start at or past fail, and records every read.
type pagedReader struct {
	base  uint64
	mem   []byte
	fail  uint64
	reads [][2]uint64 // offset, length
}

func (r *pagedReader) ReadAt(p []byte, off int64) (int, error) {
	r.reads = append(r.reads, [2]uint64{uint64(off), uint64(len(p))})
	pos := uint64(off)
	if pos >= r.fail || pos < r.base {
		return 0, errFakeIO
	}
	n := copy(p, r.mem[pos-r.base:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// TestReadCStringPageByPage checks that no read crosses a page boundary,
// so a hole after a page never costs the bytes before it.
func TestReadCStringPageByPage(t *testing.T) {
	t.Parallel()
	page := pageSize
	r := &pagedReader{base: 0, mem: []byte(strings.Repeat("x", int(3*page))), fail: 2 * page}
	buf := make([]byte, 2*page)
	start := page - 10
	n, nul, err := readCString(r, start, buf)
	if err != nil || nul || n != int(page+10) {
		t.Fatalf("readCString = %d, %v, %v; want %d bytes, no NUL", n, nul, err, page+10)
	}
	for _, rd := range r.reads {
		if rd[0]/page != (rd[0]+rd[1]-1)/page {
			t.Errorf("read of %d bytes at %#x crosses a page boundary", rd[1], rd[0])
		}
	}
}
