// Package breaker is the crash circuit breaker: a process that profi
// probes and that dies of a fault signal (SIGILL, SIGTRAP, SIGBUS, SIGFPE,
// SIGSEGV) within --crash-window of a probe hit puts the library file whose
// probe trapped last into quarantine: its probes come off node-wide and stay
// off (until --quarantine-lift, if set). The BPF process-exit program
// reports such deaths (crash_events); the breaker decides and tells the
// attacher. ARCHITECTURE.md, "Crash circuit breaker".
package breaker

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/profi-dev/profi/internal/attach"
	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/status"
)

// Files is what the breaker needs of the attacher.
type Files interface {
	// Quarantine takes the probes of the file with this id off node-wide
	// and keeps them off; ok is false for an id never attached.
	Quarantine(id uint32) (attach.QuarantinedFile, bool)
	// Unquarantine lets the file be attached again.
	Unquarantine(key attach.FileKey)
	// QuarantineAll takes every probe on the node off until the agent
	// restarts.
	QuarantineAll() []attach.QuarantinedFile
}

// LibraryAll is the library label and /status library of a node-wide stop
// (StopAll).
const LibraryAll = "all"

// Options configure a Breaker.
type Options struct {
	// Window is --crash-window: a fault exit this long or less after the
	// process's latest probe hit trips the breaker.
	Window time.Duration
	// Lift is --quarantine-lift: how long a quarantine lasts; 0: until the
	// agent restarts.
	Lift   time.Duration
	Files  Files
	Logger *slog.Logger
	// Now and Monotonic are the wall clock and CLOCK_MONOTONIC (the
	// clock of bpf_ktime_get_ns); for tests.
	Now       func() time.Time
	Monotonic func() time.Duration
}

// Breaker reads crash events and quarantines library files.
type Breaker struct {
	opts Options
	log  *slog.Logger

	mu     sync.Mutex
	active []record             // quarantines in force
	counts map[[2]string]uint64 // (library, reason) → quarantines
	faults map[string]uint64    // fault exits outside the window, by reason
	lost   func() uint64        // crash_events reservations that failed
	seen   map[uint32]string    // paths of quarantined files by file id: later reports of a file already handled

	quarantines, inForce, outside, lostDesc *prometheus.Desc
}

type record struct {
	id  uint32
	key attach.FileKey
	q   status.Quarantine
}

// New returns a Breaker.
func New(opts Options) *Breaker {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Monotonic == nil {
		opts.Monotonic = monotonic
	}
	return &Breaker{
		opts:   opts,
		log:    opts.Logger.With("component", "breaker"),
		counts: map[[2]string]uint64{},
		faults: map[string]uint64{},
		seen:   map[uint32]string{},
		quarantines: prometheus.NewDesc("profi_system_probe_quarantines_total",
			"Library files whose probes the crash breaker took off node-wide: a process that mapped the file died of a fault signal (reason) within --crash-window of a probe hit there; library \"all\": every probe on the node (reason kernel_warning, kernel_bug, kernel_oops: the kernel reported trouble in its uprobe code; unsafe_kernel: a known uprobe bug, at start-up).",
			[]string{"library", "reason"}, nil),
		inForce: prometheus.NewDesc("profi_system_probe_quarantined_files",
			"Library files whose probes are in quarantine now, by the signal that put them there.",
			[]string{"library", "reason"}, nil),
		outside: prometheus.NewDesc("profi_system_probed_process_faults_total",
			"Probed processes that died of a fault signal (reason) more than --crash-window after their latest probe hit: no quarantine.",
			[]string{"reason"}, nil),
		lostDesc: prometheus.NewDesc("profi_system_crash_events_lost_total",
			"Fault exits of probed processes the BPF program could not report (crash_events ring full): the breaker did not see them.",
			nil, nil),
	}
}

// monotonic reads CLOCK_MONOTONIC, the clock of bpf_ktime_get_ns.
func monotonic() time.Duration {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts) // cannot fail for this clock
	return time.Duration(ts.Nano())
}

// signals are the fault signals (the numbers of x86-64 and arm64 alike),
// as the BPF program recognises them (fault_signal in bpf/exit.c).
var signals = map[int32]string{4: "SIGILL", 5: "SIGTRAP", 7: "SIGBUS", 8: "SIGFPE", 11: "SIGSEGV"}

