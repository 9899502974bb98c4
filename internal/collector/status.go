package collector

import (
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/profi-dev/profi/internal/aggregate"
	"github.com/profi-dev/profi/internal/attach"
	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/config"
	"github.com/profi-dev/profi/internal/k8s"
	"github.com/profi-dev/profi/internal/kmsg"
	"github.com/profi-dev/profi/internal/nvml"
	"github.com/profi-dev/profi/internal/status"
)

// StatusSource is every input of /status; Document assembles the
// document from them, in this one place.
type StatusSource struct {
	Version  string
	Config   *config.Config
	Started  time.Time
	Snapshot func() *aggregate.Snapshot
	Attach   func() attach.Status
	Counters func() attach.Counters
	// Features are the optional kernel features in use.
	Features status.KernelFeatures
	// RecentLaunches are the latest launch events; nil without
	// --detailed-launches.
	RecentLaunches func() []aggregate.LaunchEvent
	// Kubernetes is the pod watch state; nil without --node-name.
	Kubernetes func() k8s.Status
	// NVML is the GPU poller's latest snapshot; nil with --disable-nvml.
	NVML func() *nvml.Snapshot
	// FileDescriptors are the agent's descriptors (FileDescriptors); nil:
	// not reported.
	FileDescriptors func() (status.FileDescriptors, error)
	// Xids are the last Xid errors (xid.Tracker.Recent); nil when none are tracked.
	Xids func() []status.Xid
	// Quarantined are the crash breaker's quarantines; nil when it is off.
	Quarantined func() []status.Quarantine
	// KernelLog is the kernel log reader's state; nil when it is off.
	KernelLog func() kmsg.Stats
	// Tenant is the tenant a process's keys are admitted under
	// (pid_quotas); nil: not reported.
	Tenant func(pid int) (uint64, bool)
	// PodCgroups is what the scan for pod cgroups found; nil: none.
	PodCgroups func() *status.PodCgroups
}

