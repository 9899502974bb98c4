// Package kmsg follows the kernel log (/dev/kmsg) and hands its records
// to consumers: the kernel-warning watch of the probe safety net
// (internal/kwatch) and whoever else needs the kernel's own word (GPU Xid
// lines). It reads only records written after the agent started (it seeks
// to the end first: the log holds other programs' history, and tests of
// other processes write to it), bounds every record's length and the rate
// at which records reach consumers, and counts every record it does not
// deliver. Lines are untrusted input: a consumer classifies, never copies
// a message into a metric label.
package kmsg

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
)

// DefaultPath is the kernel log device.
const DefaultPath = "/dev/kmsg"

// bufSize is the read buffer: a /dev/kmsg read returns one whole record
// or fails with EINVAL when the buffer is shorter than the record; the
// kernel formats at most 8 KiB per record (CONSOLE_EXT_LOG_MAX).
const bufSize = 16 << 10

// maxShort is how many EINVAL reads in a row the reader accepts before it
// gives up: a kernel that skips the record it cannot return (every kernel
// profi supports) never sends two for one record, so a run means the
// reader would spin.
const maxShort = 64

// Drop reasons, the reason label of profi_system_kmsg_drops_total.
const (
	// DropOverwritten: the kernel's ring overwrote records before they were
	// read (EPIPE, or a gap in the sequence numbers).
	DropOverwritten = "overwritten"
	// DropTooLong: a record longer than the read buffer (EINVAL).
	DropTooLong = "too_long"
	// DropRate: more records than the rate bound lets through.
	DropRate = "rate"
	// DropMalformed: a record that did not parse.
	DropMalformed = "malformed"
)

var dropReasons = []string{DropOverwritten, DropTooLong, DropRate, DropMalformed}

// Consumer receives each delivered record, on the reader's goroutine, in
// the order the kernel wrote them. It must return quickly (no I/O that can
// block) and must not keep the Dict slice.
type Consumer func(Record)

// Options configure a Reader.
type Options struct {
	// Path is the kernel log device; DefaultPath when empty.
	Path string
	// MaxMessage bounds a record's message (DefaultMaxMessage when 0).
	MaxMessage int
	// Rate and Burst bound the records handed to consumers per second
	// (default 1000 and 2000: a kernel warning with its call trace is
	// about 50 records).
	Rate  rate.Limit
	Burst int
	// Logger; discarded when nil.
	Logger *slog.Logger
	// Open opens the log (tests); os.OpenFile of Path, non-blocking, and a
	// seek to its end, when nil.
	Open func(path string) (io.ReadCloser, error)
	// Fallback opens the log another way when Open finds no Path or may
	// not open it (a container: OpenSyslog); the reader then reports
	// SyslogPath as its path. Nil: no fallback.
	Fallback func() (io.ReadCloser, error)
}

// Reader follows the kernel log.
type Reader struct {
	opts Options
	log  *slog.Logger
	lim  *rate.Limiter

	mu        sync.Mutex
	path      string // what it reads: opts.Path, or SyslogPath
	consumers []Consumer
	records   uint64
	truncated uint64
	drops     map[string]uint64
	running   bool
	err       string

	recordsDesc, dropsDesc, truncDesc *prometheus.Desc
}

