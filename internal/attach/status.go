package attach

import (
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/profi-dev/profi/internal/discover"
	"github.com/profi-dev/profi/internal/ops"
	"github.com/profi-dev/profi/internal/status"
)

// What /status and the self metrics see of the attacher: the attached
// files and their probes, the failures, the loader hooks (Status), and
// each tracked process's layers (Layers).

// ProbeStatus is one attached probe (defined with the /status document).
type ProbeStatus = status.ProbeStatus

// RefusedProbe is a probed function the kernel refuses a uprobe on.
type RefusedProbe = status.RefusedProbe

// LibraryStatus is an attached library file.
type LibraryStatus = status.LibraryStatus

// FailureStatus is a library file whose attach failed and waits for a retry.
type FailureStatus = status.FailureStatus

// Unprobed is a process left unprobed (traced.go).
type Unprobed = status.Unprobed

// LoaderHook is a dynamic loader hooked to announce library loads.
type LoaderHook = status.LoaderHook

// Status is the attach state for /status.
type Status struct {
	Attached []LibraryStatus `json:"attached_libraries"`
	// LoaderHooks are the ld.so files whose library loads trigger a check
	// of the loading process (event-driven discovery).
	LoaderHooks []LoaderHook    `json:"loader_hooks"`
	Failed      []FailureStatus `json:"attach_failures"`
	LastSync    time.Time       `json:"last_sync"`
	// ProbeLinks are what every link costs against the link caps (cost.go).
	ProbeLinks LinkBudget `json:"probe_links"`
}

// Status returns a copy of the attach state, sorted by path.
func (a *Attacher) Status() Status {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := Status{Attached: []LibraryStatus{}, LoaderHooks: []LoaderHook{}, Failed: []FailureStatus{}, LastSync: a.lastSync, ProbeLinks: a.linkBudget(true)}
	for key, f := range a.files {
		if !profiled(f.target.Lib) {
			if len(f.sets) > 0 { // off while a traced process maps it (traced.go)
				s.LoaderHooks = append(s.LoaderHooks, LoaderHook{Path: f.target.Path, File: key.String(), Processes: len(f.target.PIDs)})
			}
			continue
		}
		ls := LibraryStatus{
			Library:        string(f.target.Lib),
			Path:           f.target.Path,
			Static:         f.target.Static,
			File:           key.String(),
			PIDs:           sortedPIDs(f.target.PIDs),
			Missing:        slices.Clone(f.missing),
			Absent:         slices.Clone(f.absent),
			Refused:        slices.Clone(f.refused),
			FullModePIDs:   upgradedPIDs(f),
			Paused:         f.paused,
			UprobeMulti:    f.multi(),
			AttachedAt:     f.attachedAt,
			ProbedPIDs:     a.probedPIDs(f),
			Unprobed:       a.unprobedOf(f),
			FilterSwitches: f.switches,
			Links:          f.allLinks(),
			Descriptors:    a.descriptors(f.allLinks()),
		}
		for _, p := range f.probes {
			sym := f.syms[p.Symbol]
			ls.Probes = append(ls.Probes, ProbeStatus{Symbol: p.Symbol, Operation: ops.Name(uint32(p.Op)), Return: p.Timed(), Traps: p.Traps(),
				Offset: sym.Offset, Placement: sym.Placement, Entry: sym.Entry, CountedAtDriver: f.launches[p.Op] != nil && f.launches[p.Op].handed})
		}
		s.Attached = append(s.Attached, ls)
	}
	for key, fl := range a.failed {
		if !profiled(fl.target.Lib) {
			continue // see LoaderHooks; not a profiled library
		}
		s.Failed = append(s.Failed, FailureStatus{
			Library:   string(fl.target.Lib),
			Path:      fl.target.Path,
			Static:    fl.target.Static,
			File:      key.String(),
			PIDs:      sortedPIDs(fl.target.PIDs),
			Reason:    fl.reason,
			Error:     fl.err.Error(),
			Attempts:  fl.attempts,
			NextRetry: fl.next,
			Refused:   slices.Clone(fl.refused),
		})
	}
	sort.Slice(s.Attached, func(i, j int) bool {
		return s.Attached[i].Path+s.Attached[i].File < s.Attached[j].Path+s.Attached[j].File
	})
	sort.Slice(s.Failed, func(i, j int) bool { return s.Failed[i].Path+s.Failed[i].File < s.Failed[j].Path+s.Failed[j].File })
	return s
}

