//go:build linux

package discover

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// mapsBufferSize bounds the length of one maps line. The kernel prints at
// most PATH_MAX (4096) path bytes, each of which may be escaped to four
// ("\012"), plus about 100 bytes of fields, so 64 KiB is plenty; a longer
// line is reported as a Problem and skipped.
const mapsBufferSize = 64 << 10

// scanState is the per-scan scratch space, pooled so a scan every few
// seconds does not allocate a 64 KiB buffer each time.
type scanState struct {
	fd      fdReader
	br      *bufio.Reader
	small   [4096]byte // comm and stat
	libs    []Mapping
	deleted []fileKey
	nvtx    bool // Scanner.NVTX
	tracers bool // Scanner.Tracers
	// exe is the process's executable (the first file mapped, in maps
	// order) and its code, for static-runtime detection; exeDone once its
	// executable mapping was seen or another file came first.
	exe     Mapping
	exeDone bool
}

type fileKey struct{ dev, ino uint64 }

var scanStates = sync.Pool{New: func() any {
	s := &scanState{}
	s.br = bufio.NewReaderSize(&s.fd, mapsBufferSize)
	return s
}}

// fdReader reads a raw file descriptor without the allocation and poller
// registration of an *os.File.
type fdReader struct{ fd int }

func (r *fdReader) Read(p []byte) (int, error) {
	for {
		n, err := unix.Read(r.fd, p)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return 0, err
		case n == 0 && len(p) > 0:
			return 0, io.EOF
		}
		return n, nil
	}
}

// Scan reads every process under ProcRoot (or only PID). A process that
// vanishes mid-scan is skipped silently, a malformed maps line is skipped and
// recorded as a Problem while the rest of that file still counts, and an
// unreadable maps, comm or stat file is a Problem. Only a failure to list
// ProcRoot (or, with PID set, to stat it) or a negative PID is an error.
//
// Only lines whose basename starts with "lib" and contains ".so" are parsed
// in full, so a malformed line that does not look like a library mapping
// goes unnoticed.
func (s *Scanner) Scan() (*Result, error) {
	root := procRootOr(s.ProcRoot)
	var pids []int
	switch {
	case s.PID < 0:
		return nil, fmt.Errorf("scan %s: invalid pid %d", root, s.PID)
	case s.PID > 0:
		if _, err := os.Stat(root); err != nil {
			return nil, fmt.Errorf("scan %s: %w", root, err)
		}
		pids = []int{s.PID}
	default:
		var err error
		if pids, err = ListPIDs(root); err != nil {
			return nil, err
		}
	}
	st := scanStates.Get().(*scanState)
	defer scanStates.Put(st)
	st.nvtx, st.tracers = s.NVTX, s.Tracers
	res := &Result{}
	for _, pid := range pids {
		st.scanProcess(root, pid, res)
	}
	st.fd.fd = -1
	st.br.Reset(&st.fd)
	return res, nil
}

// ListPIDs returns the numeric entries of a procfs root in ascending order;
// other entries (self, sys, thread-self, ...) are ignored.
func ListPIDs(procRoot string) ([]int, error) {
	procRoot = procRootOr(procRoot)
	d, err := os.Open(procRoot)
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("list processes in %s: %w", procRoot, err)
	}
	pids := make([]int, 0, len(names))
	for _, name := range names {
		if pid, ok := parsePID(name); ok {
			pids = append(pids, pid)
		}
	}
	slices.Sort(pids)
	return pids, nil
}

// parsePID accepts only canonical positive decimal numbers (no sign, no
// leading zero), which is how procfs names process directories.
func parsePID(s string) (int, bool) {
	if len(s) == 0 || len(s) > 10 || s[0] < '1' || s[0] > '9' {
		return 0, false
	}
	v := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + int(c-'0')
	}
	if v > 1<<31-1 {
		return 0, false
	}
	return v, true
}

// gone reports whether err means that a process (or its procfs entry) no
// longer exists.
func gone(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ESRCH)
}