// New returns a Reader; Run starts it.
func New(opts Options) *Reader {
	if opts.Path == "" {
		opts.Path = DefaultPath
	}
	if opts.MaxMessage <= 0 {
		opts.MaxMessage = DefaultMaxMessage
	}
	if opts.Rate <= 0 {
		opts.Rate = 1000
	}
	if opts.Burst <= 0 {
		opts.Burst = 2000
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Open == nil {
		opts.Open = openEnd
	}
	return &Reader{
		opts:  opts,
		path:  opts.Path,
		log:   opts.Logger.With("component", "kmsg"),
		lim:   rate.NewLimiter(opts.Rate, opts.Burst),
		drops: map[string]uint64{},
		recordsDesc: prometheus.NewDesc("profi_system_kmsg_records_total",
			"Kernel log records read from /dev/kmsg since the agent started (records written before it started are not read).",
			nil, nil),
		dropsDesc: prometheus.NewDesc("profi_system_kmsg_drops_total",
			"Kernel log records not handed to profi's consumers, by reason: overwritten (the kernel's ring overwrote them before they were read), too_long, rate (over the rate bound), malformed.",
			[]string{"reason"}, nil),
		truncDesc: prometheus.NewDesc("profi_system_kmsg_truncated_total",
			"Kernel log records whose message was cut at the length bound before it was handed on.",
			nil, nil),
	}
}

// openEnd opens the log non-blocking (so that Go's poller waits for
// records and Close ends a pending read) and seeks past its last record.
func openEnd(path string) (io.ReadCloser, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	if _, err := f.Seek(0, io.SeekEnd); err != nil {
		f.Close()
		return nil, fmt.Errorf("seek to the end of %s: %w", path, err)
	}
	return f, nil
}

// Subscribe adds a consumer. Consumers added after Run started see the
// records read from then on.
func (r *Reader) Subscribe(c Consumer) {
	r.mu.Lock()
	r.consumers = append(r.consumers, c)
	r.mu.Unlock()
}

// Run reads the log until ctx ends. It returns an error when the log
// cannot be opened or read; the caller logs it and goes on without the
// kernel log (Status says why).
func (r *Reader) Run(ctx context.Context) error {
	f, err := r.opts.Open(r.opts.Path)
	if err != nil && r.opts.Fallback != nil &&
		(errors.Is(err, os.ErrNotExist) || errors.Is(err, os.ErrPermission)) {
		var ferr error
		if f, ferr = r.opts.Fallback(); ferr == nil {
			r.log.Info("kernel log read through syslog(2)", "path", r.opts.Path, "reason", err)
			r.mu.Lock()
			r.path = SyslogPath
			r.mu.Unlock()
			err = nil
		} else {
			err = fmt.Errorf("%w; %s: %w", err, SyslogPath, ferr)
		}
	}
	if err != nil {
		err = fmt.Errorf("open the kernel log: %w", err)
		r.setState(false, err)
		return err
	}
	r.setState(true, nil)
	stop := context.AfterFunc(ctx, func() { f.Close() })
	defer func() {
		if stop() {
			f.Close()
		}
	}()
	err = r.loop(ctx, f)
	if ctx.Err() != nil {
		err = nil
	}
	r.setState(false, err)
	return err
}

func (r *Reader) loop(ctx context.Context, f io.Reader) error {
	buf := make([]byte, bufSize)
	var last uint64
	seen, short := false, 0
	for {
		n, err := f.Read(buf)
		switch {
		case err == nil:
		case errors.Is(err, syscall.EPIPE):
			// Our next record was overwritten; the kernel moved us to the
			// oldest it has. How many were lost, the next sequence
			// number says (at least one when there is no earlier one).
			if !seen {
				r.drop(DropOverwritten, 1)
			}
			continue
		case errors.Is(err, syscall.EINVAL):
			r.drop(DropTooLong, 1)
			if short++; short >= maxShort {
				return fmt.Errorf("read %s: %d records in a row longer than %d bytes", r.path, short, bufSize)
			}
			continue
		case errors.Is(err, syscall.EAGAIN), errors.Is(err, syscall.EINTR):
			continue // a source without Go's poller
		case ctx.Err() != nil:
			return nil
		default:
			return fmt.Errorf("read %s: %w", r.path, err)
		}
		short = 0
		rec, err := Parse(buf[:n], r.opts.MaxMessage)
		if err != nil {
			r.drop(DropMalformed, 1)
			continue
		}
		r.mu.Lock()
		if seen && rec.Seq > last+1 {
			r.drops[DropOverwritten] += rec.Seq - last - 1
		}
		last, seen = rec.Seq, true
		if !r.lim.Allow() {
			r.drops[DropRate]++
			r.mu.Unlock()
			continue
		}
		r.records++
		if rec.Truncated {
			r.truncated++
		}
		consumers := r.consumers
		r.mu.Unlock()
		for _, c := range consumers {
			c(rec)
		}
	}
}

// Off records that the reader is not run, and why (Stats.Error).
func (r *Reader) Off(why string) {
	r.setState(false, fmt.Errorf("off: %s", why))
}

func (r *Reader) drop(reason string, n uint64) {
	r.mu.Lock()
	r.drops[reason] += n
	r.mu.Unlock()
}

func (r *Reader) setState(running bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.running = running
	r.err = ""
	if err != nil {
		r.err = err.Error()
	}
}

// Stats are the reader's counts.
type Stats struct {
	Path string `json:"path"`
	// Running: the reader has the log open.
	Running bool `json:"running"`
	// Error: why it stopped or never started.
	Error     string            `json:"error,omitempty"`
	Records   uint64            `json:"records"`
	Truncated uint64            `json:"truncated"`
	Drops     map[string]uint64 `json:"drops,omitempty"`
}

// Stats returns the reader's counts and state.
func (r *Reader) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := Stats{Path: r.path, Running: r.running, Error: r.err, Records: r.records, Truncated: r.truncated}
	for k, v := range r.drops {
		if v > 0 {
			if s.Drops == nil {
				s.Drops = map[string]uint64{}
			}
			s.Drops[k] = v
		}
	}
	return s
}

// Describe implements prometheus.Collector.
func (r *Reader) Describe(ch chan<- *prometheus.Desc) {
	ch <- r.recordsDesc
	ch <- r.dropsDesc
	ch <- r.truncDesc
}

// Collect implements prometheus.Collector.
func (r *Reader) Collect(ch chan<- prometheus.Metric) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(r.recordsDesc, prometheus.CounterValue, float64(r.records))
	ch <- prometheus.MustNewConstMetric(r.truncDesc, prometheus.CounterValue, float64(r.truncated))
	for _, reason := range dropReasons {
		ch <- prometheus.MustNewConstMetric(r.dropsDesc, prometheus.CounterValue, float64(r.drops[reason]), reason)
	}
}
