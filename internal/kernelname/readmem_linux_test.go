package kernelname

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestReadStringUnreadablePage maps two pages of a one-page file: the
// second page has no file behind it, so /proc/PID/mem cannot read it (the
// mapping stays in place, so nothing else can land there meanwhile). A
// string that runs into it is returned up to the page end; a string that
// starts in it is a read error.
func TestReadStringUnreadablePage(t *testing.T) {
	t.Parallel()
	page := os.Getpagesize()
	path := filepath.Join(t.TempDir(), "page")
	if err := os.WriteFile(path, make([]byte, page), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	mem, err := syscall.Mmap(int(f.Fd()), 0, 2*page, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = syscall.Munmap(mem) }()
	copy(mem[page-5:], "abcde") // no NUL before the end of the page

	base := addrOf(mem)
	got, err := ReadString("", os.Getpid(), base+uint64(page-5), 0)
	if err != nil || got != "abcde" {
		t.Errorf("ReadString across into the hole = %q, %v; want %q", got, err, "abcde")
	}
	got, err = ReadString("", os.Getpid(), base+uint64(page), 0)
	if !errors.Is(err, ErrRead) || got != "" {
		t.Errorf("ReadString in the hole = %q, %v; want ErrRead", got, err)
	}
	if r := Reason(err); r != "read_failed" {
		t.Errorf("Reason = %q, want read_failed", r)
	}
	if _, err := ReadString("", os.Getpid(), 0, 0); !errors.Is(err, ErrRead) {
		t.Errorf("ReadString at address 0: %v, want ErrRead", err)
	}
	if _, err := ReadString("", os.Getpid(), 1<<63, 0); !errors.Is(err, ErrRead) {
		t.Errorf("ReadString at address 1<<63: %v, want ErrRead", err)
	}
}