// openProcDir opens <root>/<pid> as an O_PATH directory. Files opened
// relative to it belong to that very process even if the PID is reused
// meanwhile: procfs then fails the lookup instead.
func openProcDir(root string, pid int) (int, error) {
	for {
		fd, err := unix.Open(root+"/"+strconv.Itoa(pid), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err == unix.EINTR {
			continue
		}
		return fd, err
	}
}

func openat(dirfd int, name string) (int, error) {
	for {
		fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
		if err == unix.EINTR {
			continue
		}
		return fd, err
	}
}

// readSmall reads a small procfs file (comm, stat) relative to dirfd into
// buf. It returns the bytes read, at most len(buf).
func readSmall(dirfd int, name string, buf []byte) ([]byte, error) {
	fd, err := openat(dirfd, name)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	r := fdReader{fd}
	n, err := io.ReadFull(&r, buf)
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		err = nil
	}
	return buf[:n], err
}

func (st *scanState) scanProcess(root string, pid int, res *Result) {
	problems := len(res.Problems)
	dirfd, err := openProcDir(root, pid)
	if err != nil {
		if !gone(err) {
			res.Scanned++
			res.Problems = append(res.Problems, Problem{pid, fmt.Errorf("open proc dir of pid %d: %w", pid, err)})
		}
		return
	}
	defer unix.Close(dirfd)

	libs, vanished := st.readMaps(dirfd, pid, res)
	if vanished {
		res.Problems = res.Problems[:problems]
		return
	}
	res.Scanned++
	if len(libs) == 0 {
		return
	}

	p := Process{PID: pid, Libs: slices.Clone(libs)}
	b, err := readSmall(dirfd, "stat", st.small[:])
	if err == nil {
		_, p.StartTime, err = statFields(b)
	}
	if err != nil {
		if gone(err) {
			res.Problems = res.Problems[:problems]
			return
		}
		res.Problems = append(res.Problems, Problem{pid, fmt.Errorf("read stat of pid %d: %w", pid, err)})
	}
	b, err = readSmall(dirfd, "comm", st.small[:])
	if err != nil {
		if gone(err) {
			res.Problems = res.Problems[:problems]
			return
		}
		res.Problems = append(res.Problems, Problem{pid, fmt.Errorf("read comm of pid %d: %w", pid, err)})
	}
	p.Comm = trimNewline(b)
	if st.tracers {
		// The thread-group leader's tracer: gdb, strace -f and CRIU trace
		// every thread, and a tracer of one other thread alone is not seen
		// (docs/OPERATIONS.md, "Traced processes").
		b, err = readSmall(dirfd, "status", st.small[:])
		if err == nil {
			p.TracerPID, err = ParseTracerPID(b)
		}
		if err != nil {
			if gone(err) {
				res.Problems = res.Problems[:problems]
				return
			}
			res.Problems = append(res.Problems, Problem{pid, fmt.Errorf("read status of pid %d: %w", pid, err)})
		}
	}
	res.Processes = append(res.Processes, p)
}

// readMaps streams /proc/PID/maps and returns the distinct library
// mappings (in st.libs, valid until the next call). vanished is true when
// the process disappeared before or while its maps were read.
func (st *scanState) readMaps(dirfd, pid int, res *Result) (libs []Mapping, vanished bool) {
	st.libs, st.deleted = st.libs[:0], st.deleted[:0]
	st.exe, st.exeDone = Mapping{}, false
	fd, err := openat(dirfd, "maps")
	if err != nil {
		if gone(err) {
			return nil, true
		}
		res.Problems = append(res.Problems, Problem{pid, fmt.Errorf("read maps of pid %d: %w", pid, err)})
		return nil, false
	}
	defer unix.Close(fd)
	st.fd.fd = fd
	st.br.Reset(&st.fd)

	for lineNo := 1; ; lineNo++ {
		line, err := st.br.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			res.Problems = append(res.Problems, Problem{pid, fmt.Errorf("read maps of pid %d: line %d: %w", pid, lineNo, errLineTooLong)})
			for err == bufio.ErrBufferFull {
				_, err = st.br.ReadSlice('\n')
			}
			line = nil
		}
		if len(line) > 0 {
			st.addLine(pid, lineNo, line, res)
		}
		switch {
		case err == nil:
		case err == io.EOF:
			st.addStaticRuntime(pid)
			return st.libs, false
		case gone(err):
			return nil, true
		default:
			res.Problems = append(res.Problems, Problem{pid, fmt.Errorf("read maps of pid %d: %w", pid, err)})
			return st.libs, false
		}
	}
}

