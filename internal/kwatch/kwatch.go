// Package kwatch watches the kernel log for warnings and oopses in the
// kernel's uprobe code (a WARN in kernel/events/uprobes.c, an oops whose
// call trace runs through handle_swbp or uprobe_single_step_handler) and
// then stops every probe on the node: the kernel itself says the
// mechanism profi's probes ride on misbehaved, and the next trap may hurt
// a process (docs/OPERATIONS.md, "When profi suspects it harms a process").
//
// Only the kernel's own records count (facility 0): a line a process
// writes into /dev/kmsg gets the user facility, so a tenant cannot switch
// the probes off with a forged warning. Nothing of a line reaches a
// label: the reason is one of the Reason constants.
package kwatch

import (
	"strings"

	"github.com/profi-dev/profi/internal/kmsg"
)

// Reasons, the reason label of the node-wide stop.
const (
	ReasonWarning = "kernel_warning" // WARNING: CPU: … at …
	ReasonBug     = "kernel_bug"     // kernel BUG at …, BUG: …
	ReasonOops    = "kernel_oops"    // Oops, Internal error, Unable to handle, general protection fault
)

// maxReport bounds the records of one report the watch looks through for
// a uprobe frame (a WARN with its call trace is about 50).
const maxReport = 256

// Stop is what the watch calls on a classified report: reason is one of
// the Reason constants, line the record that started the report (or the
// frame that tied it to uprobes, when the start did not), as the kernel
// escaped it.
type Stop func(reason, line string)

// Watch classifies kernel log records.
type Watch struct {
	stop Stop
	// TrustUser lets records of any facility count (tests write their
	// warnings from userspace: --kmsg-trust-user, hidden).
	trustUser bool

	open    bool   // inside a report
	reason  string // its kind; "" until its first line says
	start   string
	lines   int
	tripped bool // this report already stopped the probes
	// cpu is the report's CPU ("WARNING: CPU: 3", or its first "CPU: 3
	// PID:" line): a line of another CPU ends it. trace: inside its call
	// trace, the only place (besides its register lines) a frame counts.
	cpu   string
	trace bool
}

// New returns a Watch that calls stop; trustUser: see Watch.
func New(stop Stop, trustUser bool) *Watch {
	return &Watch{stop: stop, trustUser: trustUser}
}

// Consume takes one record (a kmsg.Consumer).
func (w *Watch) Consume(r kmsg.Record) {
	if r.Facility != kmsg.FacilityKernel && !w.trustUser {
		return
	}
	msg := r.Message
	if reason, ok := startOf(msg); ok {
		w.begin(reason, msg)
		if reason != "" {
			if path, ok := warnPath(msg); ok && uprobePath(path) {
				w.trip(msg)
				return
			}
		}
		w.frame(msg)
		return
	}
	if !w.open {
		return
	}
	if strings.HasPrefix(msg, "---[ end ") || otherBacktrace(msg) {
		w.open = false
		return
	}
	if cpu, ok := cpuOf(msg); ok {
		if w.cpu != "" && cpu != w.cpu {
			w.open = false // another CPU's report interleaved: not this one's frames
			return
		}
		w.cpu = cpu
	}
	if t := strings.TrimSpace(msg); t == "Call Trace:" || t == "Call trace:" {
		w.trace = true
		return
	}
	if w.lines++; w.lines > maxReport {
		w.open = false
		return
	}
	if w.reason == "" {
		// "------------[ cut here ]------------" came first; the next
		// line says what it is.
		if reason, ok := kindOf(msg); ok {
			w.reason, w.start = reason, msg
			if path, ok := warnPath(msg); ok && uprobePath(path) {
				w.trip(msg)
				return
			}
		}
	}
	w.frame(msg)
}

func (w *Watch) begin(reason, msg string) {
	if w.open && w.reason != "" && reason == "" {
		return // a cut line inside a report: same report
	}
	w.open, w.reason, w.start, w.lines, w.tripped, w.trace = true, reason, msg, 0, false, false
	w.cpu, _ = cpuOf(msg)
}

// frame trips when msg is a frame of the report naming a uprobe function:
// a register line (pc, lr, RIP) or a line of its call trace.
func (w *Watch) frame(msg string) {
	fn, ok := frameFunc(msg)
	if !ok || !uprobeFunc(fn) {
		return
	}
	if w.trace || registerLine(msg) {
		w.trip(msg)
	}
}

// registerLine: the register dump's instruction pointer or link register.
func registerLine(msg string) bool {
	s := strings.TrimLeft(msg, " ")
	return strings.HasPrefix(s, "pc : ") || strings.HasPrefix(s, "lr : ") || strings.HasPrefix(s, "RIP: ")
}

// otherBacktrace: the start of another CPU's backtrace (an NMI backtrace,
// sysrq, a lockup report's all-CPU dump) interleaved with a report.
func otherBacktrace(msg string) bool {
	return strings.HasPrefix(msg, "NMI backtrace for cpu ") || strings.HasPrefix(msg, "Sending NMI from CPU ")
}

