//go:build linux

package discover

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func writeFakeProc(t *testing.T, root, pid string, start string, files map[string]string) {
	t.Helper()
	dir := filepath.Join(root, pid)
	if err := os.MkdirAll(filepath.Join(dir, "fd"), 0o755); err != nil {
		t.Fatal(err)
	}
	files["stat"] = pid + " (x) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 " + start + " 0 0\n"
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// Files read through a Proc belong to the process it was opened for: when
// the directory is replaced (a fake PID reuse), later reads fail with
// ErrProcessGone instead of reading the new process's files.
func TestProcPinned(t *testing.T) {
	root := t.TempDir()
	writeFakeProc(t, root, "7", "500", map[string]string{"environ": "A=1\x00", "comm": "old\n"})
	if err := os.Symlink("/dev/nvidia3", filepath.Join(root, "7", "fd", "4")); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenProc(root, 7, 501); !errors.Is(err, ErrProcessGone) {
		t.Fatalf("OpenProc with another start time: %v, want ErrProcessGone", err)
	}
	p, err := OpenProc(root, 7, 500)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if b, err := p.ReadFile("environ", 2); err != nil || string(b) != "A=" {
		t.Errorf("ReadFile(environ, 2) = %q, %v; want \"A=\" (bounded)", b, err)
	}
	if c, err := p.Comm(); err != nil || c != "old" {
		t.Errorf("Comm = %q, %v", c, err)
	}
	if got, err := p.FDTargets(); err != nil || !reflect.DeepEqual(got, []string{"/dev/nvidia3"}) {
		t.Errorf("FDTargets = %q, %v", got, err)
	}
	// The PID is reused: the old directory goes, a new one takes its name.
	if err := os.RemoveAll(filepath.Join(root, "7")); err != nil {
		t.Fatal(err)
	}
	writeFakeProc(t, root, "7", "900", map[string]string{"environ": "B=2\x00", "comm": "new\n"})
	if b, err := p.ReadFile("environ", 100); !errors.Is(err, ErrProcessGone) {
		t.Errorf("ReadFile after reuse = %q, %v; want ErrProcessGone", b, err)
	}
	if _, err := p.StartTime(); !errors.Is(err, ErrProcessGone) {
		t.Errorf("StartTime after reuse: %v; want ErrProcessGone", err)
	}
}
