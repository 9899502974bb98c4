package attach

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/discover"
	"github.com/profi-dev/profi/internal/ops"
)

// Work on demand between passes: library-load events from the loader hook
// ask the discovery loop for a pass (WatchLoads); runtime ops BPF reports
// ready run the handover (WatchLearning); and the exit hook (ExitHook).

// maxChecksPerSecond bounds the per-process maps reads that library-load
// events cause, so a node starting thousands of processes cannot turn
// the trigger into a scan storm; events beyond it wait for the periodic
// rescan.
const maxChecksPerSecond = 200

// WatchLoads turns library-load events (dl_event on ld.so's
// _dl_debug_state, ring lib_loads) into discovery passes: when the loading
// process now maps a CUDA library file that is neither attached nor
// waiting for a retry, it asks for a pass on due, so the library is
// attached within a scan instead of up to --refresh-interval later. The
// periodic rescan stays the safety net. It returns when ctx ends.
func (a *Attacher) WatchLoads(ctx context.Context, ring *ebpf.Map, procRoot string, due chan<- struct{}) error {
	var (
		window time.Time
		checks int
	)
	return bpfobj.ReadRing(ctx, ring, a.log, func(raw []byte) {
		if len(raw) < 4 {
			return
		}
		if now := time.Now(); now.Sub(window) >= time.Second {
			window, checks = now, 0
		}
		if checks++; checks > maxChecksPerSecond {
			a.loadChecksSkipped.Add(1)
			return
		}
		pid := int(binary.NativeEndian.Uint32(raw))
		if a.opts.PID != 0 && pid != a.opts.PID {
			return
		}
		if a.needsPass(procRoot, pid) {
			select {
			case due <- struct{}{}:
			default: // a pass is already due; it will see this process too
				a.triggersCoalesced.Add(1)
			}
		}
	})
}

// needsPass reports whether pid maps a profiled library file the attacher
// does not know yet, or an attached one without knowing that pid maps it:
// until a pass writes its pid_files values, its hits there
// are refused and the runtime->driver guard falls back to its time marker.
func (a *Attacher) needsPass(procRoot string, pid int) bool {
	res, err := (&discover.Scanner{ProcRoot: procRoot, PID: pid, NVTX: a.opts.NVTX, Tracers: a.opts.ExcludeTraced}).Scan()
	if err != nil || len(res.Processes) == 0 {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, m := range res.Processes[0].Libs {
		if !profiled(m.Lib) || len(a.probes(m.Lib, a.opts.KernelMode)) == 0 {
			continue
		}
		key := FileKey{Dev: m.Dev, Inode: m.Inode}
		if f, ok := a.files[key]; ok {
			if !slices.Contains(f.target.PIDs, pid) {
				return true
			}
			continue
		}
		if _, ok := a.failed[key]; ok {
			continue // its retry has its own schedule
		}
		return true
	}
	return false
}

// maxHandoverSyncsPerSecond bounds the handover runs that learning
// records cause; records beyond it leave their file to the next pass.
const maxHandoverSyncsPerSecond = 20

// WatchLearning runs the runtime->driver handover when BPF says a runtime
// op may be ready (ring rt_learned: one of its launches reached the driver
// for the RT_MIN_MERGED-th time on a CPU), so a runtime file first seen
// in a short process hands its launches over within its first launches
// instead of at the next pass (ARCHITECTURE.md, "One trap per launch").
// It returns when ctx ends.
func (a *Attacher) WatchLearning(ctx context.Context, ring *ebpf.Map) error {
	var (
		window time.Time
		syncs  int
	)
	return bpfobj.ReadRing(ctx, ring, a.log, func(raw []byte) {
		var e bpfobj.ProfiRtLearnedEvent
		if _, err := binary.Decode(raw, binary.NativeEndian, &e); err != nil {
			return
		}
		a.mu.Lock()
		defer a.mu.Unlock()
		if !a.waitsForHandover(e.File, ops.Op(e.Op)) {
			return // handed over already, or its file is gone
		}
		if now := time.Now(); now.Sub(window) >= time.Second {
			window, syncs = now, 0
		}
		if syncs++; syncs > maxHandoverSyncsPerSecond {
			a.handoverLimited.Add(1)
			return
		}
		a.handoverWakeups.Add(1)
		a.syncProcessMaps(true)
	})
}

// waitsForHandover reports whether op of the attached runtime file with id
// file still counts its launches with its own probe. Called with a.mu held.
func (a *Attacher) waitsForHandover(file uint32, op ops.Op) bool {
	if a.closed || a.stopped {
		return false
	}
	for _, f := range a.files {
		if f.id == file {
			lp, ok := f.launches[op]
			return ok && !lp.handed && !f.paused && !f.settled
		}
	}
	return false
}

// ExitHook attaches prog to the sched_process_exit raw tracepoint (it
// clears the in-flight state of every exiting thread). Raw tracepoints
// need no tracefs mount.
func ExitHook(prog *ebpf.Program) (link.Link, error) {
	l, err := link.AttachRawTracepoint(link.RawTracepointOptions{Name: "sched_process_exit", Program: prog})
	if err != nil {
		return nil, fmt.Errorf("attach sched_process_exit hook: %w", err)
	}
	return l, nil
}

// FaultHook attaches prog to the signal_deliver raw tracepoint: the crash
// breaker's evidence of each fault the kernel raises in a probed process
// (bpf/exit.c, fault_deliver).
func FaultHook(prog *ebpf.Program) (link.Link, error) {
	l, err := link.AttachRawTracepoint(link.RawTracepointOptions{Name: "signal_deliver", Program: prog})
	if err != nil {
		return nil, fmt.Errorf("attach signal_deliver hook: %w", err)
	}
	return l, nil
}
