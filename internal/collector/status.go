package collector

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/profi-dev/profi/internal/aggregate"
	"github.com/profi-dev/profi/internal/attach"
	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/config"
	"github.com/profi-dev/profi/internal/k8s"
	"github.com/profi-dev/profi/internal/nvml"
)

// StatusDoc is the JSON body of /status: where a user finds out what is
// attached and why something is not (`profi explain` reads it).
type StatusDoc struct {
	Version           string              `json:"version"`
	UptimeSeconds     float64             `json:"uptime_seconds"`
	KernelMode        string              `json:"kernel_mode"`
	ProbeProfile      string              `json:"probe_profile"`
	PIDFilter         int                 `json:"pid_filter"`
	BPFLoaded         bool                `json:"bpf_loaded"`
	AttachedLibraries []LibraryView       `json:"attached_libraries"`
	AttachFailures    []FailureView       `json:"attach_failures"`
	LoaderHooks       []attach.LoaderHook `json:"loader_hooks"`
	LastDiscovery     time.Time           `json:"last_discovery"`
	TrackedPIDs       []int               `json:"tracked_pids"`
	EventsProcessed   uint64              `json:"events_processed"`
	ExportedSeries    int                 `json:"exported_series"`
	Drops             map[string]uint64   `json:"drops"`
	LastDrain         time.Time           `json:"last_drain"`
	// AttachFailureTotals are profi_system_attach_failures_total by
	// library and reason, as "library/reason" (retried files included).
	AttachFailureTotals map[string]uint64 `json:"attach_failure_totals"`
	// Operations are the calls counted per operation, over the live
	// processes, launches and NCCL included.
	Operations map[string]uint64 `json:"operations"`
	// Processes is the per-process view: labels and live counters.
	Processes []ProcessStatus `json:"processes"`
	// Kubernetes is the pod watch state; absent without --node-name.
	Kubernetes *k8s.Status `json:"kubernetes,omitempty"`
	// KernelFeatures are the optional kernel features the agent uses.
	KernelFeatures *KernelFeatures `json:"kernel_features,omitempty"`
	// NVML is the GPU poller's state; absent with --disable-nvml.
	NVML *nvml.Status `json:"nvml,omitempty"`
	// RecentLaunches are the latest launches with --detailed-launches.
	RecentLaunches []aggregate.LaunchEvent `json:"recent_launches,omitempty"`
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
}

// LibraryView is an attached library file and the pods of its processes.
type LibraryView struct {
	attach.LibraryStatus
	// Pods are "namespace/pod" of the file's processes that have pod
	// labels; empty without --node-name.
	Pods []string `json:"pods"`
}

// FailureView is a library file whose attach failed, with the pods of its
// processes.
type FailureView struct {
	attach.FailureStatus
	Pods []string `json:"pods"`
}

// ProcessStatus is one process with data, as the aggregator labels it.
type ProcessStatus struct {
	PID       int    `json:"pid"`
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
	// Calls are counted calls by operation (streams summed, launches
	// included).
	Calls map[string]uint64 `json:"calls"`
	// Launches are kernel launches over all kernels.
	Launches uint64 `json:"launches"`
	// Errors are failed calls by operation.
	Errors map[string]uint64 `json:"errors"`
	// MemcpyBytes are copied bytes by direction.
	MemcpyBytes       map[string]uint64 `json:"memcpy_bytes"`
	MemsetBytes       uint64            `json:"memset_bytes"`
	ActiveMemoryBytes uint64            `json:"active_memory_bytes"`
	NCCLCalls         map[string]uint64 `json:"nccl_calls,omitempty"`
	NCCLBytes         map[string]uint64 `json:"nccl_bytes,omitempty"`
	// NCCLOldestInflightSeconds is the age of the oldest in-flight call
	// by operation.
	NCCLOldestInflightSeconds map[string]float64 `json:"nccl_oldest_inflight_seconds,omitempty"`
}

