package kwatch

import (
	"reflect"
	"strings"
	"testing"

	"github.com/profi-dev/profi/internal/kmsg"
)

type stopped struct{ reason, line string }

func run(t *testing.T, trustUser bool, facility uint32, lines string) []stopped {
	t.Helper()
	var got []stopped
	w := New(func(reason, line string) { got = append(got, stopped{reason, line}) }, trustUser)
	for i, l := range strings.Split(strings.Trim(lines, "\n"), "\n") {
		w.Consume(kmsg.Record{Facility: facility, Level: kmsg.LevelWarning, Seq: uint64(i), Message: l})
	}
	return got
}

const x86Warn = `------------[ cut here ]------------
WARNING: CPU: 3 PID: 4711 at kernel/events/uprobes.c:2163 handle_swbp+0x3c4/0x4d0
Modules linked in: nvidia_uvm(PO) nvidia(PO)
CPU: 3 PID: 4711 Comm: python Tainted: P           O       6.1.0-27-amd64 #1  Debian 6.1.115-1
RIP: 0010:handle_swbp+0x3c4/0x4d0
Call Trace:
 <TASK>
 ? __warn+0x7d/0xc0
 uprobe_notify_resume+0x2e/0x40
 exit_to_user_mode_prepare+0xd4/0x180
 </TASK>
---[ end trace 0000000000000000 ]---`

// The arm64 warning of the reference (a debugger single-stepping a thread
// that hit a simulated uprobe).
const arm64Warn = `------------[ cut here ]------------
WARNING: CPU: 12 PID: 9001 at arch/arm64/kernel/probes/uprobes.c:205 uprobe_single_step_handler+0x50/0x60
Modules linked in: nvidia(O)
pc : uprobe_single_step_handler+0x50/0x60
lr : call_step_hook+0x54/0x90
Call trace:
 uprobe_single_step_handler+0x50/0x60
 single_step_handler+0x74/0x120
 el0_ss+0x44/0xe0
---[ end trace 0000000000000000 ]---`

const oopsTrace = `Unable to handle kernel NULL pointer dereference at virtual address 0000000000000008
Internal error: Oops: 0000000096000004 [#1] PREEMPT SMP
pc : xol_get_insn_slot+0x1c/0x140
Call trace:
 xol_get_insn_slot+0x1c/0x140
 arch_uprobe_pre_xol+0x20/0x90
---[ end trace 0000000000000000 ]---`

const bugAt = `kernel BUG at kernel/events/uprobes.c:1034!
invalid opcode: 0000 [#1] PREEMPT SMP NOPTI`

const netWarn = `------------[ cut here ]------------
WARNING: CPU: 0 PID: 1 at net/core/dev.c:1234 netdev_foo+0x10/0x20
Call Trace:
 ? uprobe_notify_resume+0x2e/0x40
 netdev_foo+0x10/0x20
---[ end trace 0000000000000000 ]---`

// A single step a debugger asked for, warned about outside the uprobe
// code: single_step_handler alone does not count.
const stepWarn = `------------[ cut here ]------------
WARNING: CPU: 1 PID: 77 at arch/arm64/kernel/debug-monitors.c:230 single_step_handler+0x90/0x120
Call trace:
 single_step_handler+0x90/0x120
 el0_ss+0x44/0xe0
---[ end trace 0000000000000000 ]---`

// Lines that mention uprobes outside a report.
const chatter = `uprobe: profi:123 registered
trace_uprobe: Probe definition must be started with 'p', 'r' or '-'.
 uprobe_notify_resume+0x2e/0x40`

// An unrelated warning whose call trace runs through the uprobe code (a
// fault taken inside a uprobe handler): a real uprobe frame of the report.
const netWarnViaUprobe = `------------[ cut here ]------------
WARNING: CPU: 0 PID: 1 at net/core/dev.c:1234 netdev_foo+0x10/0x20
CPU: 0 PID: 1 Comm: init
Call Trace:
 netdev_foo+0x10/0x20
 handle_swbp+0x3c4/0x4d0
---[ end trace 0000000000000000 ]---`

// An unrelated warning interleaved with another CPU's backtrace (an NMI
// backtrace, a lockup report's dump) that passes through the uprobe code:
// not the report's frames (issue 42 item 5).
const netWarnOtherCPU = `------------[ cut here ]------------
WARNING: CPU: 0 PID: 1 at net/core/dev.c:1234 netdev_foo+0x10/0x20
CPU: 0 PID: 1 Comm: init
NMI backtrace for cpu 5
CPU: 5 PID: 4711 Comm: python
Call Trace:
 handle_swbp+0x3c4/0x4d0
 uprobe_notify_resume+0x2e/0x40
---[ end trace 0000000000000000 ]---`

