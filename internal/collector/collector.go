package collector

import (
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/profi-dev/profi/internal/aggregate"
	"github.com/profi-dev/profi/internal/attach"
	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/budget"
	"github.com/profi-dev/profi/internal/discover"
	"github.com/profi-dev/profi/internal/k8s"
)

// Label sets of docs/INTERFACE.md 5.1, in order.
var (
	counterLabels = []string{"operation", "pid", "comm", "namespace", "pod", "container", "gpu", "gpu_uuid", "stream"}
	histLabels    = []string{"operation", "namespace", "pod", "gpu"}
	memcpyLabels  = []string{"direction", "pid", "comm", "namespace", "pod", "container", "gpu", "gpu_uuid", "stream"}
	memLabels     = []string{"pid", "comm", "namespace", "pod", "container", "gpu", "gpu_uuid"}
	// procLabels: per-process data without a GPU (on its first entry).
	procLabels   = []string{"pid", "comm", "namespace", "pod", "container"}
	kernelLabels = []string{"kernel", "pid", "comm", "namespace", "pod", "container", "gpu", "gpu_uuid", "kernel_class", "phase"}
	errorLabels  = []string{"operation", "pid", "comm", "namespace", "pod", "container", "gpu", "gpu_uuid", "error_code"}
	kHistLabels  = []string{"kernel", "namespace", "pod", "gpu", "kernel_class", "phase"}
	ncclLabels   = []string{"operation", "pid", "comm", "namespace", "pod", "container", "gpu", "gpu_uuid"}
	// Additions: per-communicator families, joinable across nodes by communicator.
	commLabels     = []string{"operation", "pid", "communicator"}
	commInfoLabels = []string{"pid", "comm", "communicator", "rank", "nranks", "namespace", "pod", "gpu"}
	// rankLabels name a rank across the fleet: node is the agent's own,
	// since one Prometheus compares the ranks of every node.
	rankLabels = []string{"communicator", "rank", "nranks", "node", "namespace", "pod", "container", "pid"}
)

// Libraries reported by profi_system_discovery_attached_libraries, always
// all of them so a missing series never means "unknown".
var libraries = []discover.Library{discover.LibCudart, discover.LibCuda, discover.LibNCCL, discover.LibNVTX}

// Data are the sources a scrape reads.
type Data struct {
	Snapshot func() *aggregate.Snapshot
	Attach   func() attach.Counters
	Started  time.Time
	// NameFailures returns kernel name resolve failures by reason; may be nil.
	NameFailures func() map[string]uint64
	// LaunchEvents counts --detailed-launches events; nil when off.
	LaunchEvents func() uint64
	// MapCapacity is max_entries of the aggregation maps, by map label.
	MapCapacity map[string]uint32
	// Budget is the overhead estimate of --overhead-budget; nil when off.
	Budget func() *budget.Stats
	// Kubernetes is the pod watch state; nil without --node-name.
	Kubernetes func() k8s.Status
	// GPURejected counts environment entries not believed as gpu_uuid
	// values (gpu.Labeler.Rejected); may be nil.
	GPURejected func() uint64
	// Node is the node label of the NCCL rank families: --node-name, else
	// the host name.
	Node string
}

