// Package xid turns the NVIDIA driver's Xid lines of the kernel log
// ("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen
// off the bus.") into events on a GPU, counted once each by the kernel
// log's sequence number, with the processes, pods and in-flight NCCL calls
// on that GPU when the line was read (the blast radius). Lines are
// untrusted input: the parser is strict and bounded, a line it refuses is
// counted, never guessed at.
//
// One source of truth per fact: the kernel log carries an identity per
// record (its sequence number) and the PCI bus id, NVML's XID events
// carry neither a sequence nor a time, so an NVML event and a log line
// of the same fault cannot be matched except by a time window. The kernel
// log is therefore the counting source when it can be read; NVML's events
// count only where it cannot (docs/METRICS.md, Xid).
//
// The package must not read the kernel log itself (internal/kmsg does) nor
// format metrics.
package xid

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ErrNotXid is returned by Parse for a message that is not an Xid line.
var ErrNotXid = errors.New("not an Xid line")

// ErrMalformed is returned by Parse for a line that starts as an Xid line
// but does not have its form.
var ErrMalformed = errors.New("malformed Xid line")

// maxDetail bounds the text kept after the code.
const maxDetail = 256

const prefix = "NVRM: Xid (PCI:"

// BusID is a PCI domain, bus and device (the function is always 0 for a
// GPU, and the driver's lines omit it).
type BusID struct {
	Domain uint32
	Bus    uint8
	Device uint8
}

func (b BusID) String() string { return fmt.Sprintf("%08X:%02X:%02X.0", b.Domain, b.Bus, b.Device) }

// Line is one parsed Xid line.
type Line struct {
	Bus  BusID
	Code uint32
	// PID and Name are the process the driver names (pid=, name=); 0 and ""
	// when absent or unknown.
	PID  uint32
	Name string
	// Detail is the rest of the line, at most maxDetail bytes.
	Detail string
}

// ParseBusID parses "0000:3b:00", "00000000:3B:00.0" (NVML's form) and the
// like: a 4-to-8-digit hex domain, 2-digit bus and device, optional ".F".
func ParseBusID(s string) (BusID, error) {
	if i := strings.IndexByte(s, '.'); i >= 0 {
		if len(s)-i != 2 || s[i+1] < '0' || s[i+1] > '7' {
			return BusID{}, fmt.Errorf("%w: PCI function in %q", ErrMalformed, s)
		}
		s = s[:i]
	}
	parts := strings.Split(s, ":")
	if len(parts) != 3 || len(parts[0]) < 4 || len(parts[0]) > 8 || len(parts[1]) != 2 || len(parts[2]) != 2 {
		return BusID{}, fmt.Errorf("%w: PCI bus id %q", ErrMalformed, s)
	}
	d, err1 := strconv.ParseUint(parts[0], 16, 32)
	b, err2 := strconv.ParseUint(parts[1], 16, 8)
	v, err3 := strconv.ParseUint(parts[2], 16, 8)
	if err := errors.Join(err1, err2, err3); err != nil || v > 31 {
		return BusID{}, fmt.Errorf("%w: PCI bus id %q", ErrMalformed, s)
	}
	return BusID{Domain: uint32(d), Bus: uint8(b), Device: uint8(v)}, nil
}

// Parse parses a kernel log message. ErrNotXid: not an Xid line (most of
// the log); ErrMalformed: an Xid line of a form not understood.
func Parse(msg string) (Line, error) {
	if !strings.HasPrefix(msg, prefix) {
		return Line{}, ErrNotXid
	}
	rest := msg[len(prefix):]
	end := strings.Index(rest, "): ")
	if end < 0 || end > 16 {
		return Line{}, fmt.Errorf("%w: no bus id", ErrMalformed)
	}
	bus, err := ParseBusID(rest[:end])
	if err != nil {
		return Line{}, err
	}
	rest = rest[end+3:]
	n := 0
	for n < len(rest) && n < 4 && rest[n] >= '0' && rest[n] <= '9' {
		n++
	}
	if n == 0 || n > 3 || (n < len(rest) && rest[n] != ',') {
		return Line{}, fmt.Errorf("%w: code", ErrMalformed)
	}
	code, _ := strconv.ParseUint(rest[:n], 10, 32)
	l := Line{Bus: bus, Code: uint32(code)}
	rest = strings.TrimPrefix(rest[n:], ", ")
	if v, ok := strings.CutPrefix(rest, "pid="); ok {
		field, after, _ := strings.Cut(v, ", ")
		if pid, err := strconv.ParseUint(field, 10, 32); err == nil {
			l.PID = uint32(pid)
		} else if field != "'<unknown>'" && field != "<unknown>" {
			return Line{}, fmt.Errorf("%w: pid %q", ErrMalformed, bound(field, 32))
		}
		rest = after
		if v, ok := strings.CutPrefix(rest, "name="); ok {
			name, after, _ := strings.Cut(v, ", ")
			l.Name, rest = bound(name, 64), after
		}
	}
	l.Detail = bound(rest, maxDetail)
	return l, nil
}

func bound(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
