package testutil

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// MapFile maps path read-only into the test process for the test's
// length. The kernel reads the instruction under a uprobe (and refuses
// it) only when it installs the probe in a process that maps the file
// and passes the PID filter: the attach tests' filter is the test process.
func MapFile(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Munmap(m) })
}
