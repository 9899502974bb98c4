//go:build linux

package budget

import (
	"errors"
	"fmt"
	"time"

	"github.com/cilium/ebpf"

	"github.com/profi-dev/profi/internal/discover"
)

// MapSources reads the estimate's inputs from the kernel.
type MapSources struct {
	PIDHits *ebpf.Map // pid_hits (per-CPU)
	// Programs are profi's loaded programs by name (bpfobj.Objects.Programs);
	// run-time statistics must be on. Only the uprobe (kprobe-type) ones
	// count: every run of those is a pid_hits hit, while the process-exit
	// raw tracepoint counts none and runs for every thread of the machine.
	Programs map[string]*ebpf.Program
	ProcRoot string
}

// Hits sums pid_hits over CPUs.
func (m MapSources) Hits() (map[uint32]uint64, error) {
	out := map[uint32]uint64{}
	var pid uint32
	var perCPU []uint64
	it := m.PIDHits.Iterate()
	for it.Next(&pid, &perCPU) {
		var sum uint64
		for _, v := range perCPU {
			sum += v
		}
		out[pid] = sum
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("iterate pid_hits: %w", err)
	}
	return out, nil
}

// ForgetHits deletes the counters of exited processes.
func (m MapSources) ForgetHits(pids []uint32) error {
	var errs []error
	for _, pid := range pids {
		if err := m.PIDHits.Delete(&pid); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("delete pid_hits of pid %d: %w", pid, err))
		}
	}
	return errors.Join(errs...)
}

// ProgramRunTime sums the run time and run count of the programs.
func (m MapSources) ProgramRunTime() (time.Duration, uint64, error) {
	var run time.Duration
	var n uint64
	for _, p := range m.Programs {
		if p.Type() != ebpf.Kprobe {
			continue
		}
		st, err := p.Stats()
		if err != nil {
			return 0, 0, fmt.Errorf("program statistics: %w", err)
		}
		run += st.Runtime
		n += st.RunCount
	}
	return run, n, nil
}

// CPUTime reads the process's CPU time from procfs.
func (m MapSources) CPUTime(pid int) (time.Duration, uint64, error) {
	return discover.ReadCPUTime(m.ProcRoot, pid)
}
