package check

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/kbugs"
)

// kernelVersion returns the release and its major.minor.
func kernelVersion() (release string, major, minor int) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "unknown", 0, 0
	}
	release = unix.ByteSliceToString(u.Release[:])
	parts := strings.SplitN(release, ".", 3)
	if len(parts) >= 2 {
		major, _ = strconv.Atoi(parts[0])
		minor, _ = strconv.Atoi(strings.TrimFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' }))
	}
	return release, major, minor
}

// kernelBugs classifies a kernel (the running one) against the known
// uprobe bugs.
func kernelBugs(k kbugs.Kernel) Result {
	r := kbugs.Classify(k)
	res := Result{Name: "kernel_bugs", Detail: r.Summary()}
	switch r.Verdict {
	case kbugs.Bad:
		res.Status = Fail
		res.Fix = "run a kernel with the fix (docs/KERNELS.md, Known uprobe bugs); without it the agent attaches no probe unless --allow-unsafe-kernel (NVML metrics are served either way)"
	case kbugs.Degraded:
		res.Status = Warn
		res.Fix = "run a kernel with the fix (docs/KERNELS.md, Known uprobe bugs); until then the agent probes without what the bug needs " +
			"(no_return_probes: no return probes, so calls it would time are not probed; launches, NVTX and ncclGroupStart are still counted at entry)"
	case kbugs.Suspect:
		res.Status = Warn
		res.Fix = "check that the kernel carries the fix named in docs/KERNELS.md, Known uprobe bugs; profi probes either way"
	default:
		res.Status = OK
	}
	return res
}

func atLeast(major, minor, wantMajor, wantMinor int) bool {
	return major > wantMajor || (major == wantMajor && minor >= wantMinor)
}

func exists(env *Env, feature, path string) bool {
	if env.pretend(feature) {
		return false
	}
	_, err := os.Stat(path)
	return err == nil
}

func kernelChecks(env *Env) []Result {
	release, major, minor := kernelVersion()
	var out []Result
	// BPF cookies on uprobes (the operation and file of every probe),
	// probed as the agent does.
	if err := bpfobj.RequireKernel(); err != nil {
		out = append(out, Result{Name: "kernel", Status: Fail, Detail: err.Error(),
			Fix: "run the node on a kernel " + bpfobj.MinKernel + " or newer (Ubuntu 22.04, RHEL 9, Debian 12, COS 101 or later; docs/KERNELS.md)"})
	} else {
		out = append(out, Result{Name: "kernel", Status: OK, Detail: "Linux " + release + " (profi needs " + bpfobj.MinKernel +
			"+ for BPF cookies on uprobes, uses uprobe_multi from 6.6; tested on " + bpfobj.TestedKernels + ")"})
	}
	out = append(out, kernelBugs(kbugs.Running()))
	btf := filepath.Join(env.SysRoot, "kernel/btf/vmlinux")
	if exists(env, "btf", btf) {
		out = append(out, Result{Name: "btf", Status: OK, Detail: btf + " present"})
	} else {
		out = append(out, Result{Name: "btf", Status: Fail, Detail: btf + " is missing: the kernel was built without CONFIG_DEBUG_INFO_BTF",
			Fix: "use a kernel built with CONFIG_DEBUG_INFO_BTF=y (every major distribution's default since 2021)"})
	}
	pmu := filepath.Join(env.SysRoot, "bus/event_source/devices/uprobe")
	if exists(env, "uprobe_pmu", pmu) {
		out = append(out, Result{Name: "uprobe_pmu", Status: OK, Detail: pmu + " present"})
	} else {
		out = append(out, Result{Name: "uprobe_pmu", Status: Fail, Detail: pmu + " is missing: no perf uprobe PMU (CONFIG_UPROBE_EVENTS), or /sys is not the host's",
			Fix: "use a kernel with CONFIG_UPROBE_EVENTS=y; in a container mount the host's /sys (the chart does)"})
	}
	if err := bpfobj.HaveUprobeMulti(); err == nil && !env.pretend("uprobe_multi") {
		out = append(out, Result{Name: "uprobe_multi", Status: OK, Detail: "uprobe_multi links available: one link per program and library file (CUDA, NCCL, NVTX, loader)"})
	} else {
		why := "forced off"
		if !env.pretend("uprobe_multi") {
			why = err.Error()
		}
		out = append(out, Result{Name: "uprobe_multi", Status: Warn, Detail: "no uprobe_multi links (" + why + "): every library falls back to one classic uprobe per function (slower attach, same counts)",
			Fix: "nothing needed; kernel 6.6 or newer attaches libraries faster"})
	}
	out = append(out, uretprobeSyscallResult(runtime.GOARCH, haveUretprobeSyscall(env, runtime.GOARCH, major, minor)))
	return out
}

// uretprobeSyscallArch says whether the kernel has the uretprobe syscall
// on the architecture at all: it came with 6.11 for x86-64 only.
func uretprobeSyscallArch(goarch string) bool { return goarch == "amd64" }

func uretprobeSyscallResult(goarch string, have bool) Result {
	switch {
	case have:
		return Result{Name: "uretprobe_syscall", Status: OK, Detail: "return probes use the uretprobe syscall (cheaper returns)"}
	case !uretprobeSyscallArch(goarch):
		return Result{Name: "uretprobe_syscall", Status: Warn, Detail: "no uretprobe syscall on " + goarch + ": each return probe costs a full trap",
			Fix: "nothing to do: the kernel has the syscall on x86-64 only"}
	}
	return Result{Name: "uretprobe_syscall", Status: Warn, Detail: "no uretprobe syscall: each return probe costs a full trap",
		Fix: "nothing needed; kernel 6.11 or newer (x86-64) makes timed calls cheaper"}
}

