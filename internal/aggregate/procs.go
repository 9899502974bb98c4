package aggregate

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/profi-dev/profi/internal/discover"
)

// ProcFS answers Procs from a procfs tree.
type ProcFS struct{ Root string }

// Lookup reads the process's comm and start time, both through one
// pinned /proc/PID, so they belong to the same process.
func (p ProcFS) Lookup(pid int) (string, uint64, bool) {
	pd, err := discover.OpenProc(p.Root, pid, 0)
	if err != nil {
		return "", 0, false
	}
	defer pd.Close()
	start, err := pd.StartTime()
	if err != nil {
		return "", 0, false
	}
	comm, err := pd.Comm()
	if err != nil {
		return "", 0, false
	}
	return comm, start, true
}

// Alive reports whether pid is still the process that started at start.
func (p ProcFS) Alive(pid int, start uint64) bool {
	return discover.Alive(p.Root, pid, start)
}

// ThreadCPU reads the thread's run time from /proc/PID/task/TID/schedstat
// (sum_exec_runtime in nanoseconds: the clock CLOCK_THREAD_CPUTIME_ID
// reads, user and system), else from stat's utime and stime in clock ticks
// (USER_HZ, 100 on Linux) where the kernel lacks schedstat.
func (p ProcFS) ThreadCPU(pid, tid int) (time.Duration, bool) {
	dir := filepath.Join(p.Root, strconv.Itoa(pid), "task", strconv.Itoa(tid))
	if b, err := os.ReadFile(filepath.Join(dir, "schedstat")); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			if ns, err := strconv.ParseUint(f[0], 10, 63); err == nil {
				return time.Duration(ns), true
			}
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "stat"))
	if err != nil {
		return 0, false
	}
	// Fields after the comm, which may hold spaces and parentheses.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, false
	}
	utime, err1 := strconv.ParseUint(f[11], 10, 63)
	stime, err2 := strconv.ParseUint(f[12], 10, 63)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	const userHZ = 100
	return time.Duration(utime+stime) * time.Second / userHZ, true
}
