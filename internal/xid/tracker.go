package xid

import (
	"errors"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/profi-dev/profi/internal/aggregate"
	"github.com/profi-dev/profi/internal/kmsg"
	"github.com/profi-dev/profi/internal/nvml"
	"github.com/profi-dev/profi/internal/status"
)

// DefaultKeep is how many Xids /status keeps.
const DefaultKeep = 32

// Key counts Xids: the GPU (NVML index and UUID; -1 and "" when no GPU has
// the line's bus id) and the code.
type Key struct {
	GPU  int
	UUID string
	Code uint32
}

// Tracker is the kernel log consumer of Xid lines.
type Tracker struct {
	// TrustUser counts Xid lines of any facility (--kmsg-trust-user: the
	// tests write theirs from userspace). Otherwise only the kernel's own
	// count (the driver prints them with printk): a line written to
	// /dev/kmsg from userspace has the user facility, and no process may
	// forge an Xid (nor fire ProfiGPUXid).
	TrustUser bool
	// KernelLogRunning says whether the kernel log is read (the counting
	// source); nil: never (NVMLEvent records every event).
	KernelLogRunning func() bool

	gpus  func() *nvml.Snapshot      // may return nil
	procs func() *aggregate.Snapshot // may return nil
	keep  int
	now   func() time.Time

	mu        sync.Mutex
	lastSeq   uint64
	seen      bool
	counts    map[Key]uint64
	recent    []status.Xid // oldest first, at most keep
	malformed uint64
	notKernel uint64
}

// Reasons an Xid line is not counted (Rejected).
const (
	RejectedMalformed = "malformed"  // the parser refused it
	RejectedNotKernel = "not_kernel" // not the kernel's facility (written from userspace)
)

// NewTracker returns a Tracker; gpus and procs are the NVML and aggregator
// snapshots (either may be nil).
func NewTracker(gpus func() *nvml.Snapshot, procs func() *aggregate.Snapshot, keep int) *Tracker {
	if keep <= 0 {
		keep = DefaultKeep
	}
	return &Tracker{gpus: gpus, procs: procs, keep: keep, now: time.Now, counts: map[Key]uint64{}}
}

