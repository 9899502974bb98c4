package status

import "time"

// Doc is the JSON body of /status: where a user finds out what is
// attached and why something is not (`profi explain` reads it).
type Doc struct {
	Version           string        `json:"version"`
	UptimeSeconds     float64       `json:"uptime_seconds"`
	KernelMode        string        `json:"kernel_mode"`
	ProbeProfile      string        `json:"probe_profile"`
	PIDFilter         int           `json:"pid_filter"`
	BPFLoaded         bool          `json:"bpf_loaded"`
	AttachedLibraries []LibraryView `json:"attached_libraries"`
	AttachFailures    []FailureView `json:"attach_failures"`
	LoaderHooks       []LoaderHook  `json:"loader_hooks"`
	// FileDescriptors are the agent's open descriptors and its limit
	// (RLIMIT_NOFILE, raised to the hard limit at start by Go): the
	// headroom for more links (also process_open_fds, process_max_fds).
	FileDescriptors *FileDescriptors `json:"file_descriptors,omitempty"`
	// ProbeLinks are the links the probes hold, their descriptors and the
	// estimated time to release them, against the link caps.
	ProbeLinks *ProbeLinks `json:"probe_links,omitempty"`
	// PodCgroups are the node's pod cgroups the agent found, each pod's
	// processes one tenant of the shared maps (docs/METRICS.md, "Shares of
	// the shared maps"); absent without a cgroup v2 hierarchy.
	PodCgroups      *PodCgroups       `json:"pod_cgroups,omitempty"`
	LastDiscovery   time.Time         `json:"last_discovery"`
	TrackedPIDs     []int             `json:"tracked_pids"`
	EventsProcessed uint64            `json:"events_processed"`
	ExportedSeries  int               `json:"exported_series"`
	Drops           map[string]uint64 `json:"drops"`
	LastDrain       time.Time         `json:"last_drain"`
	// AttachFailureTotals are profi_system_attach_failures_total by
	// library and reason, as "library/reason" (retried files included).
	AttachFailureTotals map[string]uint64 `json:"attach_failure_totals"`
	// Operations are the calls counted per operation, over the live
	// processes, launches and NCCL included.
	Operations map[string]uint64 `json:"operations"`
	// Processes is the per-process view: labels and live counters.
	Processes []ProcessStatus `json:"processes"`
	// UnknownGraphReplays are the CUDA graph replays, over the live
	// processes, of executable graphs profi did not see built (built or
	// instantiated before it attached, or past the per-process caps):
	// the kernels they ran are not counted anywhere.
	UnknownGraphReplays uint64 `json:"unknown_graph_replays"`
	// Refusals are profi_system_limit_refusals_total by limit: work
	// refused at a bound that keeps one tenant from exhausting the agent
	// (docs/SECURITY.md).
	Refusals map[string]uint64 `json:"refusals"`
	// Kubernetes is the pod watch state; absent without --node-name.
	Kubernetes *Kubernetes `json:"kubernetes,omitempty"`
	// KernelFeatures are the optional kernel features the agent uses.
	KernelFeatures *KernelFeatures `json:"kernel_features,omitempty"`
	// NVML is the GPU poller's state; absent with --disable-nvml.
	NVML *NVML `json:"nvml,omitempty"`
	// RecentLaunches are the latest launches with --detailed-launches.
	RecentLaunches []LaunchEvent `json:"recent_launches,omitempty"`
	// Quarantined are the library files whose probes the crash breaker
	// took off node-wide (ARCHITECTURE.md, "Crash circuit breaker").
	Quarantined []Quarantine `json:"quarantined"`
	// KernelLog is the kernel log reader's state (the kernel-warning
	// watch and the Xid tracker read it).
	KernelLog *KernelLog `json:"kernel_log,omitempty"`
	// Xids are the last Xid errors of the kernel log with their blast
	// radius, oldest first; absent without NVML.
	Xids []Xid `json:"xids,omitempty"`
	// Degraded: some probes are off for the node's safety (a quarantine)
	// or by policy; DegradedReasons say which and why. GPU (NVML) metrics
	// and the agent's own health are served either way.
	Degraded        bool     `json:"degraded"`
	DegradedReasons []string `json:"degraded_reasons,omitempty"`
}

