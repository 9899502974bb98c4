package aggregate

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"

	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/ops"
	"github.com/profi-dev/profi/internal/status"
)

// recentLaunches is how many detailed launches /status keeps.
const recentLaunches = 256

// LaunchEvent is one kernel launch of --detailed-launches.
type LaunchEvent = status.LaunchEvent

// Events consumes the events ring buffer (--detailed-launches): it counts
// every launch event and keeps the latest few for /status. It is a
// debugging aid beside the aggregated path, never a replacement for it.
type Events struct {
	log     *slog.Logger
	observe func(time.Duration)
	// bootOffset converts bpf_ktime_get_ns (monotonic since boot) to wall time.
	bootOffset time.Time

	mu     sync.Mutex
	total  uint64
	recent []LaunchEvent // ring of the latest events
	next   int
}

// NewEvents returns a consumer; observe (may be nil) receives the
// processing time of each event (profi_system_event_loop_process_duration_seconds).
func NewEvents(log *slog.Logger, observe func(time.Duration)) *Events {
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Events{log: log.With("component", "events"), observe: observe, bootOffset: bootTime()}
}

// Run reads the ring buffer until ctx ends.
func (e *Events) Run(ctx context.Context, ring *ebpf.Map) error {
	return bpfobj.ReadRing(ctx, ring, e.log, func(raw []byte) {
		began := time.Now()
		if len(raw) >= int(unsafe.Sizeof(bpfobj.ProfiLaunchEvent{})) {
			e.add((*bpfobj.ProfiLaunchEvent)(unsafe.Pointer(&raw[0])))
		}
		if e.observe != nil {
			e.observe(time.Since(began))
		}
	})
}

func (e *Events) add(ev *bpfobj.ProfiLaunchEvent) {
	le := LaunchEvent{
		Time:         e.bootOffset.Add(time.Duration(ev.TsNs)),
		PID:          int(ev.Pid),
		TID:          int(ev.Tid),
		Operation:    ops.Name(ev.Op),
		Error:        ev.Err,
		DurationNs:   ev.DurationNs,
		Function:     ev.Launch.Func,
		Stream:       bpfobj.StreamLabel(ev.Launch.Stream),
		GridBlocks:   ev.Launch.GridBlocks,
		BlockThreads: ev.Launch.BlockThreads,
		SharedBytes:  ev.Launch.SharedBytes,
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.total++
	if len(e.recent) < recentLaunches {
		e.recent = append(e.recent, le)
		return
	}
	e.recent[e.next] = le
	e.next = (e.next + 1) % recentLaunches
}

// Total is the number of launch events received.
func (e *Events) Total() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.total
}

// Recent returns the latest events, oldest first.
func (e *Events) Recent() []LaunchEvent {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]LaunchEvent, 0, len(e.recent))
	out = append(out, e.recent[e.next:]...)
	return append(out, e.recent[:e.next]...)
}