// Handle decides on one crash event.
func (b *Breaker) Handle(ev *bpfobj.ProfiCrashEvent) {
	sig, ok := signals[ev.ExitCode&0x7f]
	if !ok {
		b.log.Warn("crash event with a signal that is not a fault signal, ignored", "pid", ev.Pid, "exit_code", ev.ExitCode)
		return
	}
	reason := strings.ToLower(sig)
	comm := unix.ByteSliceToString(ev.Comm[:])
	var since time.Duration
	if ev.ExitNs > ev.HitNs {
		since = time.Duration(ev.ExitNs - ev.HitNs)
	}
	died := b.opts.Now().Add(-(b.opts.Monotonic() - time.Duration(ev.ExitNs)))
	if since > b.opts.Window {
		b.mu.Lock()
		b.faults[reason]++
		b.mu.Unlock()
		b.log.Info("a probed process died of a fault signal long after its latest probe hit; probes kept", "pid", ev.Pid, "comm", comm, "signal", sig,
			"since_probe_hit", since, "crash_window", b.opts.Window)
		return
	}
	b.mu.Lock()
	if path, ok := b.seen[ev.File]; ok {
		b.mu.Unlock()
		b.log.Info("another probed process died of a fault signal after a probe hit in a file already quarantined", "pid", ev.Pid, "comm", comm, "signal", sig, "path", path)
		return
	}
	b.mu.Unlock()
	f, ok := b.opts.Files.Quarantine(ev.File)
	detached := b.opts.Monotonic() - time.Duration(ev.ExitNs)
	if !ok {
		b.log.Error("a probed process died of a fault signal right after a probe hit, but its library file is no longer known to the agent: nothing quarantined",
			"pid", ev.Pid, "comm", comm, "signal", sig, "since_probe_hit", since, "file_id", ev.File)
		return
	}
	q := status.Quarantine{
		Library: string(f.Lib), Path: f.Path, File: f.Key.String(), Reason: reason,
		PID: int(ev.Pid), Comm: comm, Signal: sig, CoreDumped: ev.ExitCode&0x80 != 0,
		Time: died, SinceHitSeconds: since.Seconds(), DetachSeconds: detached.Seconds(),
		PIDs: slices.Clone(f.PIDs),
	}
	// A discovery pass between the death and now no longer lists it.
	if !slices.Contains(q.PIDs, q.PID) {
		q.PIDs = append(q.PIDs, q.PID)
		slices.Sort(q.PIDs)
	}
	if b.opts.Lift > 0 {
		t := b.opts.Now().Add(b.opts.Lift)
		q.LiftsAt = &t
	}
	b.mu.Lock()
	b.active = append(b.active, record{id: ev.File, key: f.Key, q: q})
	b.seen[ev.File] = q.Path
	b.counts[[2]string{q.Library, reason}]++
	b.mu.Unlock()
	lifts := "not before the agent restarts"
	if q.LiftsAt != nil {
		lifts = q.LiftsAt.Format(time.RFC3339)
	}
	b.log.Error("probes quarantined: a probed process died of a fault signal right after a probe hit; the library's probes are off node-wide",
		"library", q.Library, "path", q.Path, "file", q.File, "pid", q.PID, "comm", comm, "signal", sig,
		"since_probe_hit", since, "detach", detached, "links", f.Links, "pids", q.PIDs, "lifts", lifts)
}

// StopAll takes every probe on the node off until the agent restarts and
// reports it as a quarantine of library "all": reason is a classified
// reason of the caller's fixed set (it becomes a label value), record the
// kernel log line that showed the trouble (line: for /status and the log only,
// as the kernel escaped it, bounded by the kernel log reader). A second
// stop is logged and counted, not repeated.
func (b *Breaker) StopAll(reason, line string) {
	b.mu.Lock()
	for _, r := range b.active {
		if r.q.Library == LibraryAll {
			b.counts[[2]string{LibraryAll, reason}]++
			b.mu.Unlock()
			b.log.Error("another reason to stop every probe; every probe is already off", "reason", reason, "detail", line)
			return
		}
	}
	b.mu.Unlock()
	start := b.opts.Monotonic()
	files := b.opts.Files.QuarantineAll()
	detached := b.opts.Monotonic() - start
	q := status.Quarantine{Library: LibraryAll, Reason: reason, Time: b.opts.Now(), DetachSeconds: detached.Seconds(), KernelLog: line, PIDs: []int{}}
	links := 0
	for _, f := range files {
		links += f.Links
		q.PIDs = append(q.PIDs, f.PIDs...)
	}
	slices.Sort(q.PIDs)
	q.PIDs = slices.Compact(q.PIDs)
	b.mu.Lock()
	b.active = append(b.active, record{q: q})
	b.counts[[2]string{LibraryAll, reason}]++
	b.mu.Unlock()
	b.log.Error("every probe on the node is off, not attached again before the agent restarts: "+stopWhy(reason),
		"reason", reason, "detail", line, "files", len(files), "links", links, "pids", q.PIDs, "detach", detached)
}