// Consume handles one kernel log record (a kmsg.Consumer). A record whose
// sequence number is not newer than the last one counted is ignored: each
// record is counted once whatever delivers it twice.
func (t *Tracker) Consume(r kmsg.Record) {
	l, err := Parse(r.Message)
	if errors.Is(err, ErrNotXid) {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if r.Facility != kmsg.FacilityKernel && !t.TrustUser {
		t.notKernel++
		return
	}
	if t.seen && r.Seq <= t.lastSeq {
		return
	}
	t.seen, t.lastSeq = true, r.Seq
	if err != nil {
		t.malformed++
		return
	}
	x := status.Xid{
		Source: SourceKernelLog, Seq: r.Seq, Uptime: r.Time, Time: t.now(), Code: l.Code, PCIBusID: l.Bus.String(), GPU: -1,
		DriverPID: l.PID, DriverName: l.Name, Detail: l.Detail, Processes: []status.XidProcess{},
	}
	var g *nvml.GPU
	if t.gpus != nil {
		if s := t.gpus(); s != nil {
			for i := range s.GPUs {
				if b, err := ParseBusID(s.GPUs[i].PCIBusID); err == nil && b == l.Bus {
					g = &s.GPUs[i]
					x.GPU, x.GPUUUID = g.Index, g.UUID
				}
			}
		}
	}
	if g != nil {
		x.Processes = t.onGPU(g)
	}
	t.counts[Key{GPU: x.GPU, UUID: x.GPUUUID, Code: x.Code}]++
	t.keepRecent(x)
}

// Sources of an Xid (status.Xid.Source).
const (
	SourceKernelLog = "kernel_log"
	SourceNVML      = "nvml"
)

// keepRecent appends x to the recent Xids, at most keep. Called with t.mu
// held.
func (t *Tracker) keepRecent(x status.Xid) {
	if len(t.recent) == t.keep {
		t.recent = slices.Delete(t.recent, 0, 1)
	}
	t.recent = append(t.recent, x)
}

// NVMLEvent records an XID event of NVML's (nvml.Options.OnXid) with the
// same blast radius as a kernel log line: the processes on that GPU now,
// with their calls in flight. Only where the kernel log is not the
// counting source (KernelLogRunning false): the same fault is not listed
// twice. NVML's event counts are the collector's (docs/METRICS.md, "Xid
// blast radius").
func (t *Tracker) NVMLEvent(index int, uuid string, code uint64) {
	if t.KernelLogRunning != nil && t.KernelLogRunning() {
		return
	}
	x := status.Xid{Source: SourceNVML, Time: t.now(), Code: uint32(min(code, 1<<32-1)), GPU: index, GPUUUID: uuid, Processes: []status.XidProcess{}}
	if t.gpus != nil {
		if s := t.gpus(); s != nil {
			for i := range s.GPUs {
				if s.GPUs[i].UUID == uuid {
					x.PCIBusID = s.GPUs[i].PCIBusID
					x.Processes = t.onGPU(&s.GPUs[i])
				}
			}
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.keepRecent(x)
}

// onGPU lists the processes on g: the profiled processes whose calls went
// to g (or one of its MIG devices), then NVML's compute processes not
// already listed; each profiled one with its calls in flight.
func (t *Tracker) onGPU(g *nvml.GPU) []status.XidProcess {
	out := []status.XidProcess{}
	at := map[int]bool{}
	first := map[int]*aggregate.Process{} // per-process data is on the first entry
	mine := func(uuid string) bool {
		if uuid == g.UUID {
			return true
		}
		return strings.HasPrefix(uuid, "MIG-") && slices.ContainsFunc(g.MIGDevices, func(m nvml.MigDevice) bool { return m.UUID == uuid })
	}
	if t.procs != nil {
		if s := t.procs(); s != nil {
			for _, p := range s.Processes {
				if first[p.Meta.PID] == nil {
					first[p.Meta.PID] = p
				}
			}
			for _, p := range s.Processes {
				if !mine(p.Meta.GPUUUID) || at[p.Meta.PID] {
					continue
				}
				at[p.Meta.PID] = true
				out = append(out, profiled(p.Meta, p.Meta.GPUUUID, first[p.Meta.PID]))
			}
		}
	}
	for _, p := range g.Processes {
		pid := int(p.PID)
		if at[pid] {
			continue
		}
		at[pid] = true
		if f := first[pid]; f != nil { // a profiled process with no call attributed to this GPU yet
			out = append(out, profiled(f.Meta, g.UUID, f))
		} else {
			out = append(out, status.XidProcess{PID: pid, GPUUUID: g.UUID})
		}
	}
	slices.SortFunc(out, func(a, b status.XidProcess) int { return a.PID - b.PID })
	return out
}

// profiled is a profiled process on an Xid's GPU, with the calls in flight
// that f, its first snapshot entry, holds.
func profiled(m aggregate.Meta, gpuUUID string, f *aggregate.Process) status.XidProcess {
	xp := status.XidProcess{PID: m.PID, Comm: m.Comm, Namespace: m.Namespace, Pod: m.Pod, Container: m.Container, GPUUUID: gpuUUID}
	if f.NCCL != nil && len(f.NCCL.Oldest) > 0 {
		xp.NCCLInFlight = map[string]float64{}
		for op, age := range f.NCCL.Oldest {
			xp.NCCLInFlight[op] = age.Seconds()
		}
	}
	if len(f.CUDAInFlight) > 0 {
		xp.CUDAInFlight = map[string]float64{}
		for op, age := range f.CUDAInFlight {
			xp.CUDAInFlight[op] = -1
			if age != aggregate.UnsampledAge {
				xp.CUDAInFlight[op] = age.Seconds()
			}
		}
	}
	return xp
}

// Counts returns the Xids counted, by GPU and code.
func (t *Tracker) Counts() map[Key]uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return maps.Clone(t.counts)
}

// Recent returns the last Xids, oldest first.
func (t *Tracker) Recent() []status.Xid {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.recent)
}

// Malformed counts Xid lines the parser refused.
func (t *Tracker) Malformed() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.malformed
}

// Rejected counts the Xid lines not counted, by reason (every reason
// present).
func (t *Tracker) Rejected() map[string]uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return map[string]uint64{RejectedMalformed: t.malformed, RejectedNotKernel: t.notKernel}
}