// KernelLog is the kernel log reader's state and counts (internal/kmsg).
type KernelLog struct {
	Path      string            `json:"path"`
	Running   bool              `json:"running"`
	Error     string            `json:"error,omitempty"`
	Records   uint64            `json:"records"`
	Truncated uint64            `json:"truncated"`
	Drops     map[string]uint64 `json:"drops,omitempty"`
}

// Quarantine is a library file whose probes are off because a process
// that mapped it died of a fault signal right after one of its probes
// trapped there.
type Quarantine struct {
	Library string `json:"library"`
	Path    string `json:"path"`
	File    string `json:"file"` // dev major:minor/inode
	// Reason is the metric's reason label: the signal, lower case
	// ("sigsegv", "sigill", "sigbus", "sigtrap", "sigfpe", "sigsys").
	Reason string `json:"reason"`
	// Scope: "tenant" (the file is left unprobed in the processes of
	// Tenant, the dead process's pod's cgroup v2 id, else its own cgroup's) or "node" (its probes are
	// off on the node).
	Scope  string `json:"scope"`
	Tenant uint64 `json:"tenant,omitempty"`
	// Evidence says why the fault is the probes' doing (breaker.Evidence);
	// FaultIP, FaultAddr and SiCode are the fault as the kernel delivered
	// it (SiCode 0 for a seccomp kill, which delivers none).
	Evidence  []string `json:"evidence,omitempty"`
	FaultIP   uint64   `json:"fault_ip,omitempty"`
	FaultAddr uint64   `json:"fault_addr,omitempty"`
	SiCode    int32    `json:"si_code,omitempty"`
	// PID and Comm are the process that died; Signal its signal's name
	// (SIGSEGV), CoreDumped whether it dumped core.
	PID        int    `json:"pid"`
	Comm       string `json:"comm"`
	Signal     string `json:"signal"`
	CoreDumped bool   `json:"core_dumped,omitempty"`
	// Time is when it died; SinceHitSeconds how long after the process's
	// latest probe hit, DetachSeconds how long from the death to the
	// quarantine in force (the links closed or switched).
	Time            time.Time `json:"time"`
	SinceHitSeconds float64   `json:"seconds_since_probe_hit"`
	DetachSeconds   float64   `json:"detach_seconds"`
	// PIDs are the processes that mapped the file at the last discovery
	// pass, and the dead one: they are no longer probed there.
	PIDs []int `json:"pids"`
	// KernelLog is, for a node-wide stop (library "all"), what caused it:
	// the kernel log line as the kernel escaped it (at most 1 KiB), or the
	// known kernel bug (reason unsafe_kernel).
	KernelLog string `json:"kernel_log,omitempty"`
	// LiftsAt is when the quarantine ends (--quarantine-lift, doubled at
	// each quarantine of the same file); absent: not before the agent
	// restarts.
	LiftsAt *time.Time `json:"lifts_at,omitempty"`
}

// KernelFeatures says which optional kernel features are in use, and so
// which fallbacks are active.
type KernelFeatures struct {
	// UprobeMulti: one uprobe_multi link per library file and program
	// (else one classic uprobe per function).
	UprobeMulti bool `json:"uprobe_multi"`
	// ExitHook: the sched_process_exit raw tracepoint clears exited
	// threads' state at once (else the --gc-interval sweep does).
	ExitHook bool `json:"exit_hook"`
	// NoReturnProbes: the kernel has a known bug in return probes
	// (docs/KERNELS.md): none is attached, so calls are not timed.
	NoReturnProbes bool `json:"no_return_probes,omitempty"`
}

// LibraryView is an attached library file and the pods of its processes.
type LibraryView struct {
	LibraryStatus
	// Pods are "namespace/pod" of the file's processes that have pod
	// labels; empty without --node-name.
	Pods []string `json:"pods"`
}

// FailureView is a library file whose attach failed, with the pods of its
// processes.
type FailureView struct {
	FailureStatus
	Pods []string `json:"pods"`
}

