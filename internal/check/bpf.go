package check

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"runtime"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"

	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/discover"
)

// probeCalls is how often the check calls its probed function; the probe
// must count exactly that many.
const probeCalls = 100

// probeTarget is the function of profi's own that the check probes.
//
//go:noinline
func probeTarget(n int) int { return n + 1 }

// probeTargetSymbol is probeTarget's ELF symbol.
var probeTargetSymbol = runtime.FuncForPC(reflect.ValueOf(probeTarget).Pointer()).Name()

const bpfFix = "run as root with CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN), and make sure no seccomp profile or LSM blocks bpf() and perf_event_open(): " +
	"the chart's seccompProfile RuntimeDefault allows them with CAP_BPF and CAP_PERFMON on containerd 1.6.9+ and Docker 23+, " +
	"CRI-O's and Podman's default profiles only with CAP_SYS_ADMIN (docs/SECURITY.md, \"Seccomp\")"

// sysAdminUprobesFix is the fix for a classic uprobe refused without
// CAP_SYS_ADMIN.
const sysAdminUprobesFix = "perf uprobes need CAP_SYS_ADMIN since the fix of CVE-2025-38466 (Linux 6.16; 6.15.7, 6.12.39, 6.6.99, 6.1.146, 5.15.189, 5.10.240), " +
	"and without uprobe_multi links (Linux 6.6+; or with --no-uprobe-multi) every probe is one: add SYS_ADMIN to the chart's securityContext.capabilities.add, " +
	"or run a 6.6+ kernel, where CAP_BPF and CAP_PERFMON attach uprobe_multi links"

// seccompNote says whether a seccomp filter confines this process, for the
// detail of a refused bpf() or perf_event_open().
func seccompNote() string {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Seccomp:"); ok && strings.TrimSpace(v) == "2" {
			return " (a seccomp filter confines this process, Seccomp: 2 in /proc/self/status: the container runtime's profile may refuse the call)"
		}
	}
	return ""
}

func bpfCheck(env *Env) []Result {
	if env.pretend("bpf") {
		return []Result{{Name: "bpf_load", Status: Fail, Detail: "loading a BPF program failed: forced off", Fix: bpfFix}}
	}
	// Kernels before 5.11 charge maps to RLIMIT_MEMLOCK; the agent lifts it too.
	_ = rlimit.RemoveMemlock()
	counter, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1})
	if err != nil {
		return []Result{{Name: "bpf_load", Status: Fail, Detail: "creating a BPF map failed: " + err.Error() + permissionNote(err), Fix: bpfFix}}
	}
	defer counter.Close()
	// The agent's uprobe programs are uprobe_multi programs where the
	// kernel has the links and --no-uprobe-multi is not given, classic ones
	// otherwise (bpfobj.Load): load and attach the same kind here.
	multi := bpfobj.HaveUprobeMulti() == nil && !env.pretend("uprobe_multi") && (env.Config == nil || !env.Config.NoUprobeMulti)
	prog, err := counterProgram(counter, multi)
	if err != nil {
		return []Result{{Name: "bpf_load", Status: Fail, Detail: "loading a BPF program failed: " + err.Error() + permissionNote(err), Fix: bpfFix}}
	}
	defer prog.Close()
	out := []Result{{Name: "bpf_load", Status: OK, Detail: "a BPF map and a uprobe program loaded"}}
	out = append(out, objectCheck(env), uprobeCheck(env, prog, counter, multi), uretprobeSeccompCheck(env, multi))
	out = append(out, tracepointCheck(env))
	return out
}

// objectCheck loads profi's own BPF object as the agent would, with its
// configuration: the kernel's verifier accepts it or says, in one line,
// where it refuses it.
func objectCheck(env *Env) Result {
	sizes := bpfobj.Options{}
	if env.Config != nil {
		sizes = bpfobj.OptionsOf(env.Config)
	}
	objs, err := bpfobj.Load(sizes)
	if errors.Is(err, bpfobj.ErrKernelTooOld) {
		return Result{Name: "bpf_object", Status: Fail, Detail: "not loaded: the kernel is too old (above)",
			Fix: "run the node on a kernel " + bpfobj.MinKernel + " or newer"}
	}
	if err != nil {
		line, _, _ := strings.Cut(err.Error(), "\n") // the verifier's last words, not its log
		return Result{Name: "bpf_object", Status: Fail, Detail: "profi's BPF object is refused: " + line,
			Fix: "run a kernel docs/KERNELS.md lists as tested, and report the kernel and this line"}
	}
	objs.Close()
	return Result{Name: "bpf_object", Status: OK, Detail: "profi's BPF programs and maps loaded with this configuration"}
}

// permissionNote adds the seccomp state to a permission error.
func permissionNote(err error) string {
	if errors.Is(err, os.ErrPermission) {
		return seccompNote()
	}
	return ""
}