// Collector is the prometheus.Collector of profi's data families.
type Collector struct {
	data Data
	// pinned is the snapshot of the scrape in progress (Exposition), so
	// that the registry's families and the per-process ones come from
	// the same drain.
	pinned atomic.Pointer[aggregate.Snapshot]
	// procFamilies are the per-process families, by name; they bypass the
	// registry (series.go).
	procFamilies []*procFamily

	durations, kernelDurations                   latencyFamilies
	tracked, ringDrops, ringDropRate, cardDrops  *prometheus.Desc
	launchDrops, mapDrops, probeMisses           *prometheus.Desc
	tenantRefusals                               *prometheus.Desc
	attachFailures, attachedLibs, uptime, series *prometheus.Desc
	// The links' cost against the link caps (attach.LinkBudget).
	probeLinks, probeDescriptors, probeDescriptorsMax, teardownEstimate, teardownMax *prometheus.Desc
	processLayers                                                                    *prometheus.Desc
	scanProblems, loadSkips                                                          *prometheus.Desc
	mapEntries, mapCapacity, launchEvents                                            *prometheus.Desc
	nameFailures                                                                     *prometheus.Desc
	trapCost, hitCost, probeCPU, probeShare                                          *prometheus.Desc
	samplingRatio, pausedFiles                                                       *prometheus.Desc
	ncclCalls, ncclBytes, ncclHangs, ncclStale                                       *prometheus.Desc
	ncclOldest, ncclStraggler, ncclCommInfo                                          *prometheus.Desc
	ncclCommCalls, ncclCommBytes                                                     *prometheus.Desc
	ncclRankEntered, ncclRankReturned                                                *prometheus.Desc
	ncclDurations                                                                    latencyFamilies
	k8sSynced, k8sErrors, k8sPods                                                    *prometheus.Desc
	rejectedLabels, expiredSeries, coalesced                                         *prometheus.Desc
	limitRefusals, readFailures                                                      *prometheus.Desc
	switchGaps, switchGapTime                                                        *prometheus.Desc
	handoverWakeups                                                                  *prometheus.Desc
}

// tenantLabel is the tenant label of BPF's tenant id: its cgroup v2 id,
// pid:N for a process in the root cgroup (bpf/types.h TENANT_PID), other
// for the tenants past the aggregator's bound.
func tenantLabel(id uint64) string {
	const tenantPID = 1 << 63
	switch {
	case id == aggregate.OtherTenant:
		return "other"
	case id&tenantPID != 0:
		return "pid:" + strconv.FormatUint(id&^tenantPID, 10)
	}
	return strconv.FormatUint(id, 10)
}