// ProbeStatus is one attached probe.
type ProbeStatus struct {
	Symbol    string `json:"symbol"`
	Operation string `json:"operation"`
	Return    bool   `json:"return_probe"`
	Traps     int    `json:"traps_per_call"`
	// Offset is where the probe sits past the symbol: 4 when it skips an
	// endbr64 to land on an emulated push (one trap instead of two), the
	// length of the first instruction when the kernel refuses a uprobe
	// there and it was safe to move.
	Offset uint64 `json:"offset"`
	// Placement says why Offset is not 0: "past_endbr64", or
	// "past_refused_instruction" (a first instruction the kernel refuses,
	// which changes neither the stack pointer nor an argument register).
	Placement string `json:"placement,omitempty"`
	// Entry says how the kernel runs the instruction under the probe:
	// "simulated" (one exception per hit), "stepped" (single-stepped out
	// of line: two), "simulated_since_6.13" (a NOP: stepped before 6.13).
	// Reported for arm64 files; empty where not decided.
	Entry string `json:"entry,omitempty"`
	// CountedAtDriver: a runtime launch probe detached because the
	// driver's probe counts its launches, under this operation (one trap
	// per launch; ARCHITECTURE.md "One trap per launch").
	CountedAtDriver bool `json:"counted_at_driver,omitempty"`
}

// Placements of a probe other than its symbol (ProbeStatus.Placement).
const (
	// PlacementPastEndbr64: past an endbr64, on a push the kernel emulates.
	PlacementPastEndbr64 = "past_endbr64"
	// PlacementPastRefused: past a first instruction the kernel refuses a
	// uprobe on, which changes neither the stack pointer nor an argument
	// register (nor memory an argument or the return address is in).
	PlacementPastRefused = "past_refused_instruction"
)

// How the kernel runs the probed instruction (ProbeStatus.Entry).
const (
	EntrySimulated         = "simulated"
	EntryStepped           = "stepped"
	EntrySimulatedSince613 = "simulated_since_6.13"
)

// Reasons of RefusedProbe.
const (
	// RefusedLockPrefix: the address holds a lock-prefixed instruction.
	RefusedLockPrefix = "lock_prefix"
	// RefusedSegmentPrefix: an instruction with an ES, CS, DS or SS prefix.
	RefusedSegmentPrefix = "segment_prefix"
	// RefusedByKernel: the kernel refused an attach there, for a reason
	// the bytes do not show (found by trying the address alone).
	RefusedByKernel = "kernel_refused"
	// arm64 (docs/PROBES.md, "Probe placement"):
	// RefusedExclusive: an exclusive load or store (LDXR, STXR, CASP...).
	RefusedExclusive = "exclusive_access"
	// RefusedLiteralLoad: a PC-relative literal load (LDR, LDRSW, PRFM
	// literal; SIMD&FP LDR literal would be stepped at the wrong address).
	RefusedLiteralLoad = "literal_load"
	// RefusedSystem: MSR, MRS of DAIF, ERET: not steppable.
	RefusedSystem = "system_instruction"
	// RefusedException: an exception-generating instruction (SVC, BRK...).
	RefusedException = "exception_instruction"
	// RefusedHint: a hint outside the kernel's steppable list (AUTIASP...).
	RefusedHint = "hint"
	// RefusedBranch: a branch the kernel neither steps nor simulates
	// (BRAA, BLRAA, RETAA...).
	RefusedBranch = "unsimulated_branch"
	// RefusedMOPS: a memory copy/set instruction (one of three in sequence).
	RefusedMOPS = "memory_copy_set"
	// RefusedUnaligned: an address not 4-byte aligned.
	RefusedUnaligned = "unaligned"
)

// RefusedProbe is a probed function the library defines that has no
// probe: the kernel refuses a uprobe at its address (an instruction with
// a lock or ES/CS/DS/SS segment prefix, or another one it cannot
// single-step), and moving the probe was not safe. Its calls are not
// counted; the library's other functions are.
type RefusedProbe struct {
	Symbol    string `json:"symbol"`
	Operation string `json:"operation"`
	// Reason: "lock_prefix" or "segment_prefix" on x86-64, one of the
	// arm64 reasons above (all read from the file's bytes, never offered
	// to the kernel), "kernel_refused" (refused when tried).
	Reason string `json:"reason"`
	// Offset is the refused address past the symbol; FileOffset the same
	// address in the file.
	Offset     uint64 `json:"offset"`
	FileOffset uint64 `json:"file_offset"`
	// Code is the first bytes at the refused address, hex, when read.
	Code string `json:"code,omitempty"`
	// Error is the kernel's answer, for "kernel_refused".
	Error string `json:"error,omitempty"`
}

