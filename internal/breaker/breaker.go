// Package breaker is the crash circuit breaker. It acts on evidence: a
// probed process killed by a fault signal (SIGILL, SIGTRAP, SIGBUS, SIGFPE,
// SIGSEGV, SIGSYS) counts only when the kernel raised the fault (never kill,
// tgkill or sigqueue) and a probe explains it: the instruction pointer is in
// the uprobe out-of-line page or at a probed instruction, a return probe's
// hijacked return came out wrong, or a seccomp filter killed the process in
// the return probe's system call (bpf/exit.c). Every other fault death is
// counted and nothing happens. In proportion: a first attributed crash
// leaves that file unprobed in the dead process's tenant (its pod, else its cgroup); one
// in a second tenant takes the file's probes off node-wide. Quarantines lift
// by themselves after --quarantine-lift, doubling each time the file is
// quarantined again (0: never). ARCHITECTURE.md, "Crash circuit breaker".
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
	// QuarantineTenant leaves the tenant's processes unprobed in the file
	// with this id; ok is false for an id not attached.
	QuarantineTenant(id uint32, tenant uint64) (attach.QuarantinedFile, bool)
	// UnquarantineTenant probes them there again.
	UnquarantineTenant(key attach.FileKey, tenant uint64)
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

// Scopes of a quarantine (the scope label, /status scope).
const (
	ScopeTenant = "tenant"
	ScopeNode   = "node"
)

// Options configure a Breaker.
type Options struct {
	// Lift is --quarantine-lift: how long a file's first quarantine
	// lasts, doubled at each later one of the same file; 0: until the
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
	active []record                // quarantines in force
	counts map[[3]string]uint64    // (library, reason, scope) → quarantines
	faults map[[2]string]uint64    // (reason, attributed) → fault deaths of probed processes
	lost   func() uint64           // crash_events reservations that failed
	times  map[attach.FileKey]uint // quarantines of each file so far: the backoff's exponent

	quarantines, inForce, faultsDesc, lostDesc *prometheus.Desc
}