// New returns the collector; it reads data only when scraped.
func New(data Data) *Collector {
	d := prometheus.NewDesc
	return &Collector{
		data:         data,
		procFamilies: procFamilies(),
		durations:    newLatencyFamilies("profi_cuda_duration", "timed CUDA calls", histLabels, bpfobj.LatencyBoundsNs[:]),
		tracked:      d("profi_tracked_pids", "Live processes with at least one attached CUDA/NCCL library.", nil, nil),
		ringDrops:    d("profi_dropped_events_total", "Ring-buffer reserve failures of the events ring buffer (--detailed-launches: one event per launch).", nil, nil),
		ringDropRate: d("profi_system_ring_buffer_drops_rate", "Ring-buffer drops per second over the last drain interval.", nil, nil),
		cardDrops:    d("profi_cardinality_limit_drops_total", "Label tuples refused because --max-time-series was reached; their data is dropped, never added to another series.", nil, nil),
		launchDrops:  d("profi_system_launch_agg_drops_total", "Failed inserts into the launch aggregation map (map full).", nil, nil),
		mapDrops:     d("profi_system_bpf_map_drops_total", "Failed inserts of live data into a BPF map (map full or update failure).", []string{"map"}, nil),
		tenantRefusals: d("profi_system_bpf_map_tenant_refusals_total", "New keys of a shared BPF map refused to a tenant (the node past the map's room and the tenant at its guarantee: docs/METRICS.md, \"Shares of the shared maps\"), each also counted in profi_system_bpf_map_drops_total{map=\"pid_quota\"}. tenant is the cgroup v2 id (pid:N for a process in the root cgroup, other for tenants past the first 256); namespace, pod and container those of one of its processes. Addition.",
			[]string{"map", "tenant", "namespace", "pod", "container"}, nil),
		probeMisses: d("profi_system_bpf_probe_misses_total", "Probe hits not counted on their own: a return without its entry (orphan_return: attached mid-call or evicted), a probed call inside another on the same thread (nested: counted once, as the outer call), a driver launch made by a runtime launch (runtime_to_driver: counted once, as the runtime launch).", []string{"reason"}, nil),
		attachFailures: d("profi_system_attach_failures_total", "Failed attaches by library and reason; symbol_not_found counts each missing symbol, probe_refused each function the kernel refuses a uprobe on, once per library file.",
			[]string{"library", "reason"}, nil),
		attachedLibs:        d("profi_system_discovery_attached_libraries", "Library files (dev/inode) with probes currently attached.", []string{"library"}, nil),
		probeLinks:          d("profi_system_probe_links", "Links the probes hold: every file's, the per-process sets of files a traced process maps, the full-mode upgrades and those being released. Addition.", nil, nil),
		probeDescriptors:    d("profi_system_probe_link_descriptors", "File descriptors the probes' links hold (two per classic uprobe, one per uprobe_multi link). Addition.", nil, nil),
		probeDescriptorsMax: d("profi_system_probe_link_descriptors_max", "The cap on profi_system_probe_link_descriptors (--max-probe-descriptors; 0: none): a new file or per-process set past it is not linked (profi_system_limit_refusals_total{limit=\"probe_descriptors\"}). Addition.", nil, nil),
		teardownEstimate:    d("profi_system_probe_teardown_estimate_seconds", "Estimated time to release every probe link at exit, from the time one link takes to go on this kernel (classic uprobes go one after the other). Addition.", nil, nil),
		teardownMax:         d("profi_system_probe_teardown_max_seconds", "The cap on profi_system_probe_teardown_estimate_seconds (--max-teardown; 0: none): a new file or per-process set past it is not linked (profi_system_limit_refusals_total{limit=\"teardown\"}). Addition.", nil, nil),
		processLayers: d("profi_system_process_layers", "1 for each layer (runtime, driver, nccl, nvtx) of each tracked process, by what profi sees of it: probed, static, partial, blind, unprobed or absent.",
			[]string{"pid", "layer", "state"}, nil),
		uptime:           d("profi_system_uptime_seconds", "Seconds since the agent started.", nil, nil),
		kernelDurations:  newLatencyFamilies("profi_cuda_kernel_duration", "kernel launch calls (full mode)", kHistLabels, bpfobj.KernelLatencyBoundsNs[:]),
		launchEvents:     d("profi_system_detailed_launch_events_total", "Launch events received with --detailed-launches (the latest are in /status).", nil, nil),
		mapEntries:       d("profi_system_bpf_map_entries", "Entries in a BPF aggregation map at the last drain (fill level; compare with profi_system_bpf_map_capacity).", []string{"map"}, nil),
		mapCapacity:      d("profi_system_bpf_map_capacity", "max_entries of a BPF aggregation map (--aggregated-size, --launch-agg-size).", []string{"map"}, nil),
		nameFailures:     d("profi_system_kernel_name_resolve_failures_total", "Kernel names that could not be read or resolved, by reason.", []string{"reason"}, nil),
		scanProblems:     d("profi_system_discovery_problems_total", "Per-process procfs problems seen by discovery (malformed or over-long maps lines, unreadable files, deleted libraries), counted on every scan.", nil, nil),
		loadSkips:        d("profi_system_library_load_checks_skipped_total", "Library-load events not checked at once (over 200 checks/s); those processes are found by the periodic rescan.", nil, nil),
		series:           d("profi_system_metric_handle_cache_size", "Label tuples currently exported (what --max-time-series bounds).", nil, nil),
		trapCost:         d("profi_system_trap_cost_seconds", "Cost of one uprobe trap, calibrated at start-up on a probe of the agent's own (--overhead-budget).", nil, nil),
		hitCost:          d("profi_system_probe_hit_cost_seconds", "Estimated cost of one probe hit: the trap cost plus the average run time of profi's BPF programs (--overhead-budget).", nil, nil),
		probeCPU:         d("profi_system_probe_overhead_seconds_total", "Estimated CPU time a process has spent in profi's probes (hits × cost per hit) since the agent first measured it (--overhead-budget).", []string{"pid"}, nil),
		probeShare:       d("profi_system_probe_overhead_ratio", "Estimated probe cost over the process's CPU time in the last duty cycle (10 s); compare with --overhead-budget.", []string{"pid"}, nil),
		samplingRatio:    d("profi_system_sampling_ratio", "Share of time a process's hot probes are attached (--overhead-budget); below 1 its launch, copy, memset and sync counts are estimates.", []string{"pid"}, nil),
		pausedFiles:      d("profi_system_duty_cycled_libraries", "Library files whose hot probes are detached right now by the overhead budget.", nil, nil),
		ncclCalls:        d("profi_nccl_calls_total", "NCCL calls: collectives, point-to-point, group and communicator calls, failed calls included.", ncclLabels, nil),
		ncclBytes:        d("profi_nccl_bytes_total", "NCCL payload bytes: element count x datatype size (the user buffer, not bytes on the wire; 0 for an unknown datatype).", ncclLabels, nil),
		ncclDurations:    newLatencyFamilies("profi_nccl_duration", "NCCL calls (enqueue time on the host: the call returns before the GPU runs the collective, except when it blocks)", histLabels, bpfobj.NCCLLatencyBoundsNs[:]),
		ncclHangs:        d("profi_nccl_hang_detected_total", "NCCL calls in flight for longer than --nccl-hang-timeout, each counted once.", []string{"operation", "pid"}, nil),
		ncclStale:        d("profi_nccl_stale_entries", "NCCL calls in flight right now for longer than --nccl-hang-timeout.", nil, nil),
		ncclOldest:       d("profi_nccl_oldest_inflight_seconds", "Age of the oldest NCCL call in flight, per process and operation; absent when none is.", []string{"operation", "pid"}, nil),
		ncclStraggler:    d("profi_nccl_straggler_ratio", "A process's p95 NCCL latency over the median p95 of the other processes of its communicator on this node, per operation, over the last --gc-interval window.", []string{"pid", "gpu", "gpu_uuid", "operation"}, nil),
		ncclCommInfo:     d("profi_nccl_communicator_info", "A communicator this process joined, as its init call described it: communicator is NCCL's hash of the unique id (the commHash of NCCL logs), the same on every rank and node.", commInfoLabels, nil),
		ncclCommCalls:    d("profi_nccl_communicator_calls_total", "NCCL calls per communicator (communicator=\"unknown\": created before profi attached).", commLabels, nil),
		ncclCommBytes:    d("profi_nccl_communicator_bytes_total", "NCCL payload bytes per communicator.", commLabels, nil),
		ncclRankEntered:  d("profi_nccl_rank_collectives_entered_total", "Collectives this rank called on the communicator since its init, the one in progress included: its position in the sequence every rank of the communicator walks in the same order. The rank below the others is the one they wait for (docs/METRICS.md). Only for communicators whose init profi saw.", rankLabels, nil),
		ncclRankReturned: d("profi_nccl_rank_collectives_returned_total", "Collectives of this rank on the communicator that returned to the caller: enqueued on the GPU stream (host time), not completed on the GPU.", rankLabels, nil),
		k8sSynced:        d("profi_system_k8s_pod_watch_synced", "1 once the pod watch (--node-name) has listed this node's pods; pod labels are empty before.", nil, nil),
		k8sErrors:        d("profi_system_k8s_pod_watch_errors_total", "Failed lists and watches of pods (the watch retries with backoff; the last error is in /status).", nil, nil),
		k8sPods:          d("profi_system_k8s_pods", "Pods of this node in the watch's cache.", nil, nil),
		rejectedLabels:   d("profi_system_rejected_label_values_total", "Label values taken from a process that were not believed or had to be cleaned: gpu_uuid (CUDA_VISIBLE_DEVICES/NVIDIA_VISIBLE_DEVICES entries not in NVIDIA's UUID format, values over 16 KiB), comm (invalid UTF-8, control characters).", []string{"label"}, nil),
		expiredSeries:    d("profi_system_retained_series_expired_total", "Series of exited processes dropped 15 minutes after the last process of their label set exited: latency histograms, and the folded pid=\"\" series of a container with no live process.", nil, nil),
		limitRefusals:    d("profi_system_limit_refusals_total", "Work refused at a bound that keeps one tenant from exhausting the agent (docs/SECURITY.md): graph_cycle, graph_depth, graph_nodes, graph_work, graph_node_work (CUDA graphs whose replays were not expanded, each once); attached_files_per_pid, attached_files (library files not attached at --max-attached-files-per-pid, --max-attached-files, each once while mapped).", []string{"limit"}, nil),
		readFailures:     d("profi_system_map_read_failures_total", "Drains that went on without a BPF map that could not be read after retries (nccl_comms: a walk aborted by concurrent deletions three times; the communicator table of the last drain was kept).", []string{"map"}, nil),
		switchGaps:       d("profi_system_probe_switch_gaps_total", "Switches of a library's probe links between one set for every process and per-process sets (--probe-traced-processes) that left its entry-only probes (anonymous-mode launches, ncclGroupStart, NVTX, kernel names) detached for a moment in the processes still probed: calls entering them then are not counted (docs/OPERATIONS.md, \"Traced processes\").", []string{"library"}, nil),
		switchGapTime:    d("profi_system_probe_switch_gap_seconds_total", "Total time the switches of profi_system_probe_switch_gaps_total left the entry-only probes detached: the window whose calls are not counted.", []string{"library"}, nil),
		coalesced:        d("profi_system_discovery_triggers_coalesced_total", "Library-load triggers merged into a discovery pass already due (triggered passes start at least 1 s apart).", nil, nil),
		handoverWakeups:  d("profi_system_handover_wakeups_total", "Runtime launch ops that BPF reported ready to hand over to the driver between discovery passes (ARCHITECTURE.md, \"One trap per launch\"): ran (the handover ran at once), rate_limited (over 20 runs a second: that file waits for the next pass).", []string{"result"}, nil),
	}
}

