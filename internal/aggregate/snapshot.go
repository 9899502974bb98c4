package aggregate

import (
	"time"

	"github.com/profi-dev/profi/internal/bpfobj"
)

// Meta are the labels that describe a process. Pod, GPU and container
// fields stay empty until enrichment fills them.
type Meta struct {
	PID       int
	Comm      string
	Namespace string
	Pod       string
	Container string
	GPU       string
	GPUUUID   string
}

// OpStream keys calls by operation and stream label.
type OpStream struct{ Op, Stream string }

// OpCode keys errors by operation and error code label.
type OpCode struct{ Op, Code string }

// DirStream keys memcpy bytes by direction and stream label.
type DirStream struct{ Direction, Stream string }

// Launch holds kernel launch totals for one kernel label.
type Launch struct {
	Count        uint64
	GridBlocks   uint64
	BlockThreads uint64
	SharedBytes  uint64
}

// Kernel are the kernel labels of a launch: kernel, kernel_class and the
// NVTX phase ("" without an open range or without --enable-nvtx-tracing).
type Kernel struct{ Name, Class, Phase string }

// KernelHistKey are the labels of the kernel launch latency histograms.
type KernelHistKey struct {
	Kernel
	Namespace, Pod, GPU string
}

// Process is everything exported about one live process.
type Process struct {
	Meta        Meta
	Calls       map[OpStream]uint64
	Errors      map[OpCode]uint64
	Memcpy      map[DirStream]uint64
	Memset      map[OpStream]uint64
	MallocBytes uint64 // device memory allocated (cudaMalloc, cudaMallocAsync, cudaMallocManaged)
	FreedBytes  uint64 // tracked device memory freed
	// MallocHostBytes is pinned host memory allocated (cudaMallocHost).
	MallocHostBytes uint64
	Launches        map[Kernel]Launch
	// Captured are launch calls made on a stream capturing a CUDA graph
	// (they ran nothing); Graph the kernels CUDA graph replays ran.
	// Kernels that ran = Launches + Graph.
	Captured, Graph map[Kernel]Launch
	// Graphs are the process's CUDA graphs (on its first entry only); nil
	// when it used none while attached.
	Graphs *GraphStats
	// NCCL is the process's NCCL data; nil when it made no NCCL call.
	NCCL *NCCL
	// CUDAInFlight is the age of the process's oldest timed CUDA call in
	// progress at the drain, by operation (first entry only; nil when
	// none): host time since the call entered, not GPU time. UnsampledAge
	// where no call of that operation had its start sampled.
	CUDAInFlight map[string]time.Duration
	// GPUs are the devices whose calls this entry counts (Meta.GPU and
	// Meta.GPUUUID are their labels); nil without GPU attribution. A
	// process that used several GPUs has one entry per GPU, adjacent in
	// Snapshot.Processes; per-process data without a gpu label (NCCL hangs,
	// in-flight ages, straggler ratios, per-communicator series) is on its
	// first entry only.
	GPUs []GPUAttribution
	// IdleFor is how long the process has launched no kernel on this
	// entry's GPU (eager launches and graph replays; host-side launches,
	// not GPU execution), at drain granularity, from when the agent first
	// saw it at the latest. Live processes only.
	IdleFor time.Duration
	// LaunchThreads are the process's live threads that launched a kernel
	// (first entry only), LaunchThreadsUnsampled those past the bound on
	// threads sampled per process; LaunchThreadCPU their run time (user
	// and system, from each thread's start), with that of the ones that
	// exited at their last sample; LaunchBound the last complete
	// LaunchWindow (nil before one). Live processes only.
	LaunchThreads, LaunchThreadsUnsampled int
	LaunchThreadCPU                       time.Duration
	LaunchBound                           *LaunchBound
	// Exited: the final values of a process that has exited (PID set), or
	// the folded series of its container's exited processes (PID 0:
	// exported with pid=""); only counters are exported for it
	// (exited.go).
	Exited bool
	// memory and hostMemory report whether those series were admitted.
	memory     bool
	hostMemory bool
	events     uint64
	hists      map[string]*Hist // by operation; merged into Snapshot.Hists
	khists     map[Kernel]*Hist // merged into Snapshot.KernelHists
}

