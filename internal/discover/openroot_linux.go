//go:build linux

package discover

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Test hooks.
var (
	// noOpenat2 is set once openat2 returned ENOSYS (kernel older than 5.6),
	// and by tests to exercise the fallback walk.
	noOpenat2 atomic.Bool
	// selfFD is where the process's own file descriptors can be reopened;
	// tests point it elsewhere to exercise the fallback.
	selfFD = "/proc/self/fd/"
)

const (
	maxSymlinks   = 40 // like the kernel's MAXSYMLINKS
	openat2Tries  = 16 // EAGAIN retries of a RESOLVE_IN_ROOT lookup raced by a rename
	resolveInRoot = unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS
)

// OpenInRoot opens path, absolute as seen inside process pid, for reading
// under <procRoot>/<pid>/root, without letting symlinks escape that root:
// absolute symlinks and ".." are resolved against the process's root as if
// the agent were chrooted there, and magic links such as /proc/self/root
// are refused. Only regular files are opened.
//
// The file is resolved with openat2(RESOLVE_IN_ROOT|RESOLVE_NO_MAGICLINKS)
// into an O_PATH descriptor, which is fstat'ed and must be S_IFREG before
// it is reopened read-only through /proc/self/fd, so the agent never opens
// a device or FIFO planted at a library's path (no side effect, no hang).
// Without openat2 (ENOSYS, or EPERM from a seccomp filter) the path is
// walked one component at a time with O_PATH|O_NOFOLLOW, reading each
// symlink and resolving it textually inside the root; that walk follows
// magic links textually too (still inside the root) rather than refusing
// them. Without /proc/self/fd the file is opened a second time with
// O_NONBLOCK|O_NOCTTY and must be the same inode.
//
// Errors wrap ErrProcessGone when <procRoot>/<pid> no longer exists (or is a
// zombie), ErrNotRegular for a directory, device, FIFO or socket,
// ErrUnsafePath for a relative path, a magic link, a symlink loop or a file
// swapped during the open, and otherwise the errno (so errors.Is(err,
// fs.ErrNotExist) holds for a missing file in a live process).
func OpenInRoot(procRoot string, pid int, path string) (*os.File, error) {
	root := procRootOr(procRoot)
	f, err := openInRoot(root, pid, path)
	if err != nil {
		return nil, fmt.Errorf("open %q in root of pid %d: %w", path, pid, err)
	}
	return f, nil
}

func openInRoot(root string, pid int, path string) (*os.File, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("invalid pid %d", pid)
	}
	if !strings.HasPrefix(path, "/") {
		return nil, fmt.Errorf("path is not absolute: %w", ErrUnsafePath)
	}
	if strings.IndexByte(path, 0) >= 0 {
		return nil, fmt.Errorf("path contains NUL: %w", ErrUnsafePath)
	}
	rootDir := root + "/" + strconv.Itoa(pid) + "/root"
	rootfd, err := retryEINTR(func() (int, error) {
		return unix.Open(rootDir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	})
	if err != nil {
		return nil, classifyErr(root, pid, fmt.Errorf("open %s: %w", rootDir, err))
	}
	defer unix.Close(rootfd)

	fd, st, err := resolve(rootfd, path, unix.O_PATH)
	if err != nil {
		return nil, classifyErr(root, pid, err)
	}
	defer unix.Close(fd)
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("%s: %w", fileType(st.Mode), ErrNotRegular)
	}

	rfd, err := reopen(rootfd, fd, path)
	if err != nil {
		return nil, classifyErr(root, pid, err)
	}
	var rst unix.Stat_t
	if err := unix.Fstat(rfd, &rst); err != nil {
		unix.Close(rfd)
		return nil, fmt.Errorf("fstat: %w", err)
	}
	if rst.Mode&unix.S_IFMT != unix.S_IFREG || rst.Dev != st.Dev || rst.Ino != st.Ino {
		unix.Close(rfd)
		return nil, fmt.Errorf("file changed while being opened: %w", ErrUnsafePath)
	}
	return os.NewFile(uintptr(rfd), rootDir+path), nil
}