// Status assembles /status from the current state.
func Status(version string, cfg *config.Config, started time.Time, snap *aggregate.Snapshot, st attach.Status, c attach.Counters) StatusDoc {
	drops := map[string]uint64{
		"cardinality_limit": snap.CardinalityDrops,
		"events_ring":       snap.Drops[dropEventsRing],
		"orphan_return":     snap.Drops[dropOrphanReturn],
		"nested":            snap.Drops[dropNested],
		"runtime_to_driver": snap.Drops[bpfobj.DropRuntimeToDrv],
	}
	for d, name := range mapDropNames {
		drops[name] = snap.Drops[d]
	}
	tracked := c.TrackedPIDs
	if tracked == nil {
		tracked = []int{}
	}
	podOf := map[int]string{}
	procs := make([]ProcessStatus, 0, len(snap.Processes))
	ops := map[string]uint64{}
	for _, p := range snap.Processes {
		if p.Meta.Pod != "" {
			podOf[p.Meta.PID] = p.Meta.Namespace + "/" + p.Meta.Pod
		}
		ps := processStatus(p, cfg.NodeName != "")
		for op, n := range ps.Calls {
			ops[op] += n
		}
		for op, n := range ps.NCCLCalls {
			ops[op] += n
		}
		procs = append(procs, ps)
	}
	failTotals := map[string]uint64{}
	for k, v := range c.Failures {
		failTotals[k[0]+"/"+k[1]] = v
	}
	libs := make([]LibraryView, 0, len(st.Attached))
	for _, l := range st.Attached {
		libs = append(libs, LibraryView{LibraryStatus: l, Pods: podsOf(l.PIDs, podOf)})
	}
	fails := make([]FailureView, 0, len(st.Failed))
	for _, f := range st.Failed {
		fails = append(fails, FailureView{FailureStatus: f, Pods: podsOf(f.PIDs, podOf)})
	}
	hooks := st.LoaderHooks
	if hooks == nil {
		hooks = []attach.LoaderHook{}
	}
	return StatusDoc{
		Version:             version,
		UptimeSeconds:       time.Since(started).Seconds(),
		KernelMode:          cfg.KernelMode,
		ProbeProfile:        cfg.ProbeProfile,
		PIDFilter:           cfg.PID,
		BPFLoaded:           true,
		AttachedLibraries:   libs,
		AttachFailures:      fails,
		LoaderHooks:         hooks,
		LastDiscovery:       st.LastSync,
		TrackedPIDs:         tracked,
		EventsProcessed:     snap.Events,
		ExportedSeries:      snap.Series,
		Drops:               drops,
		LastDrain:           snap.Time,
		AttachFailureTotals: failTotals,
		Operations:          ops,
		Processes:           procs,
	}
}

// podsOf returns the distinct pods of pids, sorted; never nil.
func podsOf(pids []int, podOf map[int]string) []string {
	seen := map[string]bool{}
	out := []string{}
	for _, pid := range pids {
		if p, ok := podOf[pid]; ok && !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	sort.Strings(out)
	return out
}

func processStatus(p *aggregate.Process, podWatch bool) ProcessStatus {
	ps := ProcessStatus{
		PID: p.Meta.PID, Comm: p.Meta.Comm, Namespace: p.Meta.Namespace, Pod: p.Meta.Pod,
		Container: p.Meta.Container, GPU: p.Meta.GPU, GPUUUID: p.Meta.GPUUUID,
		Calls: map[string]uint64{}, Errors: map[string]uint64{}, MemcpyBytes: map[string]uint64{},
	}
	switch {
	case !podWatch:
		ps.PodSource = "none: no --node-name (pod enrichment off)"
	case p.Meta.Pod != "":
		ps.PodSource = "cgroup+pod-watch"
	default:
		ps.PodSource = "none: no kubelet pod cgroup, or the pod is not in this node's watch"
	}
	var srcs []string
	for _, g := range p.GPUs {
		ord := "no cudaSetDevice"
		if g.Ordinal >= 0 {
			ord = fmt.Sprintf("device %d", g.Ordinal)
		}
		srcs = append(srcs, ord+": "+g.Source)
	}
	ps.GPUSource = strings.Join(srcs, ", ")
	for k, v := range p.Calls {
		ps.Calls[k.Op] += v
	}
	for k, v := range p.Errors {
		ps.Errors[k.Op] += v
	}
	for k, v := range p.Memcpy {
		ps.MemcpyBytes[k.Direction] += v
	}
	for _, v := range p.Memset {
		ps.MemsetBytes += v
	}
	for _, l := range p.Launches {
		ps.Launches += l.Count
	}
	if p.HasMemory() {
		ps.ActiveMemoryBytes = p.ActiveBytes()
	}
	if n := p.NCCL; n != nil {
		ps.NCCLCalls, ps.NCCLBytes = map[string]uint64{}, map[string]uint64{}
		ps.NCCLOldestInflightSeconds = map[string]float64{}
		for k, v := range n.Calls {
			ps.NCCLCalls[k] = v
		}
		for k, v := range n.Bytes {
			ps.NCCLBytes[k] = v
		}
		for k, v := range n.Oldest {
			ps.NCCLOldestInflightSeconds[k] = v.Seconds()
		}
	}
	return ps
}
