package kernelname

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"strconv"
	"syscall"
	"unicode/utf8"

	"github.com/profi-dev/profi/internal/discover"
)

// MaxStringLen is the most bytes ReadString reads, and its default.
const MaxStringLen = 4096

// Errors of ReadString, one per `reason` of
// profi_system_kernel_name_resolve_failures_total (see Reason).
var (
	// ErrOpen: /proc/PID/mem could not be opened (process gone, no
	// permission). It is joined with discover.ErrProcessGone when the
	// process no longer exists.
	ErrOpen = errors.New("cannot open process memory")
	// ErrRead: not a single byte could be read at the address.
	ErrRead = errors.New("cannot read process memory")
	// ErrNotUTF8: the bytes read are not valid UTF-8.
	ErrNotUTF8 = errors.New("string is not valid UTF-8")
	// ErrEmpty: the string at the address is empty (its first byte is NUL).
	ErrEmpty = errors.New("empty string")
)

// Reason returns the `reason` label value for an error of ReadString:
// "open_failed", "read_failed", "not_utf8" or "empty"; "" for nil. Any
// other error counts as "read_failed".
func Reason(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrEmpty):
		return "empty"
	case errors.Is(err, ErrNotUTF8):
		return "not_utf8"
	case errors.Is(err, ErrOpen):
		return "open_failed"
	}
	return "read_failed"
}

// ReadString reads the NUL-terminated string at addr in the memory of
// process pid through <procRoot>/<pid>/mem (procRoot "" means /proc), for
// kernel names handed to __cudaRegisterFunction or cuModuleGetFunction.
//
// It reads at most max bytes (max <= 0 or above MaxStringLen means
// MaxStringLen), one page at a time, and stops at the first NUL. A string
// that runs into an unreadable page is returned up to that page, and one
// that reaches max is returned cut there (without a trailing partial
// rune): both are names, only shorter. The reader needs ptrace-read access
// to the process (its own process, or CAP_SYS_PTRACE).
//
// Errors wrap ErrOpen, ErrRead, ErrNotUTF8 or ErrEmpty; Reason maps them
// to the metric's reasons.
func ReadString(procRoot string, pid int, addr uint64, max int) (string, error) {
	if max <= 0 || max > MaxStringLen {
		max = MaxStringLen
	}
	if pid <= 0 {
		return "", fmt.Errorf("read string in pid %d: invalid pid: %w", pid, ErrOpen)
	}
	root := procRoot
	if root == "" {
		root = discover.DefaultProcRoot
	}
	f, err := os.Open(root + "/" + strconv.Itoa(pid) + "/mem")
	if err != nil {
		if gone(err) {
			return "", fmt.Errorf("read string in pid %d: %w: %w: %w", pid, ErrOpen, discover.ErrProcessGone, err)
		}
		return "", fmt.Errorf("read string in pid %d: %w: %w", pid, ErrOpen, err)
	}
	defer f.Close()

	var buf [MaxStringLen]byte
	n, nul, err := readCString(f, addr, buf[:max])
	switch {
	case err != nil:
		return "", fmt.Errorf("read string at 0x%x in pid %d: %w: %w", addr, pid, ErrRead, err)
	case n == 0 && nul:
		return "", fmt.Errorf("read string at 0x%x in pid %d: %w", addr, pid, ErrEmpty)
	}
	b := buf[:n]
	if !nul {
		b = trimPartialRune(b)
	}
	if len(b) == 0 || !utf8.Valid(b) {
		return "", fmt.Errorf("read string at 0x%x in pid %d: %w", addr, pid, ErrNotUTF8)
	}
	return string(b), nil
}

// gone reports whether an open error of a /proc/PID file means that the
// process no longer exists.
func gone(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH)
}

// pageSize is the unit of ReadString's reads: /proc/PID/mem fails a read
// as a whole only when its first page is unmapped, so reading page by
// page keeps every readable byte before a hole.
var pageSize = uint64(os.Getpagesize())

// readCString reads into buf from r at addr, one page at a time, until a
// NUL byte, a full buf, or a failed read. It returns the number of bytes
// before the NUL (or read), whether a NUL ended the string, and an error
// only if nothing at all could be read.
func readCString(r io.ReaderAt, addr uint64, buf []byte) (n int, nul bool, err error) {
	for n < len(buf) {
		pos := addr + uint64(n)
		if pos < addr || pos > math.MaxInt64 {
			err = fmt.Errorf("address 0x%x out of range", pos)
			break
		}
		chunk := pageSize - pos%pageSize
		if rem := uint64(len(buf) - n); chunk > rem {
			chunk = rem
		}
		k, rerr := r.ReadAt(buf[n:n+int(chunk)], int64(pos))
		if i := bytes.IndexByte(buf[n:n+k], 0); i >= 0 {
			return n + i, true, nil
		}
		n += k
		if k < int(chunk) {
			err = rerr
			if err == nil {
				err = io.ErrUnexpectedEOF
			}
			break
		}
	}
	if n > 0 {
		return n, false, nil
	}
	return 0, false, err
}

// trimPartialRune drops an incomplete UTF-8 sequence at the end of b, left
// by a read cut at max bytes or at an unreadable page.
func trimPartialRune(b []byte) []byte {
	for i := len(b) - 1; i >= 0 && i > len(b)-utf8.UTFMax; i-- {
		if utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:]) {
				return b[:i]
			}
			return b
		}
	}
	return b
}