// HasHostMemory reports whether the pinned host memory series is exported.
func (p *Process) HasHostMemory() bool { return p.hostMemory }

// HasMemory reports whether the process's memory series are exported
// (false when --max-time-series refused them).
func (p *Process) HasMemory() bool { return p.memory }

// HasActiveMemory reports whether the active-memory gauge is exported: a
// live process's, never an exited one's.
func (p *Process) HasActiveMemory() bool { return p.memory && !p.Exited }

// HoldsIdle reports whether the held-idle gauge is exported: a live
// process that holds device memory on this entry's GPU (ActiveBytes > 0).
func (p *Process) HoldsIdle() bool { return p.HasActiveMemory() && p.ActiveBytes() > 0 }

// ActiveBytes is device memory allocated minus freed since attach; frees
// of allocations made before attach are never subtracted.
func (p *Process) ActiveBytes() uint64 {
	if p.FreedBytes > p.MallocBytes {
		return 0
	}
	return p.MallocBytes - p.FreedBytes
}

// Exported are the entries whose counters are exported: the live
// processes, then the exited ones.
func (s *Snapshot) Exported() []*Process {
	if len(s.Exited) == 0 {
		return s.Processes
	}
	return append(s.Processes[:len(s.Processes):len(s.Processes)], s.Exited...)
}

// HistKey are the labels of the latency histograms.
type HistKey struct{ Op, Namespace, Pod, GPU string }

// Snapshot is one consistent view of the aggregated data. Never mutated
// after publication.
type Snapshot struct {
	Time      time.Time
	Processes []*Process // sorted by PID, then GPU (one entry per GPU a process used)
	// Exited are the series of exited processes (Process.Exited): the
	// final values of those that exited less than --gc-interval ago, then
	// the folded series of their containers. Only the exporters read them.
	Exited []*Process
	// Hists are the CUDA call latency histograms (bpfobj.LatencyBoundsNs).
	Hists map[HistKey]*Hist
	// KernelHists are the launch latency histograms (full mode,
	// bpfobj.KernelLatencyBoundsNs).
	KernelHists map[KernelHistKey]*Hist
	// NCCLHists are the NCCL host-side latency histograms
	// (bpfobj.NCCLLatencyBoundsNs).
	NCCLHists map[HistKey]*Hist
	// NCCLStale is the number of in-flight NCCL calls older than the hang timeout.
	NCCLStale int
	// AggregatedKeys and LaunchKeys are the entries of those maps (fill level).
	AggregatedKeys, LaunchKeys int
	// Drops are the BPF drop counters, indexed by bpfobj.Drop.
	Drops [bpfobj.NumDrops]uint64
	// RingDropRate is events ring-buffer drops per second since the previous drain.
	RingDropRate float64
	// CardinalityDrops counts label tuples refused at --max-time-series.
	CardinalityDrops uint64
	// ExpiredSeries counts series of exited processes dropped
	// RetainedExpiry after their last exit: retained histograms and folded
	// series (exited.go).
	ExpiredSeries uint64
	// RejectedComms counts processes whose comm was not label-safe
	// (invalid UTF-8, control characters, too long) and was cleaned.
	RejectedComms uint64
	// TenantRefusals are the new keys each tenant was refused in the
	// shared maps, tenants with none left out, by tenant id.
	TenantRefusals []TenantRefusals
	// GraphRefusals counts CUDA graphs whose expansion was refused, by
	// reason (GraphRefused*): each graph of a process once.
	GraphRefusals map[string]uint64
	// ReadFailures counts drains in which a map could not be read after
	// retries, by map name; the drain went on without it.
	ReadFailures map[string]uint64
	// Series is the number of label tuples currently exported.
	Series int
	// Events is the number of calls counted so far (live and exited processes).
	Events uint64
	// DrainDuration is how long building this snapshot took.
	DrainDuration time.Duration
}
