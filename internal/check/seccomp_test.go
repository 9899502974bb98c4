package check

import (
	"bytes"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/kbugs"
	"github.com/profi-dev/profi/internal/testutil"
)

// TestUretprobeSeccomp runs the experiment here, with each kind of probe
// the agent may use: the child under the allow-list survives its return
// probe (this kernel has the fix, or no uretprobe system call), the probe
// fired, and the filter was in force.
func TestUretprobeSeccomp(t *testing.T) {
	testutil.RequireBPF(t)
	kinds := []bool{false}
	if bpfobj.HaveUprobeMulti() == nil {
		kinds = append(kinds, true)
	}
	_, major, minor := kernelVersion()
	how := "a return trap"
	if haveUretprobeSyscall(&Env{}, runtime.GOARCH, major, minor) {
		how = "the uretprobe system call, which the filter does not allow"
	}
	for _, multi := range kinds {
		res := uretprobeSeccompCheck(&Env{Timeout: 20 * time.Second}, multi)
		if res.Status != OK || !strings.Contains(res.Detail, "survived a return probe") || !strings.Contains(res.Detail, "(1 hit(s))") || !strings.Contains(res.Detail, how) {
			t.Errorf("multi %v: %+v", multi, res)
		}
	}
}

// TestSeccompResult: what each way the child can end says.
func TestSeccompResult(t *testing.T) {
	t.Parallel()
	crash := "unexpected fault address 0x1\nfatal error: fault\n[signal SIGSEGV: segmentation violation code=0x1 addr=0x1 pc=0x1]\n"
	cases := []struct {
		name       string
		end        childEnd
		hits       uint64
		viaSyscall bool
		status     Status
		detail     string
		fix        string
	}{
		{"survived via the syscall", childEnd{Stdout: "filtered survived\n"}, 1, true, OK, "survived a return probe on profi's own " + retTargetSymbol + " (1 hit(s)), returning through the uretprobe system call", ""},
		{"survived a trap", childEnd{Stdout: "filtered survived\n"}, 1, false, OK, "returning through a return trap", ""},
		{"probe never fired", childEnd{Stdout: "filtered survived\n"}, 0, true, Warn, "never fired", "did not run"},
		{"filter not in force", childEnd{Stdout: "unfiltered survived\n"}, 1, true, Warn, "not in force", "getppid"},
		{"killed by seccomp", childEnd{Signal: syscall.SIGSYS}, 1, true, Fail, "killed by SIGSYS at the return of " + retTargetSymbol + ", after 1 return-probe hit(s)", "cf6cb56ef244"},
		{"killed by a fault", childEnd{Signal: syscall.SIGSEGV}, 1, true, Fail, "killed by SIGSEGV", "6.12.14"},
		{"the Go runtime's crash", childEnd{Code: 2, Stderr: crash}, 1, true, Fail, "died (exit status 2: unexpected fault address 0x1)", "container runtimes' default profiles"},
		{"exit without a word", childEnd{Code: 0}, 1, true, Fail, "exit status 0: no output", "cf6cb56ef244"},
		{"filter refused", childEnd{Code: childNoFilter, Stderr: "seccomp filter: invalid argument\n"}, 0, true, Warn, "refused the child's seccomp filter (seccomp filter: invalid argument)", "nothing needed"},
		{"no go-ahead", childEnd{Code: childNoStart}, 0, true, Warn, "never got its go-ahead", ""},
		{"timed out", childEnd{TimedOut: true, Signal: syscall.SIGKILL}, 0, true, Warn, "did not finish in time", "--timeout"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			res := seccompResult(tc.end, tc.hits, tc.viaSyscall)
			if res.Name != "uretprobe_seccomp" || res.Status != tc.status || !strings.Contains(res.Detail, tc.detail) || !strings.Contains(res.Fix, tc.fix) {
				t.Errorf("got %+v, want %s with detail %q, fix %q", res, tc.status, tc.detail, tc.fix)
			}
		})
	}
}