// LibraryStatus is an attached library file.
type LibraryStatus struct {
	Library string `json:"library"`
	Path    string `json:"path"`
	// Static: an executable probed as a statically linked CUDA runtime.
	Static  bool          `json:"static_runtime,omitempty"`
	File    string        `json:"file"` // dev major:minor/inode
	PIDs    []int         `json:"pids"`
	Probes  []ProbeStatus `json:"probes"`
	Missing []string      `json:"missing_symbols,omitempty"`
	Absent  []string      `json:"absent_optional_symbols,omitempty"`
	// Refused are the probed functions the kernel refuses a uprobe on:
	// not counted (profi_system_attach_failures_total{reason="probe_refused"}).
	Refused []RefusedProbe `json:"refused_probes,omitempty"`
	// FullModePIDs are processes upgraded to full kernel mode on this file.
	FullModePIDs []int `json:"full_mode_pids,omitempty"`
	// Paused is set while the overhead budget has detached the file's
	// Pausable probes (duty cycling); their counts are then estimates.
	Paused bool `json:"paused,omitempty"`
	// UprobeMulti is set when the probes are uprobe_multi links.
	UprobeMulti bool      `json:"uprobe_multi,omitempty"`
	AttachedAt  time.Time `json:"attached_at"`
	// ProbedPIDs: set while the file's probes are per-process links
	// because a process that maps it is left unprobed (Unprobed): the
	// processes whose links exist. Absent: one link set for every process.
	ProbedPIDs []int `json:"probed_pids,omitempty"`
	// Unprobed are the processes mapping the file that profi leaves
	// unprobed, and why (--probe-traced-processes).
	Unprobed []Unprobed `json:"unprobed_pids,omitempty"`
	// FilterSwitches counts the switches between one link set for every
	// process and per-process links (docs/OPERATIONS.md, "Traced
	// processes": entry-only probes have a gap at each).
	FilterSwitches uint64 `json:"filter_switches,omitempty"`
	// Links are the links the file holds now (its link sets and full-mode
	// upgrades): a classic link costs the agent two descriptors (the
	// perf event and the BPF link), a uprobe_multi link one.
	Links int `json:"links"`
	// Descriptors are the file descriptors those links hold (two per
	// classic link, one per uprobe_multi link).
	Descriptors int `json:"descriptors"`
}

// Unprobed is a process profi leaves unprobed.
type Unprobed struct {
	PID int `json:"pid"`
	// Reason: traced (a tracer is attached: TracerPID) or quarantined
	// (the crash breaker quarantined the file for the process's tenant).
	Reason    string `json:"reason"`
	TracerPID int    `json:"tracer_pid,omitempty"`
}

// FailureStatus is a library file whose attach failed and waits for a
// retry.
type FailureStatus struct {
	Library   string    `json:"library"`
	Path      string    `json:"path"`
	Static    bool      `json:"static_runtime,omitempty"`
	File      string    `json:"file"`
	PIDs      []int     `json:"pids"`
	Reason    string    `json:"reason"`
	Error     string    `json:"error"`
	Attempts  int       `json:"attempts"`
	NextRetry time.Time `json:"next_retry"`
	// Refused: reason "probe_refused", the kernel refuses a uprobe on
	// every probed function the file defines (not retried).
	Refused []RefusedProbe `json:"refused_probes,omitempty"`
}

// LoaderHook is a dynamic loader hooked to announce library loads

type LoaderHook struct {
	Path      string `json:"path"`
	File      string `json:"file"`
	Processes int    `json:"processes"`
}

// Layer says what profi sees of one layer of a process's CUDA stack, so an
// operator knows what its numbers cover (docs/OPERATIONS.md, "Coverage").
type Layer struct {
	// Layer: runtime, driver, nccl or nvtx.
	Layer string `json:"layer"`
	// State: probed; static (a runtime linked into the executable, probed
	// there); partial (probed, some required functions missing or refused
	// by the kernel); unprobed (mapped, left unprobed on purpose: a traced
	// process, --probe-traced-processes); blind
	// (present but not probed: a static runtime without symbols, or an
	// attach failure); absent (not mapped).
	State  string `json:"state"`
	Path   string `json:"path,omitempty"`
	Detail string `json:"detail,omitempty"`
}