// cpuOf returns N of "WARNING: CPU: N PID: …" and "CPU: N PID: …" (the
// report's task line).
func cpuOf(msg string) (string, bool) {
	s := strings.TrimPrefix(msg, "WARNING: ")
	if !strings.HasPrefix(s, "CPU: ") {
		return "", false
	}
	f := strings.Fields(s[len("CPU: "):])
	if len(f) < 2 || f[1] != "PID:" {
		return "", false
	}
	return f[0], true
}

func (w *Watch) trip(msg string) {
	if w.tripped {
		return
	}
	w.tripped = true
	reason := w.reason
	if reason == "" {
		reason = ReasonWarning // a cut line with a uprobe frame before its WARNING line
	}
	line := w.start
	if line == "" {
		line = msg
	}
	w.stop(reason, line)
}

// startOf says whether msg starts a report, and of which kind ("" for the
// "cut here" line, whose kind the next line says).
func startOf(msg string) (string, bool) {
	if strings.HasPrefix(msg, "------------[ cut here ]") {
		return "", true
	}
	return kindOf(msg)
}

func kindOf(msg string) (string, bool) {
	switch {
	case strings.HasPrefix(msg, "WARNING: CPU: "):
		return ReasonWarning, true
	case strings.HasPrefix(msg, "kernel BUG at "), strings.HasPrefix(msg, "BUG: "):
		return ReasonBug, true
	case strings.HasPrefix(msg, "Oops: "), strings.HasPrefix(msg, "Oops "), strings.HasPrefix(msg, "Internal error: "),
		strings.HasPrefix(msg, "Unable to handle kernel "), strings.HasPrefix(msg, "general protection fault"):
		return ReasonOops, true
	}
	return "", false
}

// warnPath returns the source file of "WARNING: CPU: 3 PID: 1 at
// kernel/events/uprobes.c:2163 handle_swbp+0x3c4/0x4d0" or "kernel BUG at
// kernel/events/uprobes.c:123!".
func warnPath(msg string) (string, bool) {
	i := strings.Index(msg, " at ")
	if i < 0 {
		return "", false
	}
	rest := msg[i+4:]
	j := strings.IndexByte(rest, ':')
	if j < 0 {
		return "", false
	}
	return rest[:j], true
}

// uprobePath: the kernel's uprobe sources (the generic code, its tracing
// front end, each architecture's part).
func uprobePath(p string) bool {
	switch p {
	case "kernel/events/uprobes.c", "kernel/trace/trace_uprobe.c":
		return true
	}
	return strings.HasPrefix(p, "arch/") && (strings.HasSuffix(p, "/kernel/uprobes.c") || strings.HasSuffix(p, "/kernel/probes/uprobes.c"))
}

// frameFunc returns the function of a trace line: " handle_swbp+0x3c4/0x4d0",
// "pc : uprobe_single_step_handler+0x38/0x60", "RIP: 0010:handle_swbp+0x3c4/0x4d0",
// " [<ffffffff8123>] handle_swbp+0x3c4/0x4d0". Frames the unwinder is not
// sure of (" ? name+…") do not count: they are stale stack words.
func frameFunc(msg string) (string, bool) {
	s := strings.TrimLeft(msg, " ")
	switch {
	case strings.HasPrefix(s, "pc : "), strings.HasPrefix(s, "lr : "):
		s = s[5:]
	case strings.HasPrefix(s, "RIP: "):
		s = s[5:]
		if k := strings.IndexByte(s, ':'); k >= 0 {
			s = s[k+1:]
		}
	case strings.HasPrefix(s, "[<"):
		k := strings.Index(s, ">] ")
		if k < 0 {
			return "", false
		}
		s = s[k+3:]
	case strings.HasPrefix(s, "? "):
		return "", false
	}
	plus := strings.Index(s, "+0x")
	if plus <= 0 || strings.ContainsAny(s[:plus], " :") {
		return "", false
	}
	return s[:plus], true
}

// uprobeFunc: functions of the kernel's uprobe code. single_step_handler
// alone is not one: arm64 sends every single step there (ptrace, kgdb);
// a uprobe step shows uprobe_single_step_handler too.
func uprobeFunc(fn string) bool {
	fn = strings.TrimSuffix(fn, ".cold")
	for _, p := range []string{"uprobe_", "uretprobe_", "arch_uprobe_", "arch_uretprobe_", "__uprobe", "bpf_uprobe_multi_", "xol_"} {
		if strings.HasPrefix(fn, p) {
			return true
		}
	}
	switch fn {
	case "handle_swbp", "handle_singlestep", "handle_trampoline", "prepare_uretprobe", "get_xol_area", "__create_xol_area",
		"install_breakpoint", "remove_breakpoint", "register_for_each_vma", "__arm64_sys_uretprobe", "__x64_sys_uretprobe":
		return true
	}
	return false
}
