//go:build linux

package bpfobj

import (
	"errors"
	"fmt"
	"os"
	"reflect"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"

	"github.com/profi-dev/profi/internal/ops"
)

// Options are what changes the loaded object: the load-time constants and
// programs the flags select, and the max_entries of the sized maps (the
// --*-size flags).
type Options struct {
	SampleRate  uint32 // --sample-rate; 0 or 1 = every timed call
	Detailed    bool   // --detailed-launches: one ring-buffer event per launch
	Aggregated  uint32 // --aggregated-size
	LaunchAgg   uint32 // --launch-agg-size
	Inflight    uint32 // --entries-size
	MallocSizes uint32 // --malloc-sizes-size
	// MaxStreamsPerPID is --max-streams-per-pid: each process's keys name
	// at most this many non-default streams; the others are folded into
	// StreamOther in BPF. 0 keeps the object's default (32).
	MaxStreamsPerPID uint32
	// CountHits counts probe hits per process in pid_hits, for the
	// overhead estimate (--overhead-budget). Off, the code is not loaded.
	CountHits bool
	// CrashBreaker (--crash-window above 0): every probe hit records its
	// process's latest hit (pid_last_hit), the signal-delivery program
	// the evidence of each fault the kernel raises in such a process, and
	// the process-exit program reports probed processes killed by a fault
	// signal (crash_events).
	// Off, the code is not loaded.
	CrashBreaker bool
	// NVTX (--enable-nvtx-tracing): launches read their thread's NVTX
	// range stack for the phase. Off, the code is not loaded.
	NVTX bool
	// KernelMode is --kernel-mode ("off", "anonymous", "full"; "" is
	// anonymous): whether and how the kernels of graphs built node by node
	// are recorded (their launches are never probed).
	KernelMode string
	// NoUprobeMulti loads the uprobe programs as classic ones even where
	// the kernel has uprobe_multi links (--no-uprobe-multi: tests the
	// fallback of older kernels). Without uprobe_multi (before 6.6) they
	// are loaded as classic ones anyway.
	NoUprobeMulti bool
	// NoFindVMA loads the object as on a kernel without bpf_find_vma
	// (5.15, 5.16), whatever this one has: for tests.
	NoFindVMA bool
	// VerifierStats keeps each program's verifier statistics line
	// (Objects.VerifierStats): for the verifier budget test.
	VerifierStats bool
	// Preallocate keeps every hash map preallocated even where the kernel
	// allocates elements safely at run time (RunTimeAllocation): for the
	// kernel-memory measurement and tests of kernels before 6.1.
	Preallocate bool
}

// kernelModes are kernel_mode's values in bpf/config.h.
var kernelModes = map[string]uint32{ops.KernelModeOff: 0, "": 1, ops.KernelModeAnonymous: 1, ops.KernelModeFull: 2}

// HaveUprobeMulti reports whether the kernel has uprobe_multi links.
func HaveUprobeMulti() error { return features.HaveBPFLinkUprobeMulti() }

// Objects are the loaded programs and maps. Close releases them.
type Objects struct {
	ProfiObjects
	// UprobeMulti: the uprobe programs were loaded for uprobe_multi links
	// (one link per program and library file); false: classic uprobes,
	// one link per function.
	UprobeMulti bool
	// NoUprobeMulti is why the kernel's uprobe_multi links are not used
	// (nil when they are, or when Options.NoUprobeMulti asked for classic).
	NoUprobeMulti error
	// RunTimeAlloc: the hash maps allocate their elements as keys arrive
	// (BPF_F_NO_PREALLOC; RunTimeAllocation), not all at load.
	RunTimeAlloc bool
}

// Programs returns every loaded program by its name in the object, so
// that a program added to bpf/ reaches the attacher without a
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

// Tenant is the tenant BPF admitted process pid under (pid_quotas: its
// cgroup v2 id, or TENANT_PID | pid outside cgroup v2); false before the
// process's first admitted key.
func (o *Objects) Tenant(pid int) (uint64, bool) {
	var q ProfiPidQuota
	if err := o.PidQuotas.Lookup(uint32(pid), &q); err != nil {
		return 0, false
	}
	return q.Tenant, true
}

// Maps returns every map of the object by its name (its .maps, not the
// sections holding global variables).
func (o *Objects) Maps() map[string]*ebpf.Map {
	out := map[string]*ebpf.Map{}
	v := reflect.ValueOf(o.ProfiMaps)
	for i := range v.NumField() {
		if m, ok := v.Field(i).Interface().(*ebpf.Map); ok && m != nil {
			out[v.Type().Field(i).Tag.Get("ebpf")] = m
		}
	}
	return out
}