// stopWhy says why in words, per reason of StopAll.
func stopWhy(reason string) string {
	if reason == ReasonUnsafeKernel {
		return "the kernel has a known uprobe bug that can hurt a probed process (--allow-unsafe-kernel overrides)"
	}
	return "the kernel reported trouble in its uprobe code"
}

// ReasonUnsafeKernel is StopAll's reason for a known-bad kernel at start-up.
const ReasonUnsafeKernel = "unsafe_kernel"

// lift ends the quarantines whose time is up.
func (b *Breaker) lift() {
	now := b.opts.Now()
	b.mu.Lock()
	var due []record
	b.active = slices.DeleteFunc(b.active, func(r record) bool {
		if r.q.LiftsAt != nil && !now.Before(*r.q.LiftsAt) {
			due = append(due, r)
			return true
		}
		return false
	})
	for _, r := range due {
		delete(b.seen, r.id)
	}
	b.mu.Unlock()
	for _, r := range due {
		b.opts.Files.Unquarantine(r.key)
		b.log.Warn("quarantine lifted (--quarantine-lift): the library is attached again at the next discovery pass", "library", r.q.Library, "path", r.q.Path, "file", r.q.File)
	}
}

// Run reads crash_events until ctx ends; lost counts the reservations that
// failed (crash_lost).
func (b *Breaker) Run(ctx context.Context, ring, lost *ebpf.Map) error {
	if lost != nil {
		b.mu.Lock()
		b.lost = func() uint64 { return sumPerCPU(lost) }
		b.mu.Unlock()
	}
	if b.opts.Lift > 0 {
		go func() {
			t := time.NewTicker(min(b.opts.Lift, time.Second))
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					b.lift()
				}
			}
		}()
	}
	var ev bpfobj.ProfiCrashEvent
	err := bpfobj.ReadRing(ctx, ring, b.log, func(raw []byte) {
		if len(raw) < int(unsafe.Sizeof(ev)) {
			b.log.Warn("short crash event", "bytes", len(raw))
			return
		}
		ev = *(*bpfobj.ProfiCrashEvent)(unsafe.Pointer(&raw[0]))
		b.Handle(&ev)
	})
	if err != nil {
		return fmt.Errorf("crash breaker: %w", err)
	}
	return nil
}

func sumPerCPU(m *ebpf.Map) uint64 {
	var vals []uint64
	if err := m.Lookup(uint32(0), &vals); err != nil {
		return 0
	}
	var n uint64
	for _, v := range vals {
		n += v
	}
	return n
}

// Status returns the quarantines in force, oldest first.
func (b *Breaker) Status() []status.Quarantine {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]status.Quarantine, 0, len(b.active))
	for _, r := range b.active {
		q := r.q
		q.PIDs = slices.Clone(q.PIDs)
		out = append(out, q)
	}
	return out
}

// Describe implements prometheus.Collector.
func (b *Breaker) Describe(ch chan<- *prometheus.Desc) {
	ch <- b.quarantines
	ch <- b.inForce
	ch <- b.outside
	ch <- b.lostDesc
}

// Collect implements prometheus.Collector.
func (b *Breaker) Collect(ch chan<- prometheus.Metric) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for k, n := range b.counts {
		ch <- prometheus.MustNewConstMetric(b.quarantines, prometheus.CounterValue, float64(n), k[0], k[1])
	}
	active := map[[2]string]int{}
	for _, r := range b.active {
		active[[2]string{r.q.Library, r.q.Reason}]++
	}
	for k, n := range active {
		ch <- prometheus.MustNewConstMetric(b.inForce, prometheus.GaugeValue, float64(n), k[0], k[1])
	}
	for r, n := range b.faults {
		ch <- prometheus.MustNewConstMetric(b.outside, prometheus.CounterValue, float64(n), r)
	}
	var lost uint64
	if b.lost != nil {
		lost = b.lost()
	}
	ch <- prometheus.MustNewConstMetric(b.lostDesc, prometheus.CounterValue, float64(lost))
}