// TestChildEnd: a child's real end, read from its process state, says
// what the experiment concludes: killed by a signal or alive with the
// child's words.
func TestChildEnd(t *testing.T) {
	t.Parallel()
	cases := []struct {
		script string
		status Status
		detail string
	}{
		{"kill -SEGV $$", Fail, "killed by SIGSEGV"},
		{"kill -SYS $$", Fail, "killed by SIGSYS"},
		{"echo 'fatal error: unexpected signal' >&2; exit 2", Fail, "exit status 2: fatal error: unexpected signal"},
		{"echo filtered survived", OK, "survived"},
	}
	for _, tc := range cases {
		cmd := exec.Command("sh", "-c", tc.script)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		_ = cmd.Run()
		if cmd.ProcessState == nil {
			t.Fatalf("%s: not run", tc.script)
		}
		res := seccompResult(endOf(cmd.ProcessState, false, stdout.String(), stderr.String()), 1, true)
		if res.Status != tc.status || !strings.Contains(res.Detail, tc.detail) {
			t.Errorf("%s: %+v, want %s with %q", tc.script, res, tc.status, tc.detail)
		}
	}
}

// TestAllowList runs the child's filter on seccomp_data: the listed calls
// pass, the uretprobe system call and getppid get ENOSYS, another
// architecture is killed.
func TestAllowList(t *testing.T) {
	t.Parallel()
	const uretprobeNR = 335 // x86-64 (arch/x86/entry/syscalls/syscall_64.tbl)
	f := allowList(unix.AUDIT_ARCH_X86_64, childAllowed)
	run := func(arch, nr uint32) uint32 {
		data := [2]uint32{nr, arch} // seccomp_data: nr at 0, arch at 4
		var acc uint32
		for pc := 0; pc < len(f); pc++ {
			in := f[pc]
			switch in.Code {
			case unix.BPF_LD | unix.BPF_W | unix.BPF_ABS:
				acc = data[in.K/4]
			case unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K:
				if acc == in.K {
					pc += int(in.Jt)
				} else {
					pc += int(in.Jf)
				}
			case unix.BPF_RET | unix.BPF_K:
				return in.K
			default:
				t.Fatalf("instruction %+v", in)
			}
		}
		t.Fatal("fell off the filter")
		return 0
	}
	for _, nr := range childAllowed {
		if got := run(unix.AUDIT_ARCH_X86_64, uint32(nr)); got != unix.SECCOMP_RET_ALLOW {
			t.Errorf("allowed call %d: %#x", nr, got)
		}
	}
	refused := []uint32{unix.SYS_GETPPID, unix.SYS_PTRACE}
	if runtime.GOARCH == "amd64" {
		refused = append(refused, uretprobeNR)
	}
	for _, nr := range refused {
		if got := run(unix.AUDIT_ARCH_X86_64, nr); got != unix.SECCOMP_RET_ERRNO|uint32(unix.ENOSYS) {
			t.Errorf("call %d: %#x, want ENOSYS", nr, got)
		}
	}
	if got := run(unix.AUDIT_ARCH_I386, 1); got != unix.SECCOMP_RET_KILL_PROCESS {
		t.Errorf("i386: %#x, want kill", got)
	}
}

// TestKernelBugs: the kernel_bugs check on injected kernels: one the
// uretprobe/seccomp bug affects warns and says what the agent gives up;
// one with the stable fix is fine.
func TestKernelBugs(t *testing.T) {
	t.Parallel()
	r := Report{Results: []Result{kernelBugs(kbugs.Kernel{Release: "6.12.13-amd64", Version: "#1 SMP PREEMPT_DYNAMIC Debian 6.12.13-1 (2025-02-10)", Arch: "amd64"})}}
	want(t, r, "kernel_bugs", Warn, "x86-uretprobe-syscall-seccomp (degraded: no_return_probes)", "no return probes")
	r = Report{Results: []Result{kernelBugs(kbugs.Kernel{Release: "6.12.43+deb13-amd64", Version: "#1 SMP PREEMPT_DYNAMIC Debian 6.12.43-1 (2025-08-27)", Arch: "amd64"})}}
	want(t, r, "kernel_bugs", OK, "upstream 6.12.43 (from the Debian version string): no known uprobe bug", "")
}
