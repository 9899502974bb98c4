//go:build linux

package discover

import (
	"errors"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fakeRoot builds <tmp>/proc/42/root with library files and hostile
// symlinks, and <tmp>/proc/44 as a zombie. It returns the proc root.
func fakeRoot(t *testing.T) string {
	t.Helper()
	proc := filepath.Join(t.TempDir(), "proc")
	root := filepath.Join(proc, "42", "root")
	for _, dir := range []string{"usr/lib/dir", "lib", "etc", "usr/local/cuda/lib64"} {
		if err := os.MkdirAll(filepath.Join(root, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	files := map[string]string{
		"usr/local/cuda/lib64/libcudart.so.12.4.127": "cudart inside",
		"lib/x.so":   "x inside",
		"etc/passwd": "passwd inside",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(root, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	links := map[string]string{
		"usr/local/cuda/lib64/libcudart.so.12": "libcudart.so.12.4.127",
		"usr/lib/abs.so":                       "/lib/x.so",
		"usr/lib/relative.so":                  "../../lib/x.so",
		"usr/lib/escape.so":                    "../../../../etc/passwd",
		"usr/lib/escape-dir":                   "../../../../../..",
		"usr/lib/loop1":                        "loop2",
		"usr/lib/loop2":                        "loop1",
		"usr/lib/dangling":                     "/nonexistent/lib.so",
		"usr/lib/linkdir":                      "/usr/lib/dir",
		"usr/lib/empty-hop":                    "/usr/lib/linkdir/../../../lib/x.so",
		"lib64":                                "/usr/lib",
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mkfifo(filepath.Join(root, "usr/lib/fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", filepath.Join(root, "usr/lib/sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	// A zombie: the directory exists, stat says Z and root cannot be opened.
	if err := os.MkdirAll(filepath.Join(proc, "44"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(proc, "44", "stat"), []byte("44 (z) Z 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 99\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return proc
}

// openModes runs f with openat2 and with the fallback walk, each with and
// without /proc/self/fd.
func openModes(t *testing.T, f func(t *testing.T)) {
	fd, err := unix.Openat2(unix.AT_FDCWD, "/", &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: resolveInRoot})
	haveOpenat2 := err == nil
	if haveOpenat2 {
		unix.Close(fd)
	}
	for _, m := range []struct {
		name      string
		walk      bool
		noProcFD  bool
		needsOpen bool
	}{
		{"openat2", false, false, true},
		{"openat2 without proc self fd", false, true, true},
		{"walk", true, false, false},
		{"walk without proc self fd", true, true, false},
	} {
		t.Run(m.name, func(t *testing.T) {
			if m.needsOpen && !haveOpenat2 {
				t.Skip("openat2 not available:", err)
			}
			oldWalk, oldSelf := noOpenat2.Load(), selfFD
			t.Cleanup(func() { noOpenat2.Store(oldWalk); selfFD = oldSelf })
			noOpenat2.Store(m.walk)
			if m.noProcFD {
				selfFD = "/nonexistent/fd/"
			}
			f(t)
		})
	}
}

func TestOpenInRoot(t *testing.T) {
	proc := fakeRoot(t)
	tests := []struct {
		name    string
		pid     int
		path    string
		want    string // content; "" when an error is expected
		wantErr []error
		notErr  []error
	}{
		{name: "regular library", pid: 42, path: "/usr/local/cuda/lib64/libcudart.so.12.4.127", want: "cudart inside"},
		{name: "relative symlink", pid: 42, path: "/usr/local/cuda/lib64/libcudart.so.12", want: "cudart inside"},
		{name: "absolute symlink stays inside", pid: 42, path: "/usr/lib/abs.so", want: "x inside"},
		{name: "symlink with dot-dot", pid: 42, path: "/usr/lib/relative.so", want: "x inside"},
		{name: "dot-dot symlink does not escape", pid: 42, path: "/usr/lib/escape.so", want: "passwd inside"},
		{name: "dot-dot path does not escape", pid: 42, path: "/../../../../../etc/passwd", want: "passwd inside"},
		{name: "escaping directory symlink", pid: 42, path: "/usr/lib/escape-dir/etc/passwd", want: "passwd inside"},
		{name: "symlinked directory", pid: 42, path: "/lib64/abs.so", want: "x inside"},
		{name: "dot-dot after symlinked directory", pid: 42, path: "/usr/lib/empty-hop", want: "x inside"},
		{name: "dot components", pid: 42, path: "/./lib/./x.so", want: "x inside"},
		{name: "directory", pid: 42, path: "/usr/lib/dir", wantErr: []error{ErrNotRegular}},
		{name: "root directory", pid: 42, path: "/", wantErr: []error{ErrNotRegular}},
		{name: "FIFO does not block", pid: 42, path: "/usr/lib/fifo", wantErr: []error{ErrNotRegular}},
		{name: "socket", pid: 42, path: "/usr/lib/sock", wantErr: []error{ErrNotRegular}},
		{name: "symlink loop", pid: 42, path: "/usr/lib/loop1", wantErr: []error{ErrUnsafePath}},
		{name: "file as directory", pid: 42, path: "/lib/x.so/y", wantErr: []error{unix.ENOTDIR}, notErr: []error{ErrProcessGone}},
		{name: "missing file", pid: 42, path: "/usr/lib/missing.so", wantErr: []error{fs.ErrNotExist}, notErr: []error{ErrProcessGone}},
		{name: "dangling symlink", pid: 42, path: "/usr/lib/dangling", wantErr: []error{fs.ErrNotExist}, notErr: []error{ErrProcessGone}},
		{name: "relative path", pid: 42, path: "usr/lib/abs.so", wantErr: []error{ErrUnsafePath}},
		{name: "NUL in path", pid: 42, path: "/lib/x.so\x00", wantErr: []error{ErrUnsafePath}},
		{name: "missing pid", pid: 43, path: "/lib/x.so", wantErr: []error{ErrProcessGone}},
		{name: "zombie", pid: 44, path: "/lib/x.so", wantErr: []error{ErrProcessGone}},
	}
	openModes(t, func(t *testing.T) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				f, err := openWithTimeout(t, proc, tt.pid, tt.path)
				if tt.wantErr != nil {
					if err == nil {
						f.Close()
						t.Fatalf("OpenInRoot(%q) succeeded; want %v", tt.path, tt.wantErr)
					}
					for _, want := range tt.wantErr {
						if !errors.Is(err, want) {
							t.Errorf("OpenInRoot(%q) error %v does not wrap %v", tt.path, err, want)
						}
					}
					for _, not := range tt.notErr {
						if errors.Is(err, not) {
							t.Errorf("OpenInRoot(%q) error %v wraps %v", tt.path, err, not)
						}
					}
					if !strings.Contains(err.Error(), "of pid") {
						t.Errorf("error %q lacks context", err)
					}
					return
				}
				if err != nil {
					t.Fatalf("OpenInRoot(%q): %v", tt.path, err)
				}
				defer f.Close()
				b, err := io.ReadAll(f)
				if err != nil || string(b) != tt.want {
					t.Errorf("OpenInRoot(%q) read %q, %v; want %q", tt.path, b, err, tt.want)
				}
				dev, ino, err := FileID(f)
				var st unix.Stat_t
				if err2 := unix.Fstat(int(f.Fd()), &st); err != nil || err2 != nil || dev != uint64(st.Dev) || ino != st.Ino {
					t.Errorf("FileID = %d, %d, %v; fstat says %d, %d, %v", dev, ino, err, st.Dev, st.Ino, err2)
				}
				if flags, err := unix.FcntlInt(f.Fd(), unix.F_GETFL, 0); err != nil ||
					flags&unix.O_ACCMODE != unix.O_RDONLY || flags&unix.O_NONBLOCK != 0 {
					t.Errorf("file flags %#o, %v; want read-only and blocking", flags, err)
				}
			})
		}
	})
}

// openWithTimeout fails the test instead of hanging if OpenInRoot blocks
// (e.g. on a FIFO).
func openWithTimeout(t *testing.T, proc string, pid int, path string) (*os.File, error) {
	t.Helper()
	type result struct {
		f   *os.File
		err error
	}
	done := make(chan result, 1)
	go func() {
		f, err := OpenInRoot(proc, pid, path)
		done <- result{f, err}
	}()
	select {
	case r := <-done:
		return r.f, r.err
	case <-time.After(10 * time.Second):
		t.Fatalf("OpenInRoot(%q) blocked", path)
		return nil, nil
	}
}

// TestOpenInRootLive opens this test binary through the real
// /proc/self/root, and checks that a magic link inside the root is refused
// by openat2 (the walk resolves it textually, inside the root).
func TestOpenInRootLive(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Skip(err)
	}
	if _, err := os.Stat("/proc/self/root"); err != nil {
		t.Skip("no procfs:", err)
	}
	var want unix.Stat_t
	if err := unix.Stat(exe, &want); err != nil {
		t.Fatal(err)
	}
	openModes(t, func(t *testing.T) {
		f, err := OpenInRoot("/proc", os.Getpid(), exe)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		dev, ino, err := FileID(f)
		if err != nil || dev != uint64(want.Dev) || ino != want.Ino {
			t.Errorf("FileID = %d, %d, %v; want %d, %d", dev, ino, err, want.Dev, want.Ino)
		}

		f2, err := OpenInRoot("/proc", os.Getpid(), "/proc/self/root"+exe)
		if noOpenat2.Load() {
			if err != nil {
				t.Errorf("walk through /proc/self/root: %v", err)
			} else {
				f2.Close()
			}
		} else if !errors.Is(err, ErrUnsafePath) {
			if err == nil {
				f2.Close()
			}
			t.Errorf("openat2 through the magic link /proc/self/root: err = %v, want ErrUnsafePath", err)
		}
	})
}

func TestFileIDNil(t *testing.T) {
	if _, _, err := FileID(nil); err == nil {
		t.Error("FileID(nil) succeeded")
	}
}