// Describe sends every descriptor, the per-process families' included:
// the registry never sees their series, but it refuses another collector
// with one of their names.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, f := range c.procFamilies {
		ch <- f.desc
	}
	for _, d := range []*prometheus.Desc{
		c.durations.bucket, c.durations.sum, c.durations.count, c.durations.hist, c.tracked, c.ringDrops, c.ringDropRate, c.cardDrops,
		c.launchDrops, c.mapDrops, c.tenantRefusals, c.probeMisses, c.attachFailures, c.attachedLibs, c.probeLinks, c.probeDescriptors, c.probeDescriptorsMax, c.teardownEstimate, c.teardownMax, c.processLayers, c.uptime, c.series, c.scanProblems, c.loadSkips,
		c.kernelDurations.bucket, c.kernelDurations.sum, c.kernelDurations.count, c.kernelDurations.hist,
		c.nameFailures, c.mapEntries, c.mapCapacity, c.launchEvents,
		c.trapCost, c.hitCost, c.probeCPU, c.probeShare, c.samplingRatio, c.pausedFiles,
		c.ncclCalls, c.ncclBytes, c.ncclHangs, c.ncclStale, c.ncclOldest, c.ncclStraggler, c.ncclCommInfo,
		c.ncclCommCalls, c.ncclCommBytes, c.ncclRankEntered, c.ncclRankReturned, c.k8sSynced, c.k8sErrors, c.k8sPods,
		c.rejectedLabels, c.expiredSeries, c.coalesced, c.limitRefusals, c.readFailures,
		c.switchGaps, c.switchGapTime, c.handoverWakeups,
		c.ncclDurations.bucket, c.ncclDurations.sum, c.ncclDurations.count, c.ncclDurations.hist,
	} {
		ch <- d
	}
}