// addLine handles one maps line. Lines whose basename cannot be a
// lib*.so* file are dropped before parsing.
func (st *scanState) addLine(pid, lineNo int, line []byte, res *Result) {
	if !st.exeDone {
		st.noteExe(pid, line)
	}
	if !maybeLibrary(line) {
		return
	}
	r, err := parseMaps(line)
	if err != nil {
		res.Problems = append(res.Problems, Problem{pid, fmt.Errorf("read maps of pid %d: line %d: %w", pid, lineNo, err)})
		return
	}
	if !hasFile(r, line) {
		return
	}
	path := line[r.pathStart:r.pathEnd]
	lib, ok := classify(path)
	if !ok || (lib == LibNVTX && !st.nvtx) {
		return
	}
	if r.deleted {
		key := fileKey{r.dev, r.inode}
		if !slices.Contains(st.deleted, key) {
			st.deleted = append(st.deleted, key)
			res.Problems = append(res.Problems, Problem{pid, fmt.Errorf("pid %d maps %s from %q: %w", pid, lib, path, ErrDeletedLibrary)})
		}
		return
	}
	exec := line[r.perms+2] == 'x'
	for i := range st.libs {
		m := &st.libs[i]
		if m.Dev == r.dev && m.Inode == r.inode && m.Lib == lib {
			if exec && m.TextEnd == 0 {
				m.TextStart, m.TextEnd = r.start, r.end
			}
			return
		}
	}
	m := Mapping{PID: pid, Lib: lib, Path: string(path), Dev: r.dev, Inode: r.inode}
	if exec {
		m.TextStart, m.TextEnd = r.start, r.end
	}
	st.libs = append(st.libs, m)
}

// noteExe follows the first lines of maps until the executable's code
// mapping: the executable is the first file mapped (PIE or not).
func (st *scanState) noteExe(pid int, line []byte) {
	r, err := parseMaps(line)
	if err != nil || !hasFile(r, line) || r.deleted {
		return
	}
	if st.exe.Inode == 0 {
		if _, isLib := classify(line[r.pathStart:r.pathEnd]); isLib {
			st.exeDone = true // a library mapped first: no executable to look at
			return
		}
		st.exe = Mapping{PID: pid, Lib: LibCudart, Path: string(line[r.pathStart:r.pathEnd]), Dev: r.dev, Inode: r.inode, Static: true}
	}
	if r.dev != st.exe.Dev || r.inode != st.exe.Inode {
		st.exeDone = true // another file before the executable's code: give up
		return
	}
	if line[r.perms+2] == 'x' {
		st.exe.TextStart, st.exe.TextEnd = r.start, r.end
		st.exeDone = true
	}
}

// addStaticRuntime reports the executable as a possible static runtime
// (Mapping.Static) when the process maps the driver but no libcudart.so:
// only then can a runtime be linked in, and the check stays off every
// other process.
func (st *scanState) addStaticRuntime(pid int) {
	if st.exe.TextEnd == 0 || !slices.ContainsFunc(st.libs, func(m Mapping) bool { return m.Lib == LibCuda }) ||
		slices.ContainsFunc(st.libs, func(m Mapping) bool { return m.Lib == LibCudart }) {
		return
	}
	st.libs = append(st.libs, st.exe)
}

// maybeLibrary is the cheap pre-filter: the text after the last '/' must
// start with "lib" and contain ".so".
func maybeLibrary(line []byte) bool {
	i := len(line) - 1
	for i >= 0 && line[i] != '/' {
		i--
	}
	if i < 0 {
		return false
	}
	base := line[i+1:]
	if len(base) >= 3 && string(base[:3]) == "ld-" {
		return true // a dynamic loader, classified exactly later
	}
	if len(base) < 6 || string(base[:3]) != "lib" {
		return false
	}
	for j := 3; j+3 <= len(base); j++ {
		if base[j] == '.' && base[j+1] == 's' && base[j+2] == 'o' {
			return true
		}
	}
	return false
}