// Document assembles /status from the current state.
func (s *StatusSource) Document() status.Doc {
	snap, st, c := s.Snapshot(), s.Attach(), s.Counters()
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
	layers := attach.Layers(st)
	procs := make([]status.ProcessStatus, 0, len(snap.Processes))
	ops := map[string]uint64{}
	// Kernels that ran per PID, over its entries (one per GPU).
	direct, graph := map[int]uint64{}, map[int]uint64{}
	var unknownReplays uint64
	for _, p := range snap.Processes {
		if p.Meta.Pod != "" {
			podOf[p.Meta.PID] = p.Meta.Namespace + "/" + p.Meta.Pod
		}
		ps := processStatus(p, s.Config.NodeName != "")
		ps.Layers = layers[p.Meta.PID]
		if s.Tenant != nil {
			ps.Tenant, _ = s.Tenant(p.Meta.PID)
		}
		for op, n := range ps.Calls {
			ops[op] += n
		}
		for op, n := range ps.NCCLCalls {
			ops[op] += n
		}
		direct[ps.PID] += ps.Launches
		graph[ps.PID] += ps.GraphKernelLaunches
		if ps.Graphs != nil {
			unknownReplays += ps.Graphs.UnknownReplays
		}
		procs = append(procs, ps)
	}
	var (
		busy    map[int]float64
		seconds map[int][]status.GPUBusy
		first   = map[int]bool{}
	)
	if s.NVML != nil {
		nv := s.NVML()
		busy, seconds = gpuBusy(nv), gpuSeconds(nv)
	}
	for i := range procs {
		if l := procs[i].Launching; l != nil {
			if b, ok := busy[procs[i].PID]; ok {
				l.GPUBusy = &b
			}
		}
		if !first[procs[i].PID] {
			first[procs[i].PID] = true
			procs[i].GPUBusy = seconds[procs[i].PID]
		}
		g := procs[i].Graphs
		if ran := direct[procs[i].PID] + graph[procs[i].PID]; g != nil && ran > 0 {
			share := float64(graph[procs[i].PID]) / float64(ran)
			g.GraphKernelShare = &share
		}
	}
	failTotals := map[string]uint64{}
	for k, v := range c.Failures {
		failTotals[k[0]+"/"+k[1]] = v
	}
	libs := make([]status.LibraryView, 0, len(st.Attached))
	for _, l := range st.Attached {
		libs = append(libs, status.LibraryView{LibraryStatus: l, Pods: podsOf(l.PIDs, podOf)})
	}
	fails := make([]status.FailureView, 0, len(st.Failed))
	for _, f := range st.Failed {
		fails = append(fails, status.FailureView{FailureStatus: f, Pods: podsOf(f.PIDs, podOf)})
	}
	hooks := append(make([]status.LoaderHook, 0, len(st.LoaderHooks)), st.LoaderHooks...)
	doc := status.Doc{
		Version:             s.Version,
		UptimeSeconds:       time.Since(s.Started).Seconds(),
		KernelMode:          s.Config.KernelMode,
		ProbeProfile:        s.Config.ProbeProfile,
		PIDFilter:           s.Config.PID,
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
		UnknownGraphReplays: unknownReplays,
		Refusals:            Refusals(snap, c),
	}
	if s.RecentLaunches != nil {
		doc.RecentLaunches = s.RecentLaunches()
	}
	if s.Kubernetes != nil {
		k := s.Kubernetes()
		doc.Kubernetes = &k
	}
	if s.Xids != nil {
		doc.Xids = s.Xids()
	}
	if s.NVML != nil {
		n := s.NVML().Status()
		doc.NVML = &n
	}
	features := s.Features
	doc.KernelFeatures = &features
	if s.KernelLog != nil {
		k := status.KernelLog(s.KernelLog())
		doc.KernelLog = &k
	}
	if s.PodCgroups != nil {
		doc.PodCgroups = s.PodCgroups()
	}
	links := st.ProbeLinks
	doc.ProbeLinks = &links
	if s.FileDescriptors != nil {
		if fds, err := s.FileDescriptors(); err == nil {
			doc.FileDescriptors = &fds
		}
	}
	doc.Quarantined = []status.Quarantine{}
	if s.Quarantined != nil {
		doc.Quarantined = s.Quarantined()
	}
	for _, q := range doc.Quarantined {
		if q.Library == "all" {
			doc.DegradedReasons = append(doc.DegradedReasons, fmt.Sprintf("every probe on the node is off (%s): %s", q.Reason, q.KernelLog))
			continue
		}
		where := "node-wide"
		if q.Scope == "tenant" {
			where = "for the tenant of the process"
		}
		doc.DegradedReasons = append(doc.DegradedReasons, fmt.Sprintf("probes of %s (%s, file %s) quarantined %s: process %d (%s) died of %s in the probes (%s) %.3f s after a probe hit",
			q.Library, q.Path, q.File, where, q.PID, q.Comm, q.Signal, strings.Join(q.Evidence, ", "), q.SinceHitSeconds))
	}
	// A file a cap refuses leaves the processes that map it unprobed there
	// (issue 47: a victim behind those who took every slot).
	if c.CappedFiles > 0 {
		doc.DegradedReasons = append(doc.DegradedReasons, fmt.Sprintf("%d library files not attached: a cap was reached (--max-attached-files %d, --max-attached-files-per-pid %d, --max-probe-descriptors %d, --max-teardown %s; profi_system_limit_refusals_total)",
			c.CappedFiles, s.Config.MaxAttachedFiles, s.Config.MaxAttachedFilesPerPID, c.Links.MaxDescriptors, s.Config.MaxTeardown))
	}
	doc.Degraded = len(doc.DegradedReasons) > 0
	return doc
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

func processStatus(p *aggregate.Process, podWatch bool) status.ProcessStatus {
	ps := status.ProcessStatus{
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
	for _, l := range p.Graph {
		ps.GraphKernelLaunches += l.Count
	}
	for _, l := range p.Captured {
		ps.CapturedLaunches += l.Count
	}
	if g := p.Graphs; g != nil {
		ps.Graphs = &status.Graphs{Graphs: g.Graphs, Execs: g.Execs, Replays: g.Replays, UnknownReplays: g.UnknownReplays, RefusedReplays: g.RefusedReplays}
	}
	if p.HasMemory() {
		ps.ActiveMemoryBytes = p.ActiveBytes()
	}
	if p.HoldsIdle() {
		idle := p.IdleFor.Seconds()
		ps.HeldIdleSeconds = &idle
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
		for c, s := range n.Ranks {
			ps.NCCLRanks = append(ps.NCCLRanks, status.NCCLRank{Communicator: c.ID, Rank: c.Rank, NRanks: c.NRanks, Entered: s.Entered, Returned: s.Returned})
		}
		slices.SortFunc(ps.NCCLRanks, func(a, b status.NCCLRank) int { return strings.Compare(a.Communicator, b.Communicator) })
	}
	if p.LaunchThreads > 0 || p.LaunchThreadCPU > 0 {
		l := &status.Launching{Threads: p.LaunchThreads, ThreadsUnsampled: p.LaunchThreadsUnsampled, CPUSeconds: p.LaunchThreadCPU.Seconds()}
		if b := p.LaunchBound; b != nil {
			l.Window = &status.LaunchWindow{Start: b.Start, End: b.End, BusiestTID: b.BusiestTID, BusiestShare: b.BusiestShare, LaunchRate: b.LaunchRate}
		}
		ps.Launching = l
	}
	return ps
}

// gpuSeconds is each PID's busy time per device since the agent started
// (nvml's integration of the driver's samples); nil without NVML.
func gpuSeconds(snap *nvml.Snapshot) map[int][]status.GPUBusy {
	if snap == nil {
		return nil
	}
	out := map[int][]status.GPUBusy{}
	for _, g := range snap.GPUs {
		for _, b := range g.ProcessBusy {
			out[int(b.PID)] = append(out[int(b.PID)], status.GPUBusy{UUID: b.UUID, SM: b.SM.Seconds(), Memory: b.Memory.Seconds(),
				Encoder: b.Encoder.Seconds(), Decoder: b.Decoder.Seconds()})
		}
	}
	return out
}

// gpuBusy is each PID's SM utilization at the last NVML poll, summed over
// its devices; nil without NVML.
func gpuBusy(snap *nvml.Snapshot) map[int]float64 {
	if snap == nil {
		return nil
	}
	out := map[int]float64{}
	for _, g := range snap.GPUs {
		for _, u := range g.ProcessUtilization {
			out[int(u.PID)] += u.SM
		}
	}
	return out
}

// FileDescriptors counts the agent's open descriptors and reads its
// limit (StatusSource.FileDescriptors).
func FileDescriptors() (status.FileDescriptors, error) {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		return status.FileDescriptors{}, fmt.Errorf("getrlimit: %w", err)
	}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return status.FileDescriptors{}, fmt.Errorf("count descriptors: %w", err)
	}
	return status.FileDescriptors{Open: len(ents), Limit: lim.Cur}, nil
}