// leLabels are the `le` values of the CUDA latency buckets, formatted as
// client libraries format bucket bounds.
// latencyFamilies are the four families that carry one BPF latency
// histogram: cumulative `*_bucket_total` counters per `le`, sum, count,
// and the same data as a native histogram.
type latencyFamilies struct {
	bucket, sum, count, hist *prometheus.Desc
	le                       []string  // `le` labels, "+Inf" last
	bounds                   []float64 // finite bounds, seconds
}

// newLatencyFamilies describes the families of prefix; subject names what
// is timed ("timed CUDA calls").
func newLatencyFamilies(prefix, subject string, labels []string, boundsNs []uint64) latencyFamilies {
	d := prometheus.NewDesc
	le, b := bounds(boundsNs)
	return latencyFamilies{
		bucket: d(prefix+"_bucket_total", "Latency of "+subject+": histogram buckets as cumulative counters per le."+hostSide, append(labels[:len(labels):len(labels)], "le"), nil),
		sum:    d(prefix+"_sum_seconds_total", "Sum of the latencies of "+subject+", seconds."+hostSide, labels, nil),
		count:  d(prefix+"_count_total", "Number of "+subject+" measured (scaled: an estimate under --sample-rate)."+hostSide, labels, nil),
		hist:   d(prefix+"_seconds", "Latency of "+subject+"."+hostSide, labels, nil),
		le:     le,
		bounds: b,
	}
}