// ProcessStatus is one process with data, as the aggregator labels it.
type ProcessStatus struct {
	PID int `json:"pid"`
	// Tenant is the tenant BPF admits the process's new keys under: its
	// pod's cgroup id, else its own cgroup's, or 2^63 + PID for a process
	// in the root cgroup; absent before its first key.
	Tenant    uint64 `json:"tenant,omitempty"`
	Comm      string `json:"comm"`
	Namespace string `json:"namespace"`
	Pod       string `json:"pod"`
	Container string `json:"container"`
	GPU       string `json:"gpu"`
	GPUUUID   string `json:"gpu_uuid"`
	// PodSource says where the pod labels came from: "cgroup+pod-watch",
	// or why there are none ("no --node-name", "not a pod": no kubelet
	// cgroup or no such pod on this node).
	PodSource string `json:"pod_source"`
	// GPUSource says where the gpu label came from, per CUDA device
	// ordinal the process's threads set ("" = GPU attribution off). A
	// process that used several GPUs has one entry per GPU.
	GPUSource string `json:"gpu_source"`
	// Layers: what profi probes of this process's runtime, driver, NCCL
	// and NVTX (from the attach state; filled by the /status assembler).
	Layers []Layer `json:"layers,omitempty"`
	// Calls are counted calls by operation (streams summed, launches
	// included).
	Calls map[string]uint64 `json:"calls"`
	// Launches are direct kernel launches that ran, over all kernels
	// (profi_cuda_kernel_launches_total).
	Launches uint64 `json:"launches"`
	// GraphKernelLaunches are the kernels CUDA graph replays ran
	// (profi_cuda_graph_kernel_launches_total): kernels that ran =
	// Launches + GraphKernelLaunches.
	GraphKernelLaunches uint64 `json:"graph_kernel_launches"`
	// CapturedLaunches are launch calls recorded into a CUDA graph while
	// their stream was capturing (profi_cuda_graph_captured_launches_total):
	// they ran nothing then.
	CapturedLaunches uint64 `json:"captured_launches"`
	// Graphs are the process's CUDA graphs, on its first entry only;
	// absent when it used none while profi was attached.
	Graphs *Graphs `json:"graphs,omitempty"`
	// Errors are failed calls by operation.
	Errors map[string]uint64 `json:"errors"`
	// MemcpyBytes are copied bytes by direction.
	MemcpyBytes       map[string]uint64 `json:"memcpy_bytes"`
	MemsetBytes       uint64            `json:"memset_bytes"`
	ActiveMemoryBytes uint64            `json:"active_memory_bytes"`
	// HeldIdleSeconds: it holds device memory on this GPU and has
	// launched no kernel there for this long (profi_cuda_held_idle_seconds);
	// absent when it holds none.
	HeldIdleSeconds *float64          `json:"held_idle_seconds,omitempty"`
	NCCLCalls       map[string]uint64 `json:"nccl_calls,omitempty"`
	NCCLBytes       map[string]uint64 `json:"nccl_bytes,omitempty"`
	// NCCLOldestInflightSeconds is the age of the oldest in-flight call
	// by operation.
	NCCLOldestInflightSeconds map[string]float64 `json:"nccl_oldest_inflight_seconds,omitempty"`
	// Launching is how the process launches kernels, on its first entry
	// only; absent before a thread of it launched one.
	Launching *Launching `json:"launching,omitempty"`
	// NCCLRanks are its positions in the collective sequences of its
	// communicators (first entry only).
	NCCLRanks []NCCLRank `json:"nccl_ranks,omitempty"`
	// GPUBusy is its GPU time per device (GPU or MIG device) as the
	// driver's samples integrate (profi_gpu_process_busy_seconds_total),
	// on its first entry only; absent without NVML samples of it.
	GPUBusy []GPUBusy `json:"gpu_busy_seconds,omitempty"`
}

// GPUBusy is a process's busy time on one device, per engine, in seconds.
type GPUBusy struct {
	UUID    string  `json:"uuid"`
	SM      float64 `json:"sm"`
	Memory  float64 `json:"memory"`
	Encoder float64 `json:"encoder"`
	Decoder float64 `json:"decoder"`
}

// Launching is a process's kernel-launching threads (docs/METRICS.md,
// "Launch-bound"): the inputs of `profi explain`'s launch verdict.
type Launching struct {
	// Threads are its live threads that launched a kernel;
	// ThreadsUnsampled those past the per-process bound.
	Threads          int `json:"threads"`
	ThreadsUnsampled int `json:"threads_unsampled,omitempty"`
	// CPUSeconds is their run time (profi_cuda_launch_thread_cpu_seconds_total).
	CPUSeconds float64 `json:"cpu_seconds"`
	// Window is the last complete window; absent before one.
	Window *LaunchWindow `json:"window,omitempty"`
	// GPUBusy is the driver's SM utilization of the process at the last
	// NVML poll, summed over its GPUs (0-1); absent without a sample.
	GPUBusy *float64 `json:"gpu_busy,omitempty"`
}

