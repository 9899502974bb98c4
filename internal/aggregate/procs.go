package aggregate

import "github.com/profi-dev/profi/internal/discover"

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