// emit sends the four families for one label set from a histogram's
// non-cumulative buckets (the last one +Inf); one without buckets has
// all zero.
func (f latencyFamilies) emit(ch chan<- prometheus.Metric, labels []string, h *aggregate.Hist) {
	n := len(labels)
	cum := uint64(0)
	native := make(map[float64]uint64, len(f.bounds))
	for i := range f.le {
		if i < len(h.Buckets) {
			cum += h.Buckets[i]
		}
		ch <- prometheus.MustNewConstMetric(f.bucket, prometheus.CounterValue, float64(cum), append(labels[:n:n], f.le[i])...)
		if i < len(f.bounds) {
			native[f.bounds[i]] = cum
		}
	}
	sum := float64(h.SumNs) / 1e9
	ch <- prometheus.MustNewConstMetric(f.sum, prometheus.CounterValue, sum, labels...)
	ch <- prometheus.MustNewConstMetric(f.count, prometheus.CounterValue, float64(h.Count), labels...)
	ch <- prometheus.MustNewConstHistogram(f.hist, h.Count, sum, native, labels...)
}

const hostSide = " Host-side API latency (uprobe at entry to return), not GPU execution time."

// bounds turns nanosecond bucket bounds into `le` labels (plus "+Inf")
// and seconds.
func bounds(ns []uint64) ([]string, []float64) {
	var s []string
	var f []float64
	for _, n := range ns {
		sec := float64(n) / 1e9
		f = append(f, sec)
		s = append(s, strconv.FormatFloat(sec, 'g', -1, 64))
	}
	return append(s, "+Inf"), f
}

const (
	dropEventsRing   = bpfobj.DropEventsRing
	dropOrphanReturn = bpfobj.DropOrphanReturn
	dropNested       = bpfobj.DropNested
)

var mapDropNames = map[bpfobj.Drop]string{
	bpfobj.DropAggregated:   "aggregated",
	bpfobj.DropLaunchAgg:    "launch_agg",
	bpfobj.DropInflight:     "inflight",
	bpfobj.DropMallocSizes:  "malloc_sizes",
	bpfobj.DropPIDClaim:     "pid_claim",
	bpfobj.DropKernelRegs:   "kernel_regs",
	bpfobj.DropLibLoads:     "lib_loads",
	bpfobj.DropNCCLAgg:      "nccl_agg",
	bpfobj.DropNCCLInflight: "nccl_inflight",
	bpfobj.DropNVTXStack:    "nvtx_stack",
	bpfobj.DropGraphMaps:    "graph_nodes",
	bpfobj.DropGraphQuota:   "graph_quota",
	bpfobj.DropGraphReplays: "graph_replays",
	bpfobj.DropCapture:      "capture_streams",
	bpfobj.DropPIDQuota:     "pid_quota",
	bpfobj.DropRuntimeLearn: "rt_sites",
	bpfobj.DropNCCLComms:    "nccl_comms",
	bpfobj.DropThreadDevice: "thread_device",
	bpfobj.DropRuntimeMark:  "rt_launches",
	bpfobj.DropRuntimeText:  "rt_text",
	bpfobj.DropLaunchThread: "launch_threads",
	bpfobj.DropBreakerHit:   "breaker_hits",
}

// snapshot is the scrape's snapshot: the pinned one, else the latest.
func (c *Collector) snapshot() *aggregate.Snapshot {
	if s := c.pinned.Load(); s != nil {
		return s
	}
	return c.data.Snapshot()
}

