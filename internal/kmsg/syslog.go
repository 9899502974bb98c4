package kmsg

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// SyslogPath is the Path a Reader reports when it reads the kernel log
// through syslog(2) instead of DefaultPath.
const SyslogPath = "syslog(2)"

// Why a second source: a container opens /dev/kmsg only where its device
// cgroup allows the device (1:11), which Kubernetes grants to privileged
// containers alone; a hostPath mount of the device fails with EPERM
// (docs/SECURITY.md, "The kernel log"). syslog(2)'s non-destructive
// SYSLOG_ACTION_READ_ALL needs CAP_SYSLOG and no device, and containerd's
// and Docker's RuntimeDefault seccomp profiles allow it with that
// capability. It returns text, not records, so this source polls it and
// hands the lines it has not returned before to the Reader as /dev/kmsg
// records with sequence numbers of its own.
const (
	// syslogPoll is how often the source reads the log.
	syslogPoll = time.Second
	// syslogTail is the first read's size each poll: READ_ALL returns the
	// newest records that fit, so a quiet log costs one small read; only
	// when the last line returned before is not among them does the
	// source read the whole ring. The kernel walks the whole ring either
	// way: measured on our CI machines (128 KiB ring), 1.8 ms a poll (2.7 ms
	// for the whole ring), 0.2 % of a core; it grows with log_buf_len.
	syslogTail = 16 << 10
)

// Actions of syslog(2) (klogctl(3)).
const (
	syslogActionReadAll    = 3
	syslogActionSizeBuffer = 10
)

// OpenSyslog opens the kernel log through syslog(2): the returned reader's
// Read blocks until a record written after the open is there and returns
// it in /dev/kmsg's layout, one record per Read. Close ends a pending Read.
// It fails when the caller may not read the log (EPERM without
// CAP_SYSLOG, or under a seccomp profile that refuses syslog).
func OpenSyslog() (io.ReadCloser, error) {
	return openSyslog(unix.Klogctl, syslogPoll)
}

func openSyslog(klogctl func(int, []byte) (int, error), poll time.Duration) (*syslogSource, error) {
	size, err := klogctl(syslogActionSizeBuffer, nil)
	if err != nil {
		return nil, fmt.Errorf("syslog(SYSLOG_ACTION_SIZE_BUFFER): %w", err)
	}
	s := &syslogSource{klogctl: klogctl, poll: poll, full: make([]byte, max(size, syslogTail))}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	// Only what is written from now on, as /dev/kmsg after a seek to its
	// end: remember the newest line.
	lines, err := s.read(syslogTail)
	if err != nil {
		return nil, err
	}
	if len(lines) > 0 {
		s.last = lines[len(lines)-1]
	}
	return s, nil
}

type syslogSource struct {
	klogctl func(int, []byte) (int, error)
	poll    time.Duration
	full    []byte // the whole ring's size

	ctx    context.Context
	cancel context.CancelFunc
	once   sync.Once

	last    []byte   // the newest line handed on (a copy)
	pending [][]byte // lines read, not yet returned
	seq     uint64
	lost    bool // the last line was gone from the ring: some were overwritten
}

// read returns the log's lines from a READ_ALL of at most n bytes; the
// slices point into the source's buffer until the next read.
func (s *syslogSource) read(n int) ([][]byte, error) {
	buf := s.full[:min(n, len(s.full))]
	got, err := s.klogctl(syslogActionReadAll, buf)
	if err != nil {
		return nil, fmt.Errorf("syslog(SYSLOG_ACTION_READ_ALL): %w", err)
	}
	return bytes.Split(bytes.TrimRight(buf[:got], "\n"), []byte("\n")), nil
}

// next reads the log until it has lines newer than the last one returned.
func (s *syslogSource) next() error {
	for {
		for _, n := range []int{syslogTail, len(s.full)} {
			lines, err := s.read(n)
			if err != nil {
				return err
			}
			i := lastIndex(lines, s.last)
			if i < 0 && n < len(s.full) {
				continue // not in the tail: read the whole ring
			}
			if i < 0 && s.last != nil {
				s.lost = true // overwritten before this poll saw them
			}
			for _, l := range lines[i+1:] {
				if len(l) > 0 {
					s.pending = append(s.pending, bytes.Clone(l))
				}
			}
			break
		}
		if len(s.pending) > 0 {
			s.last = s.pending[len(s.pending)-1]
			return nil
		}
		select {
		case <-s.ctx.Done():
			return io.EOF
		case <-time.After(s.poll):
		}
	}
}

// lastIndex is the index of the last line equal to want, or -1.
func lastIndex(lines [][]byte, want []byte) int {
	if want == nil {
		return -1
	}
	for i := len(lines) - 1; i >= 0; i-- {
		if bytes.Equal(lines[i], want) {
			return i
		}
	}
	return -1
}

// Read returns the next record in /dev/kmsg's layout. A gap the ring
// overwrote shows as a skipped sequence number, as /dev/kmsg's would.
func (s *syslogSource) Read(p []byte) (int, error) {
	if len(s.pending) == 0 {
		if err := s.next(); err != nil {
			return 0, err
		}
	}
	line := s.pending[0]
	s.pending = s.pending[1:]
	s.seq++
	if s.lost {
		s.seq++
		s.lost = false
	}
	rec := kmsgRecord(line, s.seq)
	if len(rec) > len(p) {
		return 0, syscall.EINVAL // as /dev/kmsg for a short buffer
	}
	return copy(p, rec), nil
}

// Close ends a pending Read.
func (s *syslogSource) Close() error {
	s.once.Do(s.cancel)
	return nil
}

// kmsgRecord turns one line of READ_ALL ("<prio>[seconds.micros] text",
// the timestamp where printk.time is on) into a /dev/kmsg record with
// sequence number seq, escaping the text as /dev/kmsg does.
func kmsgRecord(line []byte, seq uint64) []byte {
	prio, usec := uint64(0), uint64(0)
	if len(line) > 2 && line[0] == '<' {
		if end := bytes.IndexByte(line, '>'); end > 1 {
			if v, err := strconv.ParseUint(string(line[1:end]), 10, 32); err == nil {
				prio, line = v, line[end+1:]
			}
		}
	}
	if len(line) > 1 && line[0] == '[' {
		if end := bytes.IndexByte(line, ']'); end > 0 {
			secs, micros, ok := bytes.Cut(bytes.TrimSpace(line[1:end]), []byte("."))
			s, err1 := strconv.ParseUint(string(secs), 10, 64)
			m, err2 := strconv.ParseUint(string(micros), 10, 64)
			if ok && err1 == nil && err2 == nil {
				usec, line = s*1e6+m, bytes.TrimPrefix(line[end+1:], []byte(" "))
			}
		}
	}
	out := fmt.Appendf(nil, "%d,%d,%d,-;", prio, seq, usec)
	for _, c := range line {
		if c < ' ' || c >= 0x7f || c == '\\' {
			out = fmt.Appendf(out, `\x%02x`, c)
		} else {
			out = append(out, c)
		}
	}
	return append(out, '\n')
}
