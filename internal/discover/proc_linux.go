//go:build linux

package discover

import (
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// Proc is an open /proc/PID directory (an O_PATH descriptor). Every file
// read through it belongs to the process it was opened for: once that
// process has exited, procfs fails the lookup (ENOENT or ESRCH) even if
// its PID has been given to a new process meanwhile, so a reader that
// reads several files in several steps (stat, then environ, cgroup or fd)
// never mixes two processes.
type Proc struct {
	fd  int
	pid int
}

// OpenProc opens <procRoot>/<pid>. When start is not 0 the process must
// have that start time (field 22 of stat), else the error wraps
// ErrProcessGone: the PID now names another process. A missing process
// also wraps ErrProcessGone.
func OpenProc(procRoot string, pid int, start uint64) (*Proc, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("open proc dir of pid %d: invalid pid", pid)
	}
	root := procRootOr(procRoot)
	fd, err := openProcDir(root, pid)
	if err != nil {
		if gone(err) {
			return nil, fmt.Errorf("open proc dir of pid %d: %w: %w", pid, ErrProcessGone, err)
		}
		return nil, fmt.Errorf("open proc dir of pid %d: %w", pid, err)
	}
	p := &Proc{fd: fd, pid: pid}
	if start != 0 {
		got, err := p.StartTime()
		if err == nil && got != start {
			err = fmt.Errorf("pid %d started at %d, not %d: %w", pid, got, start, ErrProcessGone)
		}
		if err != nil {
			p.Close()
			return nil, err
		}
	}
	return p, nil
}

// PID is the process's PID.
func (p *Proc) PID() int { return p.pid }

// Close releases the directory.
func (p *Proc) Close() error {
	if p.fd < 0 {
		return nil
	}
	err := unix.Close(p.fd)
	p.fd = -1
	return err
}

// wrap names the file and marks a vanished process.
func (p *Proc) wrap(name string, err error) error {
	if gone(err) {
		return fmt.Errorf("read %s of pid %d: %w: %w", name, p.pid, ErrProcessGone, err)
	}
	return fmt.Errorf("read %s of pid %d: %w", name, p.pid, err)
}

// Open opens the file name (e.g. "environ") of the process for a
// streaming read; the caller closes it and bounds what it reads.
func (p *Proc) Open(name string) (io.ReadCloser, error) {
	fd, err := openat(p.fd, name)
	if err != nil {
		return nil, p.wrap(name, err)
	}
	return os.NewFile(uintptr(fd), name), nil
}

// ReadFile reads at most max bytes of the file name (e.g. "environ",
// "cgroup") of the process.
func (p *Proc) ReadFile(name string, max int) ([]byte, error) {
	fd, err := openat(p.fd, name)
	if err != nil {
		return nil, p.wrap(name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, int64(max)))
	if err != nil {
		return nil, p.wrap(name, err)
	}
	return b, nil
}

// StartTime is field 22 of the process's stat.
func (p *Proc) StartTime() (uint64, error) {
	var buf [4096]byte
	b, err := readSmall(p.fd, "stat", buf[:])
	if err != nil {
		return 0, p.wrap("stat", err)
	}
	_, start, err := statFields(b)
	if err != nil {
		return 0, p.wrap("stat", err)
	}
	return start, nil
}

// Comm is the process's comm without its newline, as the kernel gives it
// (see SafeLabel before using it as a label value).
func (p *Proc) Comm() (string, error) {
	var buf [256]byte
	b, err := readSmall(p.fd, "comm", buf[:])
	if err != nil {
		return "", p.wrap("comm", err)
	}
	return trimNewline(b), nil
}

// FDTargets returns the targets of the process's open file descriptors
// (the symbolic links under fd/), those that could be read.
func (p *Proc) FDTargets() ([]string, error) {
	fd, err := openDirAt(p.fd, "fd")
	if err != nil {
		return nil, p.wrap("fd", err)
	}
	d := os.NewFile(uintptr(fd), "fd")
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil, p.wrap("fd", err)
	}
	out := make([]string, 0, len(names))
	var buf [unix.PathMax]byte
	for _, n := range names {
		if k, err := unix.Readlinkat(fd, n, buf[:]); err == nil {
			out = append(out, string(buf[:k]))
		}
	}
	return out, nil
}

func openDirAt(dirfd int, name string) (int, error) {
	for {
		fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err == unix.EINTR {
			continue
		}
		return fd, err
	}
}