// Load sets opts (map sizes, constants, programs) and loads the object into the kernel. A verifier
// failure is returned with the full verifier log.
func Load(opts Options) (*Objects, error) {
	// Only matters on kernels that still charge BPF memory to RLIMIT_MEMLOCK (< 5.11).
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("remove memlock limit: %w", err)
	}
	// Before the verifier sees the object: on an old kernel, one line
	// naming what is missing, not a verifier log.
	if err := RequireKernel(); err != nil {
		return nil, err
	}
	spec, err := LoadProfi()
	if err != nil {
		return nil, fmt.Errorf("parse embedded BPF object: %w", err)
	}
	for name, n := range map[string]uint32{
		ProfiMapAggregated:  opts.Aggregated,
		ProfiMapLaunchAgg:   opts.LaunchAgg,
		ProfiMapInflight:    opts.Inflight,
		ProfiMapMallocSizes: opts.MallocSizes,
	} {
		if n > 0 {
			spec.Maps[name].MaxEntries = n
		}
	}
	// Every admitted stream is named by a key of aggregated or launch_agg:
	// pid_streams holds as many, so that raising those sizes for many
	// streams (bench/scale_test.go: four processes of 12,500 streams)
	// admits them, instead of folding the later processes' into "other".
	spec.Maps[ProfiMapPidStreams].MaxEntries = PIDStreamsSize(spec.Maps[ProfiMapAggregated].MaxEntries, spec.Maps[ProfiMapLaunchAgg].MaxEntries)
	if opts.MaxStreamsPerPID > 0 {
		if err := spec.Variables[ProfiVarMaxStreamsPerPid].Set(opts.MaxStreamsPerPID); err != nil {
			return nil, fmt.Errorf("set max_streams_per_pid: %w", err)
		}
	}
	var room, guarantee [NumQuotaMaps]uint32
	for m, name := range QuotaMapNames {
		room[m] = NodeRoom(spec.Maps[name].MaxEntries)
		guarantee[m] = TenantGuarantee(spec.Maps[name].MaxEntries)
	}
	if err := spec.Variables[ProfiVarNodeRoom].Set(room); err != nil {
		return nil, fmt.Errorf("set node_room: %w", err)
	}
	if err := spec.Variables[ProfiVarTenantGuarantee].Set(guarantee); err != nil {
		return nil, fmt.Errorf("set tenant_guarantee: %w", err)
	}
	if opts.SampleRate > 1 {
		if err := spec.Variables[ProfiVarSampleRate].Set(opts.SampleRate); err != nil {
			return nil, fmt.Errorf("set sample_rate: %w", err)
		}
	}
	if opts.Detailed {
		if err := spec.Variables[ProfiVarDetailedLaunches].Set(true); err != nil {
			return nil, fmt.Errorf("set detailed_launches: %w", err)
		}
	}
	// One program per role, built as uprobe.multi (bpf/profi.bpf.c). A
	// classic uprobe program is the same code with no expected attach
	// type: decided once, here, for every program.
	multi, noMulti := !opts.NoUprobeMulti, error(nil)
	if multi {
		if noMulti = HaveUprobeMulti(); noMulti != nil {
			multi = false
		}
	}
	if !multi {
		for _, p := range spec.Programs {
			if p.AttachType == ebpf.AttachTraceUprobeMulti {
				p.AttachType = ebpf.AttachNone
			}
		}
	}
	if opts.CountHits {
		if err := spec.Variables[ProfiVarCountHits].Set(true); err != nil {
			return nil, fmt.Errorf("set count_hits: %w", err)
		}
	}
	if opts.CrashBreaker {
		if err := spec.Variables[ProfiVarCrashBreaker].Set(true); err != nil {
			return nil, fmt.Errorf("set crash_breaker: %w", err)
		}
		// The uprobe out-of-line area is one page (fault_deliver).
		if err := spec.Variables[ProfiVarPageSize].Set(uint64(os.Getpagesize())); err != nil {
			return nil, fmt.Errorf("set page_size: %w", err)
		}
	}
	// 5.15 and 5.16 lack bpf_find_vma: its code is then left out (find_vma in bpf/config.h).
	if !opts.NoFindVMA && features.HaveProgramHelper(ebpf.Kprobe, asm.FnFindVma) == nil {
		if err := spec.Variables[ProfiVarFindVma].Set(true); err != nil {
			return nil, fmt.Errorf("set find_vma: %w", err)
		}
	}
	if opts.NVTX {
		if err := spec.Variables[ProfiVarNvtxEnabled].Set(true); err != nil {
			return nil, fmt.Errorf("set nvtx_enabled: %w", err)
		}
	}
	if mode, ok := kernelModes[opts.KernelMode]; !ok {
		return nil, fmt.Errorf("kernel mode %q: want off, anonymous or full", opts.KernelMode)
	} else if err := spec.Variables[ProfiVarKernelMode].Set(mode); err != nil {
		return nil, fmt.Errorf("set kernel_mode: %w", err)
	}
	// A preallocated hash map charges its whole size at load: 62 of the
	// object's 79 MiB at the default sizes (docs/BENCHMARK.md, "Kernel
	// memory at load"). Where the kernel allocates elements safely in a
	// uprobe program they are allocated as keys arrive instead, within the
	// same max_entries (a failed allocation is a failed insert, counted
	// as any other).
	objs := Objects{UprobeMulti: multi, NoUprobeMulti: noMulti, RunTimeAlloc: !opts.Preallocate && RunTimeAllocation()}
	if objs.RunTimeAlloc {
		for _, m := range spec.Maps {
			if m.Type == ebpf.Hash {
				m.Flags |= unix.BPF_F_NO_PREALLOC
			}
		}
	}
	var copts *ebpf.CollectionOptions
	if opts.VerifierStats {
		copts = &ebpf.CollectionOptions{Programs: ebpf.ProgramOptions{LogLevel: ebpf.LogLevelStats}}
	}
	if err := spec.LoadAndAssign(&objs.ProfiObjects, copts); err != nil {
		var verr *ebpf.VerifierError
		if errors.As(err, &verr) {
			return nil, fmt.Errorf("load BPF object: %w\nverifier log:\n%+v", err, verr)
		}
		return nil, fmt.Errorf("load BPF object: %w", err)
	}
	return &objs, nil
}
