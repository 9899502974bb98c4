package check

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"reflect"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/profi-dev/profi/internal/discover"
)

// The uretprobe/seccomp experiment (docs/KERNELS.md, "Known uprobe bugs",
// x86-uretprobe-syscall-seccomp). A child process, this binary again,
// confines its thread with a seccomp allow-list that does not name the
// uretprobe system call, as container runtimes' default profiles written
// before Linux 6.11 do, and calls a function of profi's own on which the
// check attached a return probe. From 6.11 an x86-64 return probe returns
// through that system call: a kernel without cf6cb56ef244 ("seccomp:
// passthrough uretprobe systemcall without filtering") filters it, and
// the child dies at the return. With the fix, or where a return traps
// instead (arm64, older kernels), it survives. The experiment answers for
// vendor kernels whose version string cannot say.

// seccompChildEnv makes Main (or the tests' TestMain) run the child.
const seccompChildEnv = "PROFI_CHECK_SECCOMP_CHILD"

// Exit codes of the child other than 0 (it survived the return).
const (
	childNoStart  = 3 // the parent's go-ahead never came
	childNoFilter = 4 // the kernel refused the seccomp filter
)

// retTarget is the function of profi's own that carries the return probe.
//
//go:noinline
func retTarget(n int) int { return 2*n + 1 }

// retTargetSymbol is retTarget's ELF symbol.
var retTargetSymbol = runtime.FuncForPC(reflect.ValueOf(retTarget).Pointer()).Name()

// childAllowed are the system calls the child's filter allows: what the Go
// runtime may need on a locked thread between the filter and exit. The
// uretprobe system call is not among them, nor getppid, which the child
// calls to see the filter in force.
var childAllowed = []uintptr{
	unix.SYS_READ, unix.SYS_WRITE, unix.SYS_EXIT, unix.SYS_EXIT_GROUP,
	unix.SYS_RT_SIGRETURN, unix.SYS_RT_SIGACTION, unix.SYS_RT_SIGPROCMASK, unix.SYS_SIGALTSTACK,
	unix.SYS_FUTEX, unix.SYS_SCHED_YIELD, unix.SYS_NANOSLEEP, unix.SYS_CLOCK_GETTIME,
	unix.SYS_GETTID, unix.SYS_GETPID, unix.SYS_TGKILL,
	unix.SYS_MMAP, unix.SYS_MUNMAP, unix.SYS_MADVISE, unix.SYS_GETRANDOM,
}

// auditArch is the seccomp_data arch of this process, 0 where the
// experiment does not know it.
func auditArch(goarch string) uint32 {
	switch goarch {
	case "amd64":
		return unix.AUDIT_ARCH_X86_64
	case "arm64":
		return unix.AUDIT_ARCH_AARCH64
	}
	return 0
}

// allowList is the child's filter: another architecture is killed, the
// allowed calls pass, every other call fails with ENOSYS (runc's answer
// for a call its profile does not know).
func allowList(arch uint32, allowed []uintptr) []unix.SockFilter {
	stmt := func(code uint16, k uint32) unix.SockFilter { return unix.SockFilter{Code: code, K: k} }
	jeq := func(k uint32, jt uint8) unix.SockFilter {
		return unix.SockFilter{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: jt, K: k}
	}
	f := []unix.SockFilter{
		stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, 4), // seccomp_data.arch
		jeq(arch, 1),
		stmt(unix.BPF_RET|unix.BPF_K, unix.SECCOMP_RET_KILL_PROCESS),
		stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, 0), // seccomp_data.nr
	}
	for i, nr := range allowed {
		f = append(f, jeq(uint32(nr), uint8(len(allowed)-i)))
	}
	return append(f,
		stmt(unix.BPF_RET|unix.BPF_K, unix.SECCOMP_RET_ERRNO|uint32(unix.ENOSYS)),
		stmt(unix.BPF_RET|unix.BPF_K, unix.SECCOMP_RET_ALLOW))
}