// The same without the NMI line: a task line of another CPU ends it too.
const netWarnOtherTask = `------------[ cut here ]------------
WARNING: CPU: 0 PID: 1 at net/core/dev.c:1234 netdev_foo+0x10/0x20
CPU: 7 PID: 4711 Comm: python
Call Trace:
 handle_swbp+0x3c4/0x4d0`

// A uprobe function named before the report's call trace (a modules or
// message line shaped like a frame) is not a frame.
const netWarnBeforeTrace = `------------[ cut here ]------------
WARNING: CPU: 0 PID: 1 at net/core/dev.c:1234 netdev_foo+0x10/0x20
 handle_swbp+0x3c4/0x4d0
Call Trace:
 netdev_foo+0x10/0x20
---[ end trace 0000000000000000 ]---`

// After the end of an unrelated report, a frame line alone is chatter.
const afterEnd = netWarn + "\n uprobe_notify_resume+0x2e/0x40"

func TestClassify(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		facility uint32
		trust    bool
		lines    string
		want     []stopped
	}{
		{"x86 warning at uprobes.c", 0, false, x86Warn, []stopped{{ReasonWarning, "WARNING: CPU: 3 PID: 4711 at kernel/events/uprobes.c:2163 handle_swbp+0x3c4/0x4d0"}}},
		{"arm64 single-step warning", 0, false, arm64Warn, []stopped{{ReasonWarning, "WARNING: CPU: 12 PID: 9001 at arch/arm64/kernel/probes/uprobes.c:205 uprobe_single_step_handler+0x50/0x60"}}},
		{"oops through the xol slot", 0, false, oopsTrace, []stopped{{ReasonOops, "Internal error: Oops: 0000000096000004 [#1] PREEMPT SMP"}}},
		{"BUG at uprobes.c", 0, false, bugAt, []stopped{{ReasonBug, "kernel BUG at kernel/events/uprobes.c:1034!"}}},
		{"unrelated warning with a stale uprobe word", 0, false, netWarn, nil},
		{"debugger single step", 0, false, stepWarn, nil},
		{"unrelated warning through a uprobe handler", 0, false, netWarnViaUprobe, []stopped{{ReasonWarning, "WARNING: CPU: 0 PID: 1 at net/core/dev.c:1234 netdev_foo+0x10/0x20"}}},
		{"another CPU's NMI backtrace", 0, false, netWarnOtherCPU, nil},
		{"another CPU's task line", 0, false, netWarnOtherTask, nil},
		{"a frame-shaped line before the call trace", 0, false, netWarnBeforeTrace, nil},
		{"chatter", 0, false, chatter, nil},
		{"frame after the end", 0, false, afterEnd, nil},
		{"two reports, two stops", 0, false, x86Warn + "\n" + arm64Warn, []stopped{
			{ReasonWarning, "WARNING: CPU: 3 PID: 4711 at kernel/events/uprobes.c:2163 handle_swbp+0x3c4/0x4d0"},
			{ReasonWarning, "WARNING: CPU: 12 PID: 9001 at arch/arm64/kernel/probes/uprobes.c:205 uprobe_single_step_handler+0x50/0x60"}}},
		{"forged from userspace", kmsg.FacilityUser, false, x86Warn, nil},
		{"userspace trusted (tests)", kmsg.FacilityUser, true, x86Warn, []stopped{{ReasonWarning, "WARNING: CPU: 3 PID: 4711 at kernel/events/uprobes.c:2163 handle_swbp+0x3c4/0x4d0"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := run(t, tc.trust, tc.facility, tc.lines); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("stops %q, want %q", got, tc.want)
			}
		})
	}
}

func TestFrameFunc(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		" handle_swbp+0x3c4/0x4d0":                      "handle_swbp",
		"pc : uprobe_single_step_handler+0x38/0x60":     "uprobe_single_step_handler",
		"RIP: 0010:handle_swbp+0x3c4/0x4d0":             "handle_swbp",
		" [<ffffffff81234567>] handle_swbp+0x3c4/0x4d0": "handle_swbp",
		" ? handle_swbp+0x3c4/0x4d0":                    "",
		"Modules linked in: a+0x1":                      "",
		"uprobe: x":                                     "",
	} {
		got, _ := frameFunc(in)
		if got != want {
			t.Errorf("frameFunc(%q) = %q, want %q", in, got, want)
		}
	}
}

// FuzzConsume: any records, any order: no panic, and a stop's reason is
// one of the three.
func FuzzConsume(f *testing.F) {
	for _, s := range []string{x86Warn, arm64Warn, oopsTrace, bugAt, netWarn} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		w := New(func(reason, _ string) {
			if reason != ReasonWarning && reason != ReasonBug && reason != ReasonOops {
				t.Fatalf("reason %q", reason)
			}
		}, false)
		for _, l := range strings.Split(s, "\n") {
			w.Consume(kmsg.Record{Message: l})
		}
	})
}