// LaunchWindow is one window of a process's launching.
type LaunchWindow struct {
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
	// BusiestTID is its launching thread that ran most in the window,
	// BusiestShare that thread's on-CPU share of the window (0-1).
	BusiestTID   int     `json:"busiest_tid"`
	BusiestShare float64 `json:"busiest_thread_share"`
	// LaunchRate is kernel launch calls per second (host calls).
	LaunchRate float64 `json:"launches_per_second"`
}

// NCCLRank is a process's position in one communicator's sequence of
// collectives (profi_nccl_rank_collectives_*_total).
type NCCLRank struct {
	Communicator string `json:"communicator"`
	Rank         int    `json:"rank"`
	NRanks       int    `json:"nranks"`
	Entered      uint64 `json:"entered"`
	Returned     uint64 `json:"returned"`
}

// Graphs are one process's CUDA graphs (docs/METRICS.md, "CUDA graphs").
type Graphs struct {
	// Graphs are the graphs profi saw built (captured or node by node).
	Graphs int `json:"graphs"`
	// Execs are the executable graphs alive whose graph profi saw built.
	Execs int `json:"execs"`
	// Replays are successful graph launches (cudaGraphLaunch, cuGraphLaunch).
	Replays uint64 `json:"replays"`
	// UnknownReplays are the replays of executable graphs profi did not
	// see built (built or instantiated before it attached, or past the
	// caps): the kernels they ran are not counted.
	UnknownReplays uint64 `json:"unknown_replays"`
	// RefusedReplays are replays of graphs whose expansion profi refused
	// (a cycle, or nesting, size or work past its bounds): the kernels,
	// copies and sets they ran are not counted.
	RefusedReplays uint64 `json:"refused_replays,omitempty"`
	// GraphKernelShare is graph kernels / (direct launches + graph
	// kernels) over every GPU of the process, since it was attached;
	// absent while it ran no kernel.
	GraphKernelShare *float64 `json:"graph_kernel_share,omitempty"`
}

// Kubernetes is the pod watch state.
type Kubernetes struct {
	NodeName    string    `json:"node_name"`
	Synced      bool      `json:"synced"`
	Pods        int       `json:"pods"`
	WatchErrors uint64    `json:"watch_errors"`
	LastError   string    `json:"last_error,omitempty"`
	LastErrorAt time.Time `json:"last_error_at,omitzero"`
}

// NVML is the GPU poller's state.
type NVML struct {
	Up            bool      `json:"up"`
	Reason        string    `json:"reason,omitempty"` // why it is down
	Library       string    `json:"library,omitempty"`
	DriverVersion string    `json:"driver_version,omitempty"`
	DeviceCount   int       `json:"device_count"`
	LastError     string    `json:"last_error,omitempty"` // last failed query of the last poll
	LastPoll      time.Time `json:"last_poll"`
	// Devices are the GPUs and their MIG devices with the state of the
	// per-process utilization and GPM sources ("ok" or why nothing is
	// reported: "not supported", "off", a GPM counter held by another client).
	Devices []NVMLDevice `json:"devices,omitempty"`
}

// NVMLDevice is one GPU or MIG device as a source of per-process
// utilization and GPM.
type NVMLDevice struct {
	GPU                int    `json:"gpu"`  // NVML index (of the parent GPU for a MIG device)
	UUID               string `json:"uuid"` // GPU-… or MIG-…
	PCIBusID           string `json:"pci_bus_id,omitempty"`
	ProcessUtilization string `json:"process_utilization"`
	GPM                string `json:"gpm"`
}

// LaunchEvent is one kernel launch of --detailed-launches

type LaunchEvent struct {
	Time         time.Time `json:"time"` // approximate wall time of the launch
	PID          int       `json:"pid"`
	TID          int       `json:"tid"`
	Operation    string    `json:"operation"`
	Error        int32     `json:"error_code"`  // 0 when not seen (anonymous mode)
	DurationNs   uint64    `json:"duration_ns"` // host-side latency; 0 when not timed
	Function     uint64    `json:"function"`
	Stream       string    `json:"stream"`
	GridBlocks   uint64    `json:"grid_blocks"`
	BlockThreads uint64    `json:"block_threads"`
	SharedBytes  uint64    `json:"shared_bytes"`
}