// seccompChild is the child: wait for the parent's go-ahead (the probe is
// attached), confine this thread, check the filter is in force, call the
// probed function, say so ("filtered survived", or "unfiltered
// survived"). The caller exits with its result at once.
func seccompChild() int {
	var b [1]byte
	if n, err := unix.Read(0, b[:]); n != 1 || err != nil {
		return childNoStart
	}
	runtime.LockOSThread() // the filter confines this thread only; it exits with the process
	filter := allowList(auditArch(runtime.GOARCH), childAllowed)
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		fmt.Fprintf(os.Stderr, "no_new_privs: %v\n", err)
		return childNoFilter
	}
	if err := unix.Prctl(unix.PR_SET_SECCOMP, unix.SECCOMP_MODE_FILTER, uintptr(unsafe.Pointer(&prog)), 0, 0); err != nil {
		fmt.Fprintf(os.Stderr, "seccomp filter: %v\n", err)
		return childNoFilter
	}
	filtered, unfiltered := []byte("filtered survived\n"), []byte("unfiltered survived\n")
	_, _, errno := unix.RawSyscall(unix.SYS_GETPPID, 0, 0, 0)
	_ = retTarget(int(errno)) // a call the compiler keeps: retTarget is not inlined
	out := unfiltered
	if errno == unix.ENOSYS {
		out = filtered
	}
	_, _ = unix.Write(1, out)
	return 0
}

// childEnd is how the child ended.
type childEnd struct {
	TimedOut bool
	Signal   syscall.Signal // killed by it; 0 when it exited
	Code     int            // exit status when it exited
	Stdout   string
	Stderr   string
}

// uretprobeSeccompCheck runs the experiment with the agent's kind of
// probe (uprobe_multi link or classic).
func uretprobeSeccompCheck(env *Env, multi bool) Result {
	notRun := func(why string, err error) Result {
		return Result{Name: "uretprobe_seccomp", Status: Warn, Detail: "not run: " + why + ": " + err.Error(),
			Fix: "see uprobe_attach above; docs/KERNELS.md lists the kernels where a return probe kills a process under a seccomp filter"}
	}
	if env.pretend("uprobe_pmu") {
		return notRun("attaching a return probe", errors.New("forced off"))
	}
	if auditArch(runtime.GOARCH) == 0 {
		return Result{Name: "uretprobe_seccomp", Status: OK, Detail: "not run on " + runtime.GOARCH + ": the kernel has no uretprobe system call there"}
	}
	counter, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1})
	if err != nil {
		return notRun("creating a BPF map", err)
	}
	defer counter.Close()
	prog, err := counterProgram(counter, multi)
	if err != nil {
		return notRun("loading a return probe program", err)
	}
	defer prog.Close()
	exe, err := link.OpenExecutable("/proc/self/exe")
	if err != nil {
		return notRun("opening the agent's own executable", err)
	}
	off, err := discover.SelfFileOffset(reflect.ValueOf(retTarget).Pointer())
	if err != nil {
		return notRun("locating "+retTargetSymbol, err)
	}
	timeout := env.Timeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	// The profi binary hands `check` to Main, which runs the child when
	// seccompChildEnv is set (the tests' TestMain does it first).
	cmd := exec.Command("/proc/self/exe", "check")
	// One thread, no preemption signal, no collection: nothing but the
	// experiment runs on the confined thread.
	cmd.Env = append(os.Environ(), seccompChildEnv+"=1", "GODEBUG=asyncpreemptoff=1", "GOGC=off", "GOMAXPROCS=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start, err := cmd.StdinPipe()
	if err != nil {
		return notRun("starting the child", err)
	}
	if err := cmd.Start(); err != nil {
		return notRun("starting the child", err)
	}
	pid := cmd.Process.Pid
	var l link.Link
	if multi {
		l, err = exe.UretprobeMulti([]string{retTargetSymbol}, prog, &link.UprobeMultiOptions{Addresses: []uint64{off}, PID: uint32(pid)})
	} else {
		l, err = exe.Uretprobe(retTargetSymbol, prog, &link.UprobeOptions{PID: pid, Address: off})
	}
	if err != nil {
		_ = start.Close() // the child exits without its go-ahead
		_ = cmd.Wait()
		return notRun("attaching a return probe to "+retTargetSymbol, err)
	}
	defer l.Close()
	// The time runs from the go-ahead: attaching a classic probe can take
	// seconds on a busy node.
	var timedOut atomic.Bool
	timer := time.AfterFunc(timeout, func() {
		timedOut.Store(true)
		_ = cmd.Process.Kill()
	})
	_, _ = start.Write([]byte{1})
	_ = start.Close()
	waitErr := cmd.Wait()
	timer.Stop()
	if cmd.ProcessState == nil {
		return notRun("waiting for the child", waitErr)
	}
	end := endOf(cmd.ProcessState, timedOut.Load(), stdout.String(), stderr.String())
	var hits uint64
	if err := counter.Lookup(uint32(0), &hits); err != nil {
		return notRun("reading the probe's counter", err)
	}
	_, major, minor := kernelVersion()
	return seccompResult(end, hits, haveUretprobeSyscall(env, runtime.GOARCH, major, minor))
}