// resolve opens path inside rootfd with the given flags (O_PATH, or
// O_RDONLY for the reopen fallback) and fstats the result.
func resolve(rootfd int, path string, flags int) (int, *unix.Stat_t, error) {
	fd, err := openat2InRoot(rootfd, path, flags)
	if err != nil {
		return -1, nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, nil, fmt.Errorf("fstat: %w", err)
	}
	return fd, &st, nil
}

// openat2InRoot resolves path with openat2, or with walkInRoot where
// openat2 is not available.
func openat2InRoot(rootfd int, path string, flags int) (int, error) {
	if !noOpenat2.Load() {
		how := unix.OpenHow{Flags: uint64(openFlags(flags)), Resolve: resolveInRoot}
		for try := 0; ; try++ {
			fd, err := unix.Openat2(rootfd, path, &how)
			switch {
			case err == nil:
				return fd, nil
			case err == unix.EINTR || err == unix.EAGAIN && try < openat2Tries:
				continue
			case err == unix.EAGAIN:
				return -1, fmt.Errorf("openat2: lookup keeps racing with renames: %w: %w", ErrUnsafePath, err)
			case err == unix.ELOOP:
				return -1, fmt.Errorf("openat2: magic link or symlink loop: %w: %w", ErrUnsafePath, err)
			case err == unix.EXDEV:
				return -1, fmt.Errorf("openat2: escape from root detected: %w: %w", ErrUnsafePath, err)
			case err == unix.ENOSYS:
				noOpenat2.Store(true)
			case err == unix.EPERM:
				// Probably a seccomp filter that predates openat2; the walk
				// is as safe, only slower. Not remembered: EPERM may be real.
			default:
				return -1, fmt.Errorf("openat2: %w", err)
			}
			break
		}
	}
	return walkInRoot(rootfd, path, flags)
}

