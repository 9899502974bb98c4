//go:build linux

package bpfobj

import (
	"errors"
	"fmt"
	"reflect"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/rlimit"
)

// Sizes are the max_entries of the sized maps (the --*-size flags) and
// the other load-time settings.
type Sizes struct {
	SampleRate  uint32 // --sample-rate; 0 or 1 = every timed call
	Detailed    bool   // --detailed-launches: one ring-buffer event per launch
	Aggregated  uint32 // --aggregated-size
	LaunchAgg   uint32 // --launch-agg-size
	Inflight    uint32 // --entries-size
	MallocSizes uint32 // --malloc-sizes-size
	// CountHits counts probe hits per process in pid_hits, for the
	// overhead estimate (--overhead-budget). Off, the code is not loaded.
	CountHits bool
	// NVTX (--enable-nvtx-tracing): launches read their thread's NVTX
	// range stack for the phase. Off, the code is not loaded.
	NVTX bool
	// NoUprobeMulti loads the uprobe.multi programs as classic ones: on
	// kernels without uprobe_multi links (before 6.6) they would not load,
	// and tests force the fallback with it.
	NoUprobeMulti bool
}

// UprobeMultiPrograms are the programs built for uprobe_multi links.
var UprobeMultiPrograms = []string{
	ProfiProgTimedEntryMulti, ProfiProgTimedReturnMulti, ProfiProgLaunchEntryMulti, ProfiProgNameEntryMulti,
	ProfiProgNcclEntryMulti, ProfiProgNcclReturnMulti,
}

// HaveUprobeMulti reports whether the kernel has uprobe_multi links.
func HaveUprobeMulti() error { return features.HaveBPFLinkUprobeMulti() }

// Objects are the loaded programs and maps. Close releases them.
type Objects struct {
	ProfiObjects
}

// Programs returns every loaded program by its name in the object, so
// that a program added to profi.bpf.c reaches the attacher without a
// hand-kept list.
func (o *Objects) Programs() map[string]*ebpf.Program {
	out := map[string]*ebpf.Program{}
	v := reflect.ValueOf(o.ProfiPrograms)
	for i := range v.NumField() {
		if p, ok := v.Field(i).Interface().(*ebpf.Program); ok && p != nil {
			out[v.Type().Field(i).Tag.Get("ebpf")] = p
		}
	}
	return out
}

// Load sizes the maps and loads the object into the kernel. A verifier
// failure is returned with the full verifier log.
func Load(sizes Sizes) (*Objects, error) {
	// Only matters on kernels that still charge BPF memory to RLIMIT_MEMLOCK (< 5.11).
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("remove memlock limit: %w", err)
	}
	spec, err := LoadProfi()
	if err != nil {
		return nil, fmt.Errorf("parse embedded BPF object: %w", err)
	}
	for name, n := range map[string]uint32{
		ProfiMapAggregated:  sizes.Aggregated,
		ProfiMapLaunchAgg:   sizes.LaunchAgg,
		ProfiMapInflight:    sizes.Inflight,
		ProfiMapMallocSizes: sizes.MallocSizes,
	} {
		if n > 0 {
			spec.Maps[name].MaxEntries = n
		}
	}
	if sizes.SampleRate > 1 {
		if err := spec.Variables[ProfiVarSampleRate].Set(sizes.SampleRate); err != nil {
			return nil, fmt.Errorf("set sample_rate: %w", err)
		}
	}
	if sizes.Detailed {
		if err := spec.Variables[ProfiVarDetailedLaunches].Set(true); err != nil {
			return nil, fmt.Errorf("set detailed_launches: %w", err)
		}
	}
	if sizes.NoUprobeMulti {
		for _, name := range UprobeMultiPrograms {
			spec.Programs[name].AttachType = ebpf.AttachNone
		}
	}
	if sizes.CountHits {
		if err := spec.Variables[ProfiVarCountHits].Set(true); err != nil {
			return nil, fmt.Errorf("set count_hits: %w", err)
		}
	}
	if sizes.NVTX {
		if err := spec.Variables[ProfiVarNvtxEnabled].Set(true); err != nil {
			return nil, fmt.Errorf("set nvtx_enabled: %w", err)
		}
	}
	var objs Objects
	if err := spec.LoadAndAssign(&objs.ProfiObjects, nil); err != nil {
		var verr *ebpf.VerifierError
		if errors.As(err, &verr) {
			return nil, fmt.Errorf("load BPF object: %w\nverifier log:\n%+v", err, verr)
		}
		return nil, fmt.Errorf("load BPF object: %w", err)
	}
	return &objs, nil
}