// Xid is one Xid error of the kernel log with what was on its GPU when the
// agent read it (the blast radius).
type Xid struct {
	// Source: "kernel_log" (an Xid line) or "nvml" (an NVML XID event,
	// counted where the kernel log is not read: no sequence number, bus
	// id or driver text).
	Source   string        `json:"source"`
	Seq      uint64        `json:"seq"`       // kernel log sequence number: the identity counted once
	Uptime   time.Duration `json:"uptime_ns"` // kernel time since boot of the record
	Time     time.Time     `json:"time"`      // when the agent read it
	Code     uint32        `json:"xid"`
	PCIBusID string        `json:"pci_bus_id"`
	GPU      int           `json:"gpu"`      // NVML index; -1 when no GPU has that bus id
	GPUUUID  string        `json:"gpu_uuid"` // "" when unknown
	// DriverPID and DriverName are the process the driver's line names.
	DriverPID  uint32 `json:"driver_pid,omitempty"`
	DriverName string `json:"driver_name,omitempty"`
	Detail     string `json:"detail,omitempty"`
	// Processes are the processes on that GPU at that moment (profiled
	// ones with their labels; NVML's compute processes), with their CUDA
	// and NCCL calls in flight as of the agent's last drain.
	Processes []XidProcess `json:"processes"`
}

// XidProcess is a process on the GPU of an Xid.
type XidProcess struct {
	PID       int    `json:"pid"`
	Comm      string `json:"comm,omitempty"`
	Namespace string `json:"namespace,omitempty"`
	Pod       string `json:"pod,omitempty"`
	Container string `json:"container,omitempty"`
	GPUUUID   string `json:"gpu_uuid,omitempty"`
	// NCCLInFlight: the age in seconds of its oldest in-flight NCCL call,
	// by operation.
	NCCLInFlight map[string]float64 `json:"nccl_inflight,omitempty"`
	// CUDAInFlight: the age in seconds (host time since the call entered)
	// of its oldest timed CUDA call in progress, by operation; -1 when the
	// call's start was not sampled (--sample-rate).
	CUDAInFlight map[string]float64 `json:"cuda_inflight,omitempty"`
}

// ProbeLinks are what the probes' links cost the node against the link
// caps (docs/OPERATIONS.md, "Descriptors and teardown").
type ProbeLinks struct {
	Links       int `json:"links"`
	Descriptors int `json:"descriptors"`
	// Releasing are links being released in the background (counted
	// above too).
	Releasing      int `json:"releasing"`
	MaxDescriptors int `json:"max_descriptors"` // --max-probe-descriptors; 0: no cap
	// LinkReleaseSeconds is the time one link takes to go, measured at
	// start and by each release since; 0: not known, the teardown cap
	// is not applied yet.
	LinkReleaseSeconds float64 `json:"link_release_seconds"`
	// TeardownSeconds is the estimated time to release every link;
	// MaxTeardownSeconds its cap (--max-teardown; 0: none).
	TeardownSeconds    float64 `json:"teardown_estimate_seconds"`
	MaxTeardownSeconds float64 `json:"max_teardown_seconds"`
	// LastRelease is the last batch of links released in the background
	// and how long it took; nil before the first.
	LastRelease *LinkRelease `json:"last_release,omitempty"`
	// Tenants are what each tenant (pod, else cgroup) holds, most
	// descriptors first: the files its processes map and their links (a
	// file several tenants map counts for each).
	Tenants []TenantLinks `json:"tenants,omitempty"`
}

// TenantLinks are one tenant's share of the attach budget.
type TenantLinks struct {
	Tenant      string `json:"tenant"`
	Files       int    `json:"files"`
	Links       int    `json:"links"`
	Descriptors int    `json:"descriptors"`
}

// LinkRelease is a batch of links released and its time.
type LinkRelease struct {
	Links   int     `json:"links"`
	Seconds float64 `json:"seconds"`
}

// FileDescriptors are the agent's descriptors in use and its limit.
type FileDescriptors struct {
	Open  int    `json:"open"`
	Limit uint64 `json:"limit"`
}

// PodCgroups is what the agent's last scan for pod cgroups found.
type PodCgroups struct {
	Dir      string    `json:"dir"`  // the host's cgroup v2 hierarchy as the agent reads it
	Pods     int       `json:"pods"` // pod cgroups in tenant_roots
	LastScan time.Time `json:"last_scan"`
	Error    string    `json:"error,omitempty"`
}