func sortedPIDs(p []int) []int {
	out := slices.Clone(p)
	if out == nil {
		out = []int{}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func upgradedPIDs(f *attached) []int {
	if len(f.upgrades) == 0 {
		return nil
	}
	out := make([]int, 0, len(f.upgrades))
	for pid := range f.upgrades {
		out = append(out, pid)
	}
	slices.Sort(out)
	return out
}

// Layer is what profi probes of one layer of a process (/status, explain,
// profi_system_process_layers).
type Layer = status.Layer

// layerLibs are the layers of a CUDA process, in report order.
var layerLibs = []struct {
	name string
	lib  discover.Library
}{{"runtime", discover.LibCudart}, {"driver", discover.LibCuda}, {"nccl", discover.LibNCCL}, {"nvtx", discover.LibNVTX}}

// Layers says, for each process of s, which layers are probed and which
// are blind: one entry per layer, in layerLibs order. A static runtime
// without symbols (the executable reported by discovery defines none of
// the runtime's functions) is blind: its calls are not seen, and the driver
// layer counts its launches and memory as driver calls. So is the runtime
// of a process whose libnccl is probed but that maps no libcudart.so: NCCL
// links the runtime into itself (docs/REAL-CUDA.md), and had it needed
// libcudart.so, the process would map it.
func Layers(s Status) map[int][]Layer {
	type seen struct {
		att      *LibraryStatus
		fail     *FailureStatus
		unprobed *Unprobed
	}
	by := map[int]map[discover.Library]seen{}
	at := func(pid int, lib string) seen {
		if by[pid] == nil {
			by[pid] = map[discover.Library]seen{}
		}
		return by[pid][discover.Library(lib)]
	}
	for i := range s.Attached {
		l := &s.Attached[i]
		for _, pid := range l.PIDs {
			v := at(pid, l.Library)
			if v.att == nil || v.att.Static { // a shared library wins over the executable
				v.att = l
			}
			for j := range l.Unprobed {
				if l.Unprobed[j].PID == pid {
					v.unprobed = &l.Unprobed[j]
				}
			}
			by[pid][discover.Library(l.Library)] = v
		}
	}
	for i := range s.Failed {
		f := &s.Failed[i]
		for _, pid := range f.PIDs {
			v := at(pid, f.Library)
			v.fail = f
			by[pid][discover.Library(f.Library)] = v
		}
	}
	out := make(map[int][]Layer, len(by))
	for pid, libs := range by {
		layers := make([]Layer, 0, len(layerLibs))
		for _, ll := range layerLibs {
			v := libs[ll.lib]
			nccl := libs[discover.LibNCCL].att
			inNCCL := ll.lib == discover.LibCudart && nccl != nil && v.att == nil &&
				(v.fail == nil || v.fail.Static && v.fail.Reason == ReasonSymbolNotFound)
			switch {
			case v.unprobed != nil:
				layers = append(layers, Layer{Layer: ll.name, State: "unprobed", Path: v.att.Path,
					Detail: unprobedDetail(v.unprobed)})
			case inNCCL:
				layers = append(layers, Layer{Layer: ll.name, State: "blind", Path: nccl.Path,
					Detail: "runtime linked into " + filepath.Base(nccl.Path) + ": its runtime calls are not seen; the driver layer counts its launches and memory"})
			case v.att != nil && (len(v.att.Missing) > 0 || len(v.att.Refused) > 0):
				layers = append(layers, Layer{Layer: ll.name, State: "partial", Path: v.att.Path, Detail: partialDetail(v.att)})
			case v.att != nil && v.att.Static:
				layers = append(layers, Layer{Layer: ll.name, State: "static", Path: v.att.Path,
					Detail: "runtime linked into the executable, probed there"})
			case v.att != nil:
				layers = append(layers, Layer{Layer: ll.name, State: "probed", Path: v.att.Path})
			case v.fail != nil && v.fail.Static && v.fail.Reason == ReasonSymbolNotFound:
				layers = append(layers, Layer{Layer: ll.name, State: "blind", Path: v.fail.Path,
					Detail: "static runtime without symbols (stripped): runtime calls are not seen; the driver layer counts launches and memory"})
			case v.fail != nil:
				layers = append(layers, Layer{Layer: ll.name, State: "blind", Path: v.fail.Path,
					Detail: "attach failed: " + v.fail.Reason})
			default:
				layers = append(layers, Layer{Layer: ll.name, State: "absent"})
			}
		}
		out[pid] = layers
	}
	return out
}

// partialDetail says which functions of a partially probed library are
// not counted, and why.
func partialDetail(l *LibraryStatus) string {
	var parts []string
	if len(l.Missing) > 0 {
		parts = append(parts, "missing "+strings.Join(l.Missing, ", "))
	}
	if len(l.Refused) > 0 {
		names := make([]string, len(l.Refused))
		for i, r := range l.Refused {
			names[i] = fmt.Sprintf("%s+%d (%s)", r.Symbol, r.Offset, r.Reason)
		}
		parts = append(parts, "uprobe refused by the kernel, not counted: "+strings.Join(names, ", "))
	}
	return strings.Join(parts, "; ")
}

// unprobedDetail says why a layer is left unprobed.
func unprobedDetail(u *Unprobed) string {
	if u.Reason == ReasonQuarantined {
		return "left unprobed, no breakpoint in the process: the crash breaker quarantined this file for the process's tenant (docs/OPERATIONS.md, \"When profi suspects it harms a process\")"
	}
	return fmt.Sprintf("left unprobed, no breakpoint in the process: %s by pid %d (--probe-traced-processes)", u.Reason, u.TracerPID)
}
