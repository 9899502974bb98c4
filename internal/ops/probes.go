package ops

import "github.com/profi-dev/profi/internal/discover"

// Program names in bpf/*.c (one program per role; a test in
// internal/bpfobj checks that each exists in the object).
const (
	ProgTimedEntry  = "timed_entry"
	ProgTimedReturn = "timed_return"
	ProgLaunchEntry = "launch_entry"
	ProgNameEntry   = "name_entry"
	ProgNCCLEntry   = "nccl_entry"
	ProgNCCLReturn  = "nccl_return"
	ProgNVTXPush    = "nvtx_push"
	ProgNVTXPop     = "nvtx_pop"
	ProgDlEvent     = "dl_event"
)

// Probe is one probed function as attached: its entry program and, when
// the call is timed, its return program. The operation id travels as the
// BPF cookie.
type Probe struct {
	Symbol string
	Op     Op
	Entry  string // program name
	Return string // program name; "" = entry only (one trap per call)
	// Optional: the function's absence from a library is not a failure.
	Optional bool
}

// Traps is the number of uprobe traps one call of the function costs.
func (p Probe) Traps() int {
	if p.Return != "" {
		return 2
	}
	return 1
}

// Timed reports whether the probe measures latency and return codes.
func (p Probe) Timed() bool { return p.Return != "" }

// Pausable reports whether the overhead budget may pause the probe.
func (p Probe) Pausable() bool { return Pausable(p.Op) }

// probe returns how the row is probed in a kernel mode, false when not.
func (r Row) probe(kernelMode string) (Probe, bool) {
	p := Probe{Symbol: r.Symbol, Optional: r.Optional}
	timed := func() { p.Entry, p.Return = ProgTimedEntry, ProgTimedReturn }
	switch r.Kind {
	case Timed:
		timed()
	case Launch:
		switch kernelMode {
		case KernelModeOff:
			return p, false
		case KernelModeFull:
			timed()
		default:
			// Count, stream and geometry need no return: one trap.
			p.Entry = ProgLaunchEntry
		}
	case NameSource:
		if kernelMode != KernelModeFull {
			return p, false
		}
		timed()
	case Registration:
		if kernelMode != KernelModeFull {
			return p, false
		}
		p.Entry = ProgNameEntry
	case NCCL:
		p.Entry, p.Return = ProgNCCLEntry, ProgNCCLReturn
	case NCCLCount:
		p.Entry = ProgNCCLEntry
	case NVTXPush:
		p.Entry = ProgNVTXPush
	case NVTXPop:
		p.Entry = ProgNVTXPop
	case LoadHook:
		p.Entry = ProgDlEvent
	}
	return p, true
}

// Probes returns the probe set for a library: the table's rows of that
// library that the kernel mode and probe profile probe, in table order.
// A pure function, so the set (and the traps every call costs) can be
// table-tested and documented. NCCL, NVTX and the loader do not depend on
// mode or profile.
func Probes(lib discover.Library, kernelMode, profile string) []Probe {
	var out []Probe
	for i, r := range Table {
		if r.Lib != lib || (r.Diagnostic && profile != ProfileFull) {
			continue
		}
		if p, ok := r.probe(kernelMode); ok {
			p.Op = Op(i + 1)
			out = append(out, p)
		}
	}
	return out
}
