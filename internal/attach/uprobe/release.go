package uprobe

import (
	"debug/elf"
	"fmt"
	"os"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
)

// What a link costs the node: descriptors while it is held, time when it
// is released. Measured on 6.18 (docs/OPERATIONS.md, "Descriptors and
// teardown"): a classic uprobe is two descriptors (its perf event and the
// BPF link on it) and its release takes the kernel's event_mutex across
// RCU grace periods (tracepoint_synchronize_unregister), so releases run
// one at a time whatever the caller's parallelism: 83 ms each, 11 s for
// one runtime's 130 links, 5 min 47 s for 32 files. A uprobe_multi link
// is one descriptor and its release waits for its grace periods without
// a global lock: 32 files' 160 links released in parallel in 0.33 s.

// Descriptors is the number of file descriptors the links hold.
func (s *Links) Descriptors() int {
	if s == nil {
		return 0
	}
	if s.Multi {
		return s.Len()
	}
	return 2 * s.Len()
}

// MeasureRelease times the release of n links of the Linker's kind
// (classic or uprobe_multi), one after the other, on an instruction of the
// agent's own executable that never runs again (its ELF entry point),
// filtered to the agent's own PID, with an empty program: the time a link
// of this kernel takes to go, for the teardown estimate. It returns the
// mean time per link.
func (l *Linker) MeasureRelease(n int) (time.Duration, error) {
	exe, off, err := entryPoint()
	if err != nil {
		return 0, err
	}
	spec := &ebpf.ProgramSpec{
		Name:         "release_trial", // not "profi_…": that prefix is for metric names
		Type:         ebpf.Kprobe,
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
		License:      "Dual BSD/GPL",
	}
	if l.Multi {
		spec.AttachType = ebpf.AttachTraceUprobeMulti
	}
	prog, err := ebpf.NewProgram(spec)
	if err != nil {
		return 0, fmt.Errorf("load the release trial program: %w", err)
	}
	defer prog.Close()
	var total time.Duration
	for range n {
		var lk link.Link
		if l.Multi {
			lk, err = exe.UprobeMulti(nil, prog, &link.UprobeMultiOptions{Addresses: []uint64{off}, PID: uint32(os.Getpid())})
		} else {
			lk, err = exe.Uprobe("", prog, &link.UprobeOptions{Address: off, PID: os.Getpid()})
		}
		if err != nil {
			return 0, fmt.Errorf("link the release trial: %w", err)
		}
		began := time.Now()
		if err := lk.Close(); err != nil {
			return 0, fmt.Errorf("release the trial link: %w", err)
		}
		total += time.Since(began)
	}
	return total / time.Duration(max(n, 1)), nil
}

// entryPoint is the agent's own executable and the file offset of its ELF
// entry point: code that ran once, at start.
func entryPoint() (*link.Executable, uint64, error) {
	const self = "/proc/self/exe"
	f, err := elf.Open(self)
	if err != nil {
		return nil, 0, fmt.Errorf("read the agent's executable: %w", err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD && p.Flags&elf.PF_X != 0 && f.Entry >= p.Vaddr && f.Entry < p.Vaddr+p.Filesz {
			exe, err := link.OpenExecutable(self)
			if err != nil {
				return nil, 0, fmt.Errorf("open the agent's executable: %w", err)
			}
			return exe, f.Entry - p.Vaddr + p.Off, nil
		}
	}
	return nil, 0, fmt.Errorf("the agent's executable has no code segment holding its entry point %#x", f.Entry)
}
