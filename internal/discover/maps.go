package discover

import (
	"errors"
	"fmt"
)

// MapsEntry is one parsed line of /proc/PID/maps.
type MapsEntry struct {
	Start, End, Offset uint64
	Perms              string // four characters, e.g. "r-xp"
	Dev, Inode         uint64 // Dev as unix.Mkdev(major, minor) of the hex "major:minor" field
	Path               string // without the " (deleted)" suffix
	Deleted            bool   // the path carried the " (deleted)" suffix
}

// ErrMalformedMapsLine is wrapped by every error ParseMapsLine returns and by
// the scan Problems about bad or overlong maps lines.
var ErrMalformedMapsLine = errors.New("malformed maps line")

// deletedSuffix is what the kernel appends to the path of an unlinked file.
const deletedSuffix = " (deleted)"

func malformed(what string) error { return fmt.Errorf("%w: %s", ErrMalformedMapsLine, what) }

// Preallocated so that rejecting a line does not allocate.
var (
	errEmptyLine   = malformed("empty line")
	errNewline     = malformed("embedded newline")
	errStart       = malformed("bad start address")
	errEnd         = malformed("bad end address")
	errRange       = malformed("end address below start address")
	errPerms       = malformed("bad permissions")
	errOffset      = malformed("bad offset")
	errMajor       = malformed("bad device major")
	errMinor       = malformed("bad device minor")
	errInode       = malformed("bad inode")
	errLineTooLong = malformed("line too long")
)

// ParseMapsLine parses one line of /proc/PID/maps:
//
//	start-end perms offset major:minor inode   path
//
// One trailing newline is ignored. Fields may be separated by any number of
// spaces; the path is everything after the spaces that follow the inode, kept
// verbatim (it may contain spaces) except for a trailing " (deleted)", which
// is cut off and reported as Deleted.
//
// ok is false, with no error, for mappings without a file: no path at all
// (anonymous memory) or a pseudo path that does not start with '/' such as
// [heap], [stack], [vdso] or anon_inode:[perf_event]. Malformed lines
// (missing or non-numeric fields, numbers that overflow 64 bits, or device
// numbers that overflow 32 bits, end below start, bad permissions, embedded
// newlines) return an error wrapping ErrMalformedMapsLine.
func ParseMapsLine(line string) (MapsEntry, bool, error) {
	r, err := parseMaps(line)
	if err != nil {
		return MapsEntry{}, false, err
	}
	if !hasFile(r, line) {
		return MapsEntry{}, false, nil
	}
	return MapsEntry{
		Start:   r.start,
		End:     r.end,
		Offset:  r.offset,
		Perms:   line[r.perms : r.perms+4],
		Dev:     r.dev,
		Inode:   r.inode,
		Path:    line[r.pathStart:r.pathEnd],
		Deleted: r.deleted,
	}, true, nil
}

// rawEntry is a parsed maps line whose strings are still offsets into the
// line, so that parsing allocates nothing.
type rawEntry struct {
	start, end, offset uint64
	dev, inode         uint64
	perms              int // offset of the four permission characters
	pathStart, pathEnd int // path is line[pathStart:pathEnd]; empty when there is none
	deleted            bool
}

// hasFile reports whether the entry maps a file: a path starting with '/'.
func hasFile[T string | []byte](r rawEntry, line T) bool {
	return r.pathEnd > r.pathStart && line[r.pathStart] == '/'
}

// parseMaps is ParseMapsLine for strings and byte slices.
func parseMaps[T string | []byte](line T) (rawEntry, error) {
	var r rawEntry
	n := len(line)
	if n > 0 && line[n-1] == '\n' {
		n--
	}
	if n == 0 {
		return r, errEmptyLine
	}
	for i := 0; i < n; i++ {
		if line[i] == '\n' {
			return r, errNewline
		}
	}
	var i int
	var ok bool
	if r.start, i, ok = parseNum(line, 0, n, 16, 64, '-'); !ok {
		return r, errStart
	}
	if r.end, i, ok = parseNum(line, i+1, n, 16, 64, ' '); !ok {
		return r, errEnd
	}
	if r.end < r.start {
		return r, errRange
	}
	i = skipSpaces(line, i, n)
	if i+4 >= n || !validPerms(line[i], line[i+1], line[i+2], line[i+3]) || line[i+4] != ' ' {
		return r, errPerms
	}
	r.perms = i
	i = skipSpaces(line, i+4, n)
	if r.offset, i, ok = parseNum(line, i, n, 16, 64, ' '); !ok {
		return r, errOffset
	}
	i = skipSpaces(line, i, n)
	var major, minor uint64
	if major, i, ok = parseNum(line, i, n, 16, 32, ':'); !ok {
		return r, errMajor
	}
	if minor, i, ok = parseNum(line, i+1, n, 16, 32, ' '); !ok {
		return r, errMinor
	}
	r.dev = mkdev(uint32(major), uint32(minor))
	i = skipSpaces(line, i, n)
	// The inode is the last field when there is no path, so the end of the
	// line terminates it as well as a space does.
	if r.inode, i, ok = parseNum(line, i, n, 10, 64, ' '); !ok {
		return r, errInode
	}
	i = skipSpaces(line, i, n)
	r.pathStart, r.pathEnd = i, n
	if n-i > len(deletedSuffix) && string(line[n-len(deletedSuffix):n]) == deletedSuffix {
		r.pathEnd -= len(deletedSuffix)
		r.deleted = true
	}
	return r, nil
}

// parseNum parses an unsigned number in base 10 or 16 starting at line[i]
// that must fit in bits bits and is ended by term or by the end of the line
// (at n). It returns the value and the index of the terminator. At least
// one digit is required; any number of leading zeros is accepted.
func parseNum[T string | []byte](line T, i, n, base int, bits uint, term byte) (uint64, int, bool) {
	limit := uint64(1)<<bits - 1
	if bits == 64 {
		limit = ^uint64(0)
	}
	var v uint64
	start := i
	for ; i < n; i++ {
		c := line[i]
		var d uint64
		switch {
		case c >= '0' && c <= '9':
			d = uint64(c - '0')
		case base == 16 && c >= 'a' && c <= 'f':
			d = uint64(c-'a') + 10
		case base == 16 && c >= 'A' && c <= 'F':
			d = uint64(c-'A') + 10
		case c == term:
			return v, i, i > start
		default:
			return 0, i, false
		}
		if v > (limit-d)/uint64(base) {
			return 0, i, false // overflow
		}
		v = v*uint64(base) + d
	}
	// End of line: only the inode may end the line, and it passes ' '.
	return v, i, i > start && term == ' '
}

func skipSpaces[T string | []byte](line T, i, n int) int {
	for i < n && line[i] == ' ' {
		i++
	}
	return i
}

func validPerms(r, w, x, s byte) bool {
	return (r == 'r' || r == '-') && (w == 'w' || w == '-') &&
		(x == 'x' || x == '-') && (s == 'p' || s == 's')
}

// mkdev encodes a device number like glibc's makedev and unix.Mkdev on
// Linux, which is also how the kernel reports st_dev, so Mapping.Dev can be
// compared with FileID. It is spelled out here because the parser is
// portable.
func mkdev(major, minor uint32) uint64 {
	return uint64(major&0xfffff000)<<32 | uint64(major&0x00000fff)<<8 |
		uint64(minor&0xffffff00)<<12 | uint64(minor&0x000000ff)
}