// walkInRoot resolves path like openat2 with RESOLVE_IN_ROOT, one component
// at a time: every component is opened with O_PATH|O_NOFOLLOW relative to
// the directory before it, a symlink is read and its target spliced into the
// remaining path (an absolute target restarts at rootfd), and ".." pops
// the stack of directories that were walked, never going above rootfd. The
// kernel never follows a link and never sees "..", so nothing escapes
// rootfd, even if directories are moved during the walk. The final
// component is opened with flags|O_NOFOLLOW once it is known not to be a
// symlink.
func walkInRoot(rootfd int, path string, flags int) (int, error) {
	stack := []int{rootfd} // stack[0] is not ours to close
	defer func() {
		for _, fd := range stack[1:] {
			unix.Close(fd)
		}
	}()
	rest, links := path, 0
	for {
		rest = strings.TrimLeft(rest, "/")
		dir := stack[len(stack)-1]
		if rest == "" { // the path named a directory
			return retryEINTR(func() (int, error) {
				return unix.Openat(dir, ".", openFlags(flags), 0)
			})
		}
		comp := rest
		if i := strings.IndexByte(rest, '/'); i >= 0 {
			comp, rest = rest[:i], rest[i:]
		} else {
			rest = ""
		}
		switch comp {
		case ".":
			continue
		case "..":
			if len(stack) > 1 {
				unix.Close(stack[len(stack)-1])
				stack = stack[:len(stack)-1]
			}
			continue
		}
		fd, err := retryEINTR(func() (int, error) {
			return unix.Openat(dir, comp, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		})
		if err != nil {
			return -1, fmt.Errorf("walk %q: %w", comp, err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("walk %q: fstat: %w", comp, err)
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFLNK:
			links++
			target, err := readlinkFD(fd)
			unix.Close(fd)
			if err != nil {
				return -1, fmt.Errorf("walk %q: readlink: %w", comp, err)
			}
			if links > maxSymlinks {
				return -1, fmt.Errorf("walk: too many symlinks: %w: %w", ErrUnsafePath, unix.ELOOP)
			}
			if target == "" {
				return -1, fmt.Errorf("walk %q: empty symlink: %w", comp, unix.ENOENT)
			}
			if target[0] == '/' {
				for _, fd := range stack[1:] {
					unix.Close(fd)
				}
				stack = stack[:1]
			}
			rest = target + rest
		case unix.S_IFDIR:
			stack = append(stack, fd)
		default:
			if strings.TrimLeft(rest, "/") != "" {
				unix.Close(fd)
				return -1, fmt.Errorf("walk %q: %w", comp, unix.ENOTDIR)
			}
			if flags == unix.O_PATH {
				return fd, nil
			}
			unix.Close(fd)
			return retryEINTR(func() (int, error) {
				return unix.Openat(dir, comp, openFlags(flags)|unix.O_NOFOLLOW, 0)
			})
		}
	}
}

// openFlags adds O_CLOEXEC, and O_NOCTTY unless flags has O_PATH, which
// openat2 only accepts with O_CLOEXEC, O_DIRECTORY and O_NOFOLLOW.
func openFlags(flags int) int {
	if flags&unix.O_PATH != 0 {
		return flags | unix.O_CLOEXEC
	}
	return flags | unix.O_CLOEXEC | unix.O_NOCTTY
}

func readlinkFD(fd int) (string, error) {
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(fd, "", buf)
	if err != nil {
		return "", err
	}
	if n >= len(buf) {
		return "", unix.ENAMETOOLONG
	}
	return string(buf[:n]), nil
}

// reopen turns the O_PATH descriptor fd into a read-only one for the same
// file: through /proc/self/fd, which re-opens that very inode with no path
// lookup, or, where that is not mounted, by resolving path again
// non-blocking (the caller then checks it got the same inode).
func reopen(rootfd, fd int, path string) (int, error) {
	rfd, err := retryEINTR(func() (int, error) {
		return unix.Open(selfFD+strconv.Itoa(fd), unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	})
	if err == nil || !errors.Is(err, unix.ENOENT) {
		if err != nil {
			return -1, fmt.Errorf("reopen: %w", err)
		}
		return rfd, nil
	}
	rfd, err = openat2InRoot(rootfd, path, unix.O_RDONLY|unix.O_NONBLOCK)
	if err != nil {
		return -1, err
	}
	if err := unix.SetNonblock(rfd, false); err != nil {
		unix.Close(rfd)
		return -1, fmt.Errorf("reopen: %w", err)
	}
	return rfd, nil
}

// classifyErr adds ErrProcessGone to a lookup error when the process is
// gone.
func classifyErr(root string, pid int, err error) error {
	if gone(err) && processGone(root, pid) {
		return fmt.Errorf("%w: %w", ErrProcessGone, err)
	}
	return err
}

func fileType(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return "directory"
	case unix.S_IFCHR:
		return "character device"
	case unix.S_IFBLK:
		return "block device"
	case unix.S_IFIFO:
		return "FIFO"
	case unix.S_IFSOCK:
		return "socket"
	case unix.S_IFLNK:
		return "symlink"
	}
	return fmt.Sprintf("file type %#o", mode&unix.S_IFMT)
}

func retryEINTR(open func() (int, error)) (int, error) {
	for {
		fd, err := open()
		if err != unix.EINTR {
			return fd, err
		}
	}
}

// FileID returns the device and inode of an open file, from fstat. The
// device is encoded like Mapping.Dev.
func FileID(f *os.File) (dev, ino uint64, err error) {
	if f == nil {
		return 0, 0, fmt.Errorf("file id: nil file")
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return 0, 0, fmt.Errorf("file id of %s: %w", f.Name(), err)
	}
	var st unix.Stat_t
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.Fstat(int(fd), &st) }); err != nil {
		return 0, 0, fmt.Errorf("file id of %s: %w", f.Name(), err)
	}
	if serr != nil {
		return 0, 0, fmt.Errorf("file id of %s: fstat: %w", f.Name(), serr)
	}
	return uint64(st.Dev), st.Ino, nil
}