// endOf reads how the child ended.
func endOf(st *os.ProcessState, timedOut bool, stdout, stderr string) childEnd {
	end := childEnd{TimedOut: timedOut, Stdout: stdout, Stderr: stderr}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		end.Signal = ws.Signal()
	} else {
		end.Code = st.ExitCode()
	}
	return end
}

// seccompFix is the fix for a kernel that kills the child.
const seccompFix = "run a kernel with cf6cb56ef244 (\"seccomp: passthrough uretprobe systemcall without filtering\": 6.14, 6.13.3, 6.12.14 or later; " +
	"docs/KERNELS.md, Known uprobe bugs): on this one every return probe kills a process whose seccomp filter does not allow the uretprobe system call " +
	"(container runtimes' default profiles written before Linux 6.11)"

// seccompResult says what the child's end shows. viaSyscall: returns go
// through the uretprobe system call on this kernel.
func seccompResult(end childEnd, hits uint64, viaSyscall bool) Result {
	res := Result{Name: "uretprobe_seccomp"}
	how := "a return trap (no uretprobe system call on this kernel: seccomp is not involved)"
	if viaSyscall {
		how = "the uretprobe system call, which the filter does not allow: the kernel let it through"
	}
	survived := end.Code == 0 && end.Signal == 0 && strings.HasSuffix(strings.TrimSpace(end.Stdout), "survived")
	tail := firstLine(end.Stderr)
	switch {
	case end.TimedOut:
		res.Status, res.Detail = Warn, "the child did not finish in time: the experiment proves nothing"
		res.Fix = "run profi check again with a longer --timeout"
	case survived && !strings.HasPrefix(end.Stdout, "filtered"):
		res.Status, res.Detail = Warn, "the child's seccomp filter was not in force: the experiment proves nothing"
		res.Fix = "report the kernel version: a seccomp filter installed with PR_SET_SECCOMP did not refuse getppid"
	case survived && hits == 0:
		res.Status, res.Detail = Warn, "the return probe on "+retTargetSymbol+" never fired in the child: the experiment proves nothing"
		res.Fix = "report the kernel version: the return probe attached but did not run"
	case survived:
		res.Status = OK
		res.Detail = fmt.Sprintf("a child confined by a seccomp allow-list survived a return probe on profi's own %s (%d hit(s)), returning through %s", retTargetSymbol, hits, how)
	case end.Code == childNoFilter:
		res.Status, res.Detail = Warn, "not run: the kernel refused the child's seccomp filter ("+tail+")"
		res.Fix = "nothing needed for profi; without seccomp filters the bug cannot hurt a process"
	case end.Code == childNoStart:
		res.Status, res.Detail = Warn, "not run: the child never got its go-ahead"
	case end.Signal != 0:
		res.Status, res.Fix = Fail, seccompFix
		res.Detail = fmt.Sprintf("a child confined by a seccomp allow-list was killed by %s at the return of %s, after %d return-probe hit(s)", unix.SignalName(end.Signal), retTargetSymbol, hits)
	default:
		res.Status, res.Fix = Fail, seccompFix
		res.Detail = fmt.Sprintf("a child confined by a seccomp allow-list died (exit status %d: %s) at the return of %s, after %d return-probe hit(s)", end.Code, tail, retTargetSymbol, hits)
	}
	return res
}

// firstLine is the first non-empty line of s (a Go crash starts with its
// cause), or "no output".
func firstLine(s string) string {
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			return l
		}
	}
	return "no output"
}