// haveUretprobeSyscall looks for the syscall in kallsyms (calling it
// outside a trampoline would kill us with SIGILL), else by version, on
// an architecture that has it.
func haveUretprobeSyscall(env *Env, goarch string, major, minor int) bool {
	if env.pretend("uretprobe_syscall") || !uretprobeSyscallArch(goarch) {
		return false
	}
	b, err := os.ReadFile("/proc/kallsyms")
	if err == nil && len(b) > 0 {
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			if strings.HasSuffix(sc.Text(), " __x64_sys_uretprobe") || strings.HasSuffix(sc.Text(), " __do_sys_uretprobe") {
				return true
			}
		}
		// kallsyms hides names from unprivileged readers as zeros, but
		// keeps them listed: a full listing without it means no syscall.
		return false
	}
	return atLeast(major, minor, 6, 11)
}

// Capability numbers (linux/capability.h).
const (
	capSysAdmin  = 21
	capSysPtrace = 19
	capPerfmon   = 38
	capBPF       = 39
)

func effectiveCaps() (uint64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, fmt.Errorf("read /proc/self/status: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		}
	}
	return 0, fmt.Errorf("no CapEff in /proc/self/status")
}

func capabilityCheck(_ *Env) Result {
	caps, err := effectiveCaps()
	if err != nil {
		return Result{Name: "capabilities", Status: Fail, Detail: err.Error(), Fix: "run on Linux with procfs mounted"}
	}
	has := func(c uint) bool { return caps&(1<<c) != 0 }
	var have, missing []string
	for _, c := range []struct {
		n    uint
		name string
	}{{capBPF, "CAP_BPF"}, {capPerfmon, "CAP_PERFMON"}, {capSysPtrace, "CAP_SYS_PTRACE"}, {capSysAdmin, "CAP_SYS_ADMIN"}} {
		if has(c.n) {
			have = append(have, c.name)
		} else {
			missing = append(missing, c.name)
		}
	}
	detail := fmt.Sprintf("effective %#x: has %s", caps, orNone(have))
	if len(missing) > 0 {
		detail += "; lacks " + strings.Join(missing, ", ")
	}
	const fix = "run the agent as root with CAP_BPF, CAP_PERFMON and CAP_SYS_PTRACE (or privileged: true / CAP_SYS_ADMIN on kernels before 5.8); the chart's securityContext sets them"
	switch {
	case (!has(capBPF) || !has(capPerfmon)) && !has(capSysAdmin):
		return Result{Name: "capabilities", Status: Fail, Detail: detail + ": cannot load BPF programs or attach uprobes", Fix: fix}
	case !has(capSysPtrace) && !has(capSysAdmin):
		return Result{Name: "capabilities", Status: Fail, Detail: detail + ": cannot open other processes' libraries through /proc/PID/root", Fix: fix}
	}
	return Result{Name: "capabilities", Status: OK, Detail: detail}
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

func memlockCheck(env *Env) []Result {
	var out []Result
	_, major, minor := kernelVersion()
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &lim); err != nil {
		out = append(out, Result{Name: "memlock", Status: Warn, Detail: "getrlimit: " + err.Error()})
	} else {
		cur := "unlimited"
		if lim.Cur != unix.RLIM_INFINITY {
			cur = fmt.Sprintf("%d KiB", lim.Cur/1024)
		}
		switch {
		case atLeast(major, minor, 5, 11):
			out = append(out, Result{Name: "memlock", Status: OK, Detail: "RLIMIT_MEMLOCK " + cur + " (not used: kernel 5.11+ charges BPF maps to the memory cgroup)"})
		case lim.Cur == unix.RLIM_INFINITY || lim.Cur >= 256<<20:
			out = append(out, Result{Name: "memlock", Status: OK, Detail: "RLIMIT_MEMLOCK " + cur})
		default:
			out = append(out, Result{Name: "memlock", Status: Fail, Detail: "RLIMIT_MEMLOCK " + cur + " is too small for profi's BPF maps on this kernel (before 5.11 they count against it)",
				Fix: "raise it (ulimit -l unlimited, LimitMEMLOCK=infinity, or run privileged so profi can raise it itself)"})
		}
	}
	limit, path := cgroupMemoryLimit(env)
	switch {
	case limit == 0:
		out = append(out, Result{Name: "cgroup_memory", Status: OK, Detail: "no memory limit on the agent's cgroup" + path})
	case limit < 128<<20:
		out = append(out, Result{Name: "cgroup_memory", Status: Warn, Detail: fmt.Sprintf("memory limit %d MiB on %s: the BPF object's kernel memory (55 MiB at the load's peak and 22 MiB held with default sizes where hash maps are allocated at run time, 6.1 and later; 110 and 77 MiB before) and the agent's heap count against it", limit>>20, path),
			Fix: "give the agent at least 192 MiB (resources.limits.memory in the chart), or shrink the maps (--aggregated-size, --malloc-sizes-size)"})
	default:
		out = append(out, Result{Name: "cgroup_memory", Status: OK, Detail: fmt.Sprintf("memory limit %d MiB on %s", limit>>20, path)})
	}
	return out
}

// cgroupMemoryLimit reads the cgroup v2 memory.max of this process (0 =
// none or unknown).
func cgroupMemoryLimit(env *Env) (uint64, string) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return 0, ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rel, ok := strings.CutPrefix(line, "0::"); ok {
			path := filepath.Join(env.SysRoot, "fs/cgroup", rel, "memory.max")
			v, err := os.ReadFile(path)
			if err != nil {
				return 0, ""
			}
			n, err := strconv.ParseUint(strings.TrimSpace(string(v)), 10, 64)
			if err != nil {
				return 0, " (" + path + ": max)"
			}
			return n, path
		}
	}
	return 0, ""
}