func trimNewline(b []byte) string {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == 0) {
		b = b[:len(b)-1]
	}
	return string(b)
}

// ReadComm returns /proc/PID/comm without its newline. A missing process
// gives an error wrapping ErrProcessGone.
func ReadComm(procRoot string, pid int) (string, error) {
	var buf [256]byte
	b, err := readProcFile(procRootOr(procRoot), pid, "comm", buf[:])
	if err != nil {
		return "", err
	}
	return trimNewline(b), nil
}

// ReadStartTime returns field 22 of /proc/PID/stat, the start time in clock
// ticks since boot. A missing process gives an error wrapping
// ErrProcessGone.
func ReadStartTime(procRoot string, pid int) (uint64, error) {
	_, start, err := readStat(procRootOr(procRoot), pid)
	return start, err
}

// ReadCPUTime returns the user plus system CPU time a process has used
// (fields 14 and 15 of /proc/PID/stat) and its start time, which tells a
// reused PID apart. A missing process gives an error wrapping
// ErrProcessGone.
func ReadCPUTime(procRoot string, pid int) (cpu time.Duration, start uint64, err error) {
	var buf [4096]byte
	b, err := readProcFile(procRootOr(procRoot), pid, "stat", buf[:])
	if err != nil {
		return 0, 0, err
	}
	st, err := parseStat(b)
	if err != nil {
		return 0, 0, fmt.Errorf("read stat of pid %d: %w", pid, err)
	}
	// procfs reports clock ticks of USER_HZ, which is 100 on every Linux ABI.
	return time.Duration(st.utime+st.stime) * (time.Second / 100), st.start, nil
}

func readStat(root string, pid int) (state byte, start uint64, err error) {
	var buf [4096]byte
	b, err := readProcFile(root, pid, "stat", buf[:])
	if err != nil {
		return 0, 0, err
	}
	state, start, err = statFields(b)
	if err != nil {
		return 0, 0, fmt.Errorf("read stat of pid %d: %w", pid, err)
	}
	return state, start, nil
}

func readProcFile(root string, pid int, name string, buf []byte) ([]byte, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("read %s of pid %d: invalid pid", name, pid)
	}
	dirfd, err := openProcDir(root, pid)
	if err == nil {
		defer unix.Close(dirfd)
		var b []byte
		if b, err = readSmall(dirfd, name, buf); err == nil {
			return b, nil
		}
	}
	if gone(err) && processGone(root, pid) {
		return nil, fmt.Errorf("read %s of pid %d: %w: %w", name, pid, ErrProcessGone, err)
	}
	return nil, fmt.Errorf("read %s of pid %d: %w", name, pid, err)
}

// Alive reports whether pid still exists and, when startTime is not 0, was
// started at startTime (so a reused PID is not mistaken for the old
// process). An exited process that is still a zombie is not alive.
func Alive(procRoot string, pid int, startTime uint64) bool {
	if pid <= 0 {
		return false
	}
	state, start, err := readStat(procRootOr(procRoot), pid)
	if err != nil || state == 'Z' || state == 'X' {
		return false
	}
	return startTime == 0 || start == startTime
}

// processGone reports whether <root>/<pid> does not exist any more or
// belongs to a process that has exited (zombie).
func processGone(root string, pid int) bool {
	if _, err := os.Lstat(root + "/" + strconv.Itoa(pid)); err != nil {
		return gone(err)
	}
	var buf [4096]byte
	dirfd, err := openProcDir(root, pid)
	if err != nil {
		return gone(err)
	}
	defer unix.Close(dirfd)
	b, err := readSmall(dirfd, "stat", buf[:])
	if err != nil {
		return false
	}
	state, _, err := statFields(b)
	return err == nil && (state == 'Z' || state == 'X')
}