// counterProgram loads a uprobe program (uprobe_multi or classic) that
// counts its runs in counter's only element.
func counterProgram(counter *ebpf.Map, multi bool) (*ebpf.Program, error) {
	spec := &ebpf.ProgramSpec{
		Type:    ebpf.Kprobe,
		License: "GPL",
		Instructions: asm.Instructions{
			asm.StoreImm(asm.RFP, -4, 0, asm.Word),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, -4),
			asm.LoadMapPtr(asm.R1, counter.FD()),
			asm.FnMapLookupElem.Call(),
			asm.JEq.Imm(asm.R0, 0, "out"),
			asm.Mov.Imm(asm.R1, 1),
			asm.StoreXAdd(asm.R0, asm.R1, asm.DWord),
			asm.Mov.Imm(asm.R0, 0).WithSymbol("out"),
			asm.Return(),
		},
	}
	if multi {
		spec.AttachType = ebpf.AttachTraceUprobeMulti
	}
	return ebpf.NewProgram(spec)
}

// uprobeCheck attaches prog to a function of profi's own the way the agent
// attaches libraries (a uprobe_multi link, or a classic perf uprobe) and
// calls it probeCalls times.
func uprobeCheck(env *Env, prog *ebpf.Program, counter *ebpf.Map, multi bool) Result {
	kind := "a classic uprobe"
	if multi {
		kind = "a uprobe_multi link"
	}
	fail := func(what string, err error) Result {
		fix := "make sure the kernel has uprobes (CONFIG_UPROBE_EVENTS) and the agent CAP_PERFMON or CAP_SYS_ADMIN"
		detail := what + ": " + err.Error()
		if errors.Is(err, os.ErrPermission) {
			fix = bpfFix
			detail += seccompNote()
			if caps, cerr := effectiveCaps(); !multi && cerr == nil && caps&(1<<capSysAdmin) == 0 {
				fix = sysAdminUprobesFix
			}
		}
		return Result{Name: "uprobe_attach", Status: Fail, Detail: detail, Fix: fix}
	}
	if env.pretend("uprobe_pmu") {
		return fail("attaching a uprobe", errors.New("forced off"))
	}
	exe, err := link.OpenExecutable("/proc/self/exe")
	if err != nil {
		return fail("opening the agent's own executable", err)
	}
	// By address: test binaries and stripped builds have no symbol table.
	off, err := discover.SelfFileOffset(reflect.ValueOf(probeTarget).Pointer())
	if err != nil {
		return fail("locating "+probeTargetSymbol, err)
	}
	var l link.Link
	if multi {
		l, err = exe.UprobeMulti([]string{probeTargetSymbol}, prog, &link.UprobeMultiOptions{Addresses: []uint64{off}, PID: uint32(os.Getpid())})
	} else {
		l, err = exe.Uprobe(probeTargetSymbol, prog, &link.UprobeOptions{PID: os.Getpid(), Address: off})
	}
	if err != nil {
		return fail("attaching "+kind+" to "+probeTargetSymbol, err)
	}
	defer l.Close()
	sum := 0
	for i := range probeCalls {
		sum += probeTarget(i)
	}
	var hits uint64
	if err := counter.Lookup(uint32(0), &hits); err != nil {
		return fail("reading the probe's counter", err)
	}
	if hits != probeCalls {
		return Result{Name: "uprobe_attach", Status: Fail,
			Detail: fmt.Sprintf("%s on %s counted %d of %d calls (checksum %d)", kind, probeTargetSymbol, hits, probeCalls, sum),
			Fix:    "the kernel attached the probe but does not run it on every call: check for a security module that filters uprobes, and report the kernel version"}
	}
	return Result{Name: "uprobe_attach", Status: OK, Detail: fmt.Sprintf("%s (the agent's attach path here) on profi's own %s counted %d of %d calls", kind, probeTargetSymbol, hits, probeCalls)}
}

// tracepointCheck attaches empty programs to the raw tracepoints profi
// uses for process exit (and exec, for future use).
func tracepointCheck(env *Env) Result {
	const fix = "use a kernel with CONFIG_TRACEPOINTS (every distribution kernel); without them in-flight NCCL calls of killed processes are cleared by the --gc-interval sweep instead"
	if env.pretend("tracepoints") {
		return Result{Name: "tracepoints", Status: Warn, Detail: "raw tracepoints sched_process_exec/exit: forced off", Fix: fix}
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.RawTracepoint,
		License:      "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
	})
	if err != nil {
		return Result{Name: "tracepoints", Status: Warn, Detail: "loading a raw tracepoint program failed: " + err.Error(), Fix: fix}
	}
	defer prog.Close()
	for _, name := range []string{"sched_process_exec", "sched_process_exit"} {
		l, err := link.AttachRawTracepoint(link.RawTracepointOptions{Name: name, Program: prog})
		if err != nil {
			return Result{Name: "tracepoints", Status: Warn, Detail: "attaching raw tracepoint " + name + " failed: " + err.Error(), Fix: fix}
		}
		_ = l.Close()
	}
	return Result{Name: "tracepoints", Status: OK, Detail: "raw tracepoints sched_process_exec and sched_process_exit attach"}
}