// Collect builds every metric from the scrape's snapshot but the
// per-process families, which Exposition writes itself (series.go).
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	s := c.snapshot()
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}

	for _, p := range s.Exported() {
		if p.NCCL != nil {
			c.collectNCCL(ch, p)
		}
	}
	for k, h := range s.NCCLHists {
		c.ncclDurations.emit(ch, []string{k.Op, k.Namespace, k.Pod, k.GPU}, h)
	}
	gauge(c.ncclStale, float64(s.NCCLStale))
	for k, h := range s.Hists {
		c.durations.emit(ch, []string{k.Op, k.Namespace, k.Pod, k.GPU}, h)
	}
	for k, h := range s.KernelHists {
		c.kernelDurations.emit(ch, []string{k.Name, k.Namespace, k.Pod, k.GPU, k.Class, k.Phase}, h)
	}
	if c.data.NameFailures != nil {
		for reason, v := range c.data.NameFailures() {
			counter(c.nameFailures, v, reason)
		}
	}

	att := c.data.Attach()
	gauge(c.tracked, float64(len(att.TrackedPIDs)))
	for _, lib := range libraries {
		gauge(c.attachedLibs, float64(att.Attached[lib]), string(lib))
	}
	gauge(c.probeLinks, float64(att.Links.Links))
	gauge(c.probeDescriptors, float64(att.Links.Descriptors))
	gauge(c.probeDescriptorsMax, float64(att.Links.MaxDescriptors))
	gauge(c.teardownEstimate, att.Links.TeardownSeconds)
	gauge(c.teardownMax, att.Links.MaxTeardownSeconds)
	for pid, layers := range att.Layers {
		for _, l := range layers {
			gauge(c.processLayers, 1, strconv.Itoa(pid), l.Layer, l.State)
		}
	}
	counter(c.scanProblems, att.ScanProblems)
	counter(c.loadSkips, att.LoadChecksSkipped)
	counter(c.coalesced, att.TriggersCoalesced)
	counter(c.handoverWakeups, att.HandoverWakeups, "ran")
	counter(c.handoverWakeups, att.HandoverLimited, "rate_limited")
	var gpuRejected uint64
	if c.data.GPURejected != nil {
		gpuRejected = c.data.GPURejected()
	}
	counter(c.rejectedLabels, gpuRejected, "gpu_uuid")
	counter(c.rejectedLabels, s.RejectedComms, "comm")
	counter(c.expiredSeries, s.ExpiredSeries)
	counter(c.readFailures, s.ReadFailures["nccl_comms"], "nccl_comms")
	for limit, n := range Refusals(s, att) {
		counter(c.limitRefusals, n, limit)
	}
	for k, v := range att.Failures {
		counter(c.attachFailures, v, k[0], k[1])
	}
	for lib, g := range att.SwitchGaps {
		counter(c.switchGaps, g.Count, string(lib))
		ch <- prometheus.MustNewConstMetric(c.switchGapTime, prometheus.CounterValue, g.Time.Seconds(), string(lib))
	}

	if c.data.LaunchEvents != nil {
		counter(c.launchEvents, c.data.LaunchEvents())
	}
	gauge(c.mapEntries, float64(s.AggregatedKeys), "aggregated")
	gauge(c.mapEntries, float64(s.LaunchKeys), "launch_agg")
	for name, n := range c.data.MapCapacity {
		gauge(c.mapCapacity, float64(n), name)
	}
	counter(c.ringDrops, s.Drops[bpfobj.DropEventsRing])
	gauge(c.ringDropRate, s.RingDropRate)
	counter(c.cardDrops, s.CardinalityDrops)
	counter(c.launchDrops, s.Drops[bpfobj.DropLaunchAgg])
	for d, name := range mapDropNames {
		counter(c.mapDrops, s.Drops[d], name)
	}
	for _, t := range s.TenantRefusals {
		id := tenantLabel(t.Tenant)
		for m, n := range t.Refused {
			if n > 0 {
				counter(c.tenantRefusals, n, bpfobj.QuotaMapNames[m], id, t.Namespace, t.Pod, t.Container)
			}
		}
	}
	counter(c.probeMisses, s.Drops[bpfobj.DropOrphanReturn], "orphan_return")
	counter(c.probeMisses, s.Drops[bpfobj.DropNested], "nested")
	counter(c.probeMisses, s.Drops[bpfobj.DropRuntimeToDrv], "runtime_to_driver")
	gauge(c.uptime, time.Since(c.data.Started).Seconds())
	gauge(c.series, float64(s.Series))
	if c.data.Kubernetes != nil {
		k := c.data.Kubernetes()
		synced := 0.0
		if k.Synced {
			synced = 1
		}
		gauge(c.k8sSynced, synced)
		counter(c.k8sErrors, k.WatchErrors)
		gauge(c.k8sPods, float64(k.Pods))
	}
	if c.data.Budget != nil {
		b := c.data.Budget()
		gauge(c.trapCost, b.TrapCost.Seconds())
		gauge(c.hitCost, b.HitCost.Seconds())
		gauge(c.pausedFiles, float64(b.Paused))
		for pid, p := range b.Procs {
			l := strconv.Itoa(pid)
			ch <- prometheus.MustNewConstMetric(c.probeCPU, prometheus.CounterValue, p.Estimated.Seconds(), l)
			gauge(c.probeShare, p.Share, l)
			gauge(c.samplingRatio, p.Ratio, l)
		}
	}
}