type record struct {
	id     uint32
	key    attach.FileKey
	tenant uint64 // the tenant of a tenant quarantine
	q      status.Quarantine
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
		counts: map[[3]string]uint64{},
		faults: map[[2]string]uint64{},
		times:  map[attach.FileKey]uint{},
		quarantines: prometheus.NewDesc("profi_system_probe_quarantines_total",
			"Library files the crash breaker quarantined: a probed process died of a fault signal (reason) that a probe explains (scope tenant: the file is left unprobed in that process's tenant; scope node: crashes in two tenants took its probes off node-wide); library \"all\": every probe on the node (reason kernel_warning, kernel_bug, kernel_oops: the kernel reported trouble in its uprobe code; unsafe_kernel: a known uprobe bug, at start-up).",
			[]string{"library", "reason", "scope"}, nil),
		inForce: prometheus.NewDesc("profi_system_probe_quarantined_files",
			"Library files in quarantine now, by the signal that put them there and scope (tenant, node).",
			[]string{"library", "reason", "scope"}, nil),
		faultsDesc: prometheus.NewDesc("profi_system_probed_process_faults_total",
			"Probed processes that died of a fault signal (reason), attributed=\"true\" when a probe explains the fault (the breaker acted), \"false\" otherwise (a fault of the process's own, or a signal sent with kill, tgkill or sigqueue: nothing quarantined).",
			[]string{"reason", "attributed"}, nil),
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
// as the BPF programs recognise them (fault_signal in bpf/exit.c).
var signals = map[int32]string{4: "SIGILL", 5: "SIGTRAP", 7: "SIGBUS", 8: "SIGFPE", 11: "SIGSEGV", 31: "SIGSYS"}

// Evidence names the bits of enum fault_why (bpf/types.h), in order.
var Evidence = []string{"out_of_line_page", "probed_instruction", "return_probe_return", "uretprobe_syscall"}

// evidence lists the names of why's bits.
func evidence(why uint8) []string {
	var out []string
	for i, name := range Evidence {
		if why&(1<<i) != 0 {
			out = append(out, name)
		}
	}
	return out
}

// Attributed reports whether ev's death is the probes' doing: the
// signal that killed the process is the fault the kernel raised in it
// last, and a probe explains that fault.
func Attributed(ev *bpfobj.ProfiCrashEvent) bool {
	return ev.FaultWhy != 0 && int32(ev.FaultSig) == ev.ExitCode&0x7f
}

// Handle decides on one crash event.
func (b *Breaker) Handle(ev *bpfobj.ProfiCrashEvent) {
	sig, ok := signals[ev.ExitCode&0x7f]
	if !ok {
		b.log.Warn("crash event with a signal that is not a fault signal, ignored", "pid", ev.Pid, "exit_code", ev.ExitCode)
		return
	}
	reason := strings.ToLower(sig)
	comm := unix.ByteSliceToString(ev.Comm[:])
	attributed := Attributed(ev)
	b.mu.Lock()
	b.faults[[2]string{reason, fmt.Sprint(attributed)}]++
	b.mu.Unlock()
	fault := []any{"pid", ev.Pid, "comm", comm, "signal", sig, "fault_signal", signals[int32(ev.FaultSig)], "si_code", ev.FaultCode,
		"fault_ip", fmt.Sprintf("%#x", ev.FaultIp), "fault_addr", fmt.Sprintf("%#x", ev.FaultAddr), "tenant", ev.Tenant}
	if !attributed {
		b.log.Info("a probed process died of a fault signal that no probe explains (its own fault, or a signal sent to it); probes kept", fault...)
		return
	}
	why := evidence(ev.FaultWhy)
	fault = append(fault, "evidence", why)
	var since time.Duration
	if ev.ExitNs > ev.HitNs {
		since = time.Duration(ev.ExitNs - ev.HitNs)
	}
	died := b.opts.Now().Add(-(b.opts.Monotonic() - time.Duration(ev.ExitNs)))

	b.mu.Lock()
	node, tenants := false, []record(nil)
	for _, r := range b.active {
		switch {
		case r.id != ev.File || r.q.Library == LibraryAll:
		case r.q.Scope == ScopeNode:
			node = true
		case r.tenant == ev.Tenant:
			b.mu.Unlock()
			b.log.Warn("another attributed crash in a tenant already quarantined for the file (a process of it that had made no probed call yet)", fault...)
			return
		default:
			tenants = append(tenants, r)
		}
	}
	b.mu.Unlock()
	if node {
		b.log.Warn("another attributed crash in a file already quarantined node-wide", fault...)
		return
	}
	scope := ScopeTenant
	var f attach.QuarantinedFile
	if len(tenants) > 0 {
		// A second tenant: the file is the trouble, not one tenant.
		scope = ScopeNode
		f, ok = b.opts.Files.Quarantine(ev.File)
	} else {
		f, ok = b.opts.Files.QuarantineTenant(ev.File, ev.Tenant)
	}
	detached := b.opts.Monotonic() - time.Duration(ev.ExitNs)
	if !ok {
		b.log.Error("a probe explains the fault that killed a probed process, but its library file is no longer attached: nothing quarantined", fault...)
		return
	}
	q := status.Quarantine{
		Library: string(f.Lib), Path: f.Path, File: f.Key.String(), Reason: reason, Scope: scope, Tenant: ev.Tenant,
		PID: int(ev.Pid), Comm: comm, Signal: sig, CoreDumped: ev.ExitCode&0x80 != 0, Evidence: why,
		FaultIP: ev.FaultIp, FaultAddr: ev.FaultAddr, SiCode: ev.FaultCode,
		Time: died, SinceHitSeconds: since.Seconds(), DetachSeconds: detached.Seconds(),
		PIDs: slices.Clone(f.PIDs),
	}
	if !slices.Contains(q.PIDs, q.PID) {
		q.PIDs = append(q.PIDs, q.PID)
		slices.Sort(q.PIDs)
	}
	b.mu.Lock()
	if b.opts.Lift > 0 {
		t := b.opts.Now().Add(b.opts.Lift << min(b.times[f.Key], 16))
		q.LiftsAt = &t
	}
	b.times[f.Key]++
	if scope == ScopeNode {
		// The node-wide quarantine replaces the tenants'.
		b.active = slices.DeleteFunc(b.active, func(r record) bool { return r.id == ev.File && r.q.Scope == ScopeTenant })
	}
	b.active = append(b.active, record{id: ev.File, key: f.Key, tenant: ev.Tenant, q: q})
	b.counts[[3]string{q.Library, reason, scope}]++
	b.mu.Unlock()
	if scope == ScopeNode {
		for _, r := range tenants {
			b.opts.Files.UnquarantineTenant(r.key, r.tenant)
		}
	}
	lifts := "not before the agent restarts"
	if q.LiftsAt != nil {
		lifts = q.LiftsAt.Format(time.RFC3339)
	}
	fault = append(fault, "library", q.Library, "path", q.Path, "file", q.File, "since_probe_hit", since, "detach", detached, "links", f.Links, "pids", q.PIDs, "lifts", lifts)
	if scope == ScopeNode {
		b.log.Error("probes quarantined node-wide: a probe explains the faults that killed processes of two tenants; the library's probes are off on the node", fault...)
		return
	}
	b.log.Warn("probes quarantined for one tenant: a probe explains the fault that killed a probed process; the library is left unprobed in its tenant's processes", fault...)
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
			b.counts[[3]string{LibraryAll, reason, ScopeNode}]++
			b.mu.Unlock()
			b.log.Error("another reason to stop every probe; every probe is already off", "reason", reason, "detail", line)
			return
		}
	}
	b.mu.Unlock()
	start := b.opts.Monotonic()
	files := b.opts.Files.QuarantineAll()
	detached := b.opts.Monotonic() - start
	q := status.Quarantine{Library: LibraryAll, Reason: reason, Scope: ScopeNode, Time: b.opts.Now(), DetachSeconds: detached.Seconds(), KernelLog: line, PIDs: []int{}}
	links := 0
	for _, f := range files {
		links += f.Links
		q.PIDs = append(q.PIDs, f.PIDs...)
	}
	slices.Sort(q.PIDs)
	q.PIDs = slices.Compact(q.PIDs)
	b.mu.Lock()
	b.active = append(b.active, record{q: q})
	b.counts[[3]string{LibraryAll, reason, ScopeNode}]++
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
	b.mu.Unlock()
	for _, r := range due {
		if r.q.Scope == ScopeTenant {
			b.opts.Files.UnquarantineTenant(r.key, r.tenant)
		} else {
			b.opts.Files.Unquarantine(r.key)
		}
		b.log.Warn("quarantine lifted (--quarantine-lift, doubling at each quarantine of the file): the library is probed again from the next discovery pass",
			"library", r.q.Library, "path", r.q.Path, "file", r.q.File, "scope", r.q.Scope, "tenant", r.tenant)
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
	ch <- b.faultsDesc
	ch <- b.lostDesc
}

// Collect implements prometheus.Collector.
func (b *Breaker) Collect(ch chan<- prometheus.Metric) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for k, n := range b.counts {
		ch <- prometheus.MustNewConstMetric(b.quarantines, prometheus.CounterValue, float64(n), k[0], k[1], k[2])
	}
	active := map[[3]string]int{}
	for _, r := range b.active {
		active[[3]string{r.q.Library, r.q.Reason, r.q.Scope}]++
	}
	for k, n := range active {
		ch <- prometheus.MustNewConstMetric(b.inForce, prometheus.GaugeValue, float64(n), k[0], k[1], k[2])
	}
	for k, n := range b.faults {
		ch <- prometheus.MustNewConstMetric(b.faultsDesc, prometheus.CounterValue, float64(n), k[0], k[1])
	}
	var lost uint64
	if b.lost != nil {
		lost = b.lost()
	}
	ch <- prometheus.MustNewConstMetric(b.lostDesc, prometheus.CounterValue, float64(lost))
}
