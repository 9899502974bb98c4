package kmsg

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Facilities and levels of the records that matter to profi's consumers.
const (
	// FacilityKernel is the facility of the kernel's own printk records.
	// A record written to /dev/kmsg from userspace never has it: the
	// kernel gives such a write facility 1 (user) unless it names another
	// non-zero one, so a process cannot pass its lines off as the kernel's.
	FacilityKernel = 0
	// FacilityUser is the facility of lines userspace wrote to /dev/kmsg
	// without naming one.
	FacilityUser = 1

	LevelEmerg   = 0
	LevelAlert   = 1
	LevelCrit    = 2
	LevelErr     = 3
	LevelWarning = 4
	LevelNotice  = 5
	LevelInfo    = 6
	LevelDebug   = 7
)

// Bounds of one record, whatever the kernel sends.
const (
	// DefaultMaxMessage is the default bound of a record's message; the
	// rest is cut and the record marked Truncated.
	DefaultMaxMessage = 1024
	// maxDict bounds the key=value continuation lines kept per record.
	maxDict = 8
	// maxDictLine bounds one continuation line.
	maxDictLine = 256
)

// ErrMalformed is returned by Parse for a record that does not have the
// /dev/kmsg layout.
var ErrMalformed = errors.New("malformed kernel log record")

// Record is one record of the kernel log as /dev/kmsg returns it:
//
//	<prefix>,<seq>,<µs since boot>,<flag>[,...];<message>\n[ KEY=value\n]...
//
// The message is kept as the kernel escapes it (bytes outside printable
// ASCII, and the backslash, as \xNN), so it never holds a control byte or
// a newline.
type Record struct {
	Facility uint32
	Level    uint8
	Seq      uint64
	// Time is the record's time since boot (the kernel's local clock,
	// microseconds).
	Time time.Duration
	// Flag is '-' for a record of its own, 'c' for the first part of a
	// message continued by the next ('+'), as older kernels mark them.
	Flag byte
	// Message is at most the reader's bound long; Truncated says it was
	// cut.
	Message   string
	Truncated bool
	// Dict holds the continuation lines (" SUBSYSTEM=pci", " DEVICE=+pci:…"),
	// without their leading space; at most 8 of 256 bytes.
	Dict []string
}

// Parse parses one /dev/kmsg record (one read's bytes). maxMessage bounds
// the message (DefaultMaxMessage when 0 or less).
func Parse(b []byte, maxMessage int) (Record, error) {
	if maxMessage <= 0 {
		maxMessage = DefaultMaxMessage
	}
	var r Record
	semi := bytes.IndexByte(b, ';')
	if semi < 0 {
		return r, fmt.Errorf("%w: no ';' after the header", ErrMalformed)
	}
	header, body := b[:semi], b[semi+1:]
	var fields [4][]byte
	n := 0
	for i := 0; n < len(fields); n++ {
		j := bytes.IndexByte(header[i:], ',')
		if j < 0 {
			fields[n] = header[i:]
			n++
			break
		}
		fields[n] = header[i : i+j]
		i += j + 1
	}
	if n < 3 {
		return r, fmt.Errorf("%w: %d header fields, want at least 3", ErrMalformed, n)
	}
	prio, err := strconv.ParseUint(string(fields[0]), 10, 32)
	if err != nil {
		return r, fmt.Errorf("%w: priority: %w", ErrMalformed, err)
	}
	r.Level, r.Facility = uint8(prio&7), uint32(prio>>3)
	if r.Seq, err = strconv.ParseUint(string(fields[1]), 10, 64); err != nil {
		return r, fmt.Errorf("%w: sequence: %w", ErrMalformed, err)
	}
	us, err := strconv.ParseUint(string(fields[2]), 10, 63)
	if err != nil || us > uint64(1<<63-1)/uint64(time.Microsecond) {
		return r, fmt.Errorf("%w: timestamp %q", ErrMalformed, fields[2])
	}
	r.Time = time.Duration(us) * time.Microsecond
	r.Flag = '-'
	if n > 3 && len(fields[3]) > 0 {
		r.Flag = fields[3][0]
	}
	msg, rest := body, []byte(nil)
	if nl := bytes.IndexByte(body, '\n'); nl >= 0 {
		msg, rest = body[:nl], body[nl+1:]
	}
	if len(msg) > maxMessage {
		msg, r.Truncated = msg[:maxMessage], true
	}
	r.Message = string(msg)
	for len(rest) > 0 && len(r.Dict) < maxDict {
		line := rest
		if nl := bytes.IndexByte(rest, '\n'); nl >= 0 {
			line, rest = rest[:nl], rest[nl+1:]
		} else {
			rest = nil
		}
		if len(line) == 0 || line[0] != ' ' {
			continue // not a continuation line: the kernel writes none
		}
		line = line[1:]
		if len(line) > maxDictLine {
			line = line[:maxDictLine]
		}
		r.Dict = append(r.Dict, string(line))
	}
	return r, nil
}

// Format writes r as /dev/kmsg does (a test's records, the fuzz test's
// round trip).
func (r Record) Format() []byte {
	b := strconv.AppendUint(nil, uint64(r.Facility)<<3|uint64(r.Level&7), 10)
	b = append(b, ',')
	b = strconv.AppendUint(b, r.Seq, 10)
	b = append(b, ',')
	b = strconv.AppendUint(b, uint64(r.Time/time.Microsecond), 10)
	b = append(b, ',', r.Flag, ';')
	b = append(b, r.Message...)
	b = append(b, '\n')
	for _, d := range r.Dict {
		b = append(b, ' ')
		b = append(b, d...)
		b = append(b, '\n')
	}
	return b
}