// collectNCCL sends one process's NCCL families.
func (c *Collector) collectNCCL(ch chan<- prometheus.Metric, p *aggregate.Process) {
	m, n := p.Meta, p.NCCL
	pid := pidLabel(m.PID)
	send := func(d *prometheus.Desc, t prometheus.ValueType, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, t, v, labels...)
	}
	for op, v := range n.Calls {
		send(c.ncclCalls, prometheus.CounterValue, float64(v), op, pid, m.Comm, m.Namespace, m.Pod, m.Container, m.GPU, m.GPUUUID)
	}
	for op, v := range n.Bytes {
		send(c.ncclBytes, prometheus.CounterValue, float64(v), op, pid, m.Comm, m.Namespace, m.Pod, m.Container, m.GPU, m.GPUUUID)
	}
	for op, v := range n.Hangs {
		send(c.ncclHangs, prometheus.CounterValue, float64(v), op, pid)
	}
	for op, age := range n.Oldest {
		send(c.ncclOldest, prometheus.GaugeValue, age.Seconds(), op, pid)
	}
	for op, r := range n.Straggler {
		send(c.ncclStraggler, prometheus.GaugeValue, r, pid, m.GPU, m.GPUUUID, op)
	}
	infos := map[aggregate.Communicator]bool{}
	for co, v := range n.CommCalls {
		send(c.ncclCommCalls, prometheus.CounterValue, float64(v), co.Op, pid, co.Comm.ID)
		infos[co.Comm] = true
	}
	for co, v := range n.CommBytes {
		send(c.ncclCommBytes, prometheus.CounterValue, float64(v), co.Op, pid, co.Comm.ID)
	}
	for comm := range infos {
		if comm.Rank >= 0 && !p.Exited {
			send(c.ncclCommInfo, prometheus.GaugeValue, 1, pid, m.Comm, comm.ID, strconv.Itoa(comm.Rank), strconv.Itoa(comm.NRanks), m.Namespace, m.Pod, m.GPU)
		}
	}
	if p.Exited {
		return
	}
	for comm, s := range n.Ranks {
		l := []string{comm.ID, strconv.Itoa(comm.Rank), strconv.Itoa(comm.NRanks), c.data.Node, m.Namespace, m.Pod, m.Container, pid}
		send(c.ncclRankEntered, prometheus.CounterValue, float64(s.Entered), l...)
		send(c.ncclRankReturned, prometheus.CounterValue, float64(s.Returned), l...)
	}
}

// Refusals are the limit refusals of profi_system_limit_refusals_total and
// /status, by limit label; every label is present (0 when none).
func Refusals(s *aggregate.Snapshot, att attach.Counters) map[string]uint64 {
	r := map[string]uint64{}
	for _, reason := range []string{aggregate.GraphRefusedCycle, aggregate.GraphRefusedDepth, aggregate.GraphRefusedNodes, aggregate.GraphRefusedWork, aggregate.GraphRefusedNodeWork} {
		r["graph_"+reason] = s.GraphRefusals[reason]
	}
	for _, limit := range attach.Limits {
		r[limit] = att.LimitRefusals[limit]
	}
	return r
}
