package collector

import (
	"encoding/json"
	"fmt"
	"reflect"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/profi-dev/profi/internal/aggregate"
	"github.com/profi-dev/profi/internal/attach"
	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/config"
	"github.com/profi-dev/profi/internal/k8s"
	"github.com/profi-dev/profi/internal/nvml"
	"github.com/profi-dev/profi/internal/status"
)

// source is a StatusSource over fixed values, without the optional parts.
func source(cfg *config.Config, started time.Time, snap *aggregate.Snapshot, st attach.Status, c attach.Counters) *StatusSource {
	return &StatusSource{
		Version:  "dev",
		Config:   cfg,
		Started:  started,
		Snapshot: func() *aggregate.Snapshot { return snap },
		Attach:   func() attach.Status { return st },
		Counters: func() attach.Counters { return c },
	}
}

func TestStatus(t *testing.T) {
	t.Parallel()
	cfg := &config.Config{KernelMode: "anonymous", ProbeProfile: "lean", PID: 4242}
	snap := &aggregate.Snapshot{
		Time:             time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		CardinalityDrops: 9,
		Series:           17,
		Events:           1234,
	}
	for i := range snap.Drops {
		snap.Drops[i] = uint64(i) + 1
	}
	lastSync := time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)
	st := attach.Status{
		Attached: []attach.LibraryStatus{{Library: "libcudart.so", Path: "/usr/lib/libcudart.so.12", File: "8:1/500", PIDs: []int{4242}}},
		Failed:   []attach.FailureStatus{{Library: "libcudart.so", Path: "/x", Reason: attach.ReasonNotELF, Attempts: 2}},
		LastSync: lastSync,
	}
	started := time.Now().Add(-time.Minute)

	t.Run("document", func(t *testing.T) {
		t.Parallel()
		src := source(cfg, started, snap, st, attach.Counters{TrackedPIDs: []int{4242}})
		src.Version = "v1.2.3"
		doc := src.Document()
		wantDrops := map[string]uint64{
			"cardinality_limit": 9,
			"aggregated":        uint64(bpfobj.DropAggregated) + 1,
			"launch_agg":        uint64(bpfobj.DropLaunchAgg) + 1,
			"inflight":          uint64(bpfobj.DropInflight) + 1,
			"malloc_sizes":      uint64(bpfobj.DropMallocSizes) + 1,
			"orphan_return":     uint64(bpfobj.DropOrphanReturn) + 1,
			"nested":            uint64(bpfobj.DropNested) + 1,
			"events_ring":       uint64(bpfobj.DropEventsRing) + 1,
			"pid_claim":         uint64(bpfobj.DropPIDClaim) + 1,
			"kernel_regs":       uint64(bpfobj.DropKernelRegs) + 1,
			"runtime_to_driver": uint64(bpfobj.DropRuntimeToDrv) + 1,
			"lib_loads":         uint64(bpfobj.DropLibLoads) + 1,
			"nccl_agg":          uint64(bpfobj.DropNCCLAgg) + 1,
			"nccl_inflight":     uint64(bpfobj.DropNCCLInflight) + 1,
			"nvtx_stack":        uint64(bpfobj.DropNVTXStack) + 1,
			"graph_nodes":       uint64(bpfobj.DropGraphMaps) + 1,
			"graph_quota":       uint64(bpfobj.DropGraphQuota) + 1,
			"graph_replays":     uint64(bpfobj.DropGraphReplays) + 1,
			"capture_streams":   uint64(bpfobj.DropCapture) + 1,
			"pid_quota":         uint64(bpfobj.DropPIDQuota) + 1,
			"rt_sites":          uint64(bpfobj.DropRuntimeLearn) + 1,
			"nccl_comms":        uint64(bpfobj.DropNCCLComms) + 1,
			"thread_device":     uint64(bpfobj.DropThreadDevice) + 1,
			"rt_text":           uint64(bpfobj.DropRuntimeText) + 1,
			"launch_threads":    uint64(bpfobj.DropLaunchThread) + 1,
			"breaker_hits":      uint64(bpfobj.DropBreakerHit) + 1,
			"rt_launches":       uint64(bpfobj.DropRuntimeMark) + 1,
		}
		if !reflect.DeepEqual(doc.Drops, wantDrops) {
			t.Errorf("Drops = %v, want %v", doc.Drops, wantDrops)
		}
		if len(doc.Drops) != int(bpfobj.NumDrops)+1 {
			t.Errorf("%d drop counters, want every BPF drop counter plus cardinality_limit (%d)", len(doc.Drops), int(bpfobj.NumDrops)+1)
		}
		if doc.UptimeSeconds < 60 {
			t.Errorf("UptimeSeconds = %v, want at least 60", doc.UptimeSeconds)
		}
		if want := map[string]uint64{"graph_cycle": 0, "graph_depth": 0, "graph_nodes": 0, "graph_work": 0, "graph_node_work": 0, "attached_files_per_pid": 0, "attached_files": 0, "probe_descriptors": 0, "teardown": 0}; !reflect.DeepEqual(doc.Refusals, want) {
			t.Errorf("Refusals = %v, want %v", doc.Refusals, want)
		}
		doc.UptimeSeconds, doc.Drops, doc.Refusals = 0, nil, nil
		want := status.Doc{
			Version: "v1.2.3", KernelMode: "anonymous", ProbeProfile: "lean", PIDFilter: 4242, BPFLoaded: true,
			AttachedLibraries: []status.LibraryView{{LibraryStatus: status.LibraryStatus{
				Library: "libcudart.so", Path: "/usr/lib/libcudart.so.12", File: "8:1/500", PIDs: []int{4242},
			}, Pods: []string{}}},
			AttachFailures: []status.FailureView{{FailureStatus: status.FailureStatus{
				Library: "libcudart.so", Path: "/x", Reason: attach.ReasonNotELF, Attempts: 2,
			}, Pods: []string{}}},
			LoaderHooks: []status.LoaderHook{}, LastDiscovery: lastSync,
			TrackedPIDs: []int{4242}, EventsProcessed: 1234, ExportedSeries: 17, LastDrain: snap.Time,
			AttachFailureTotals: map[string]uint64{}, Operations: map[string]uint64{}, Processes: []status.ProcessStatus{},
			KernelFeatures: &status.KernelFeatures{}, Quarantined: []status.Quarantine{}, ProbeLinks: &status.ProbeLinks{},
		}
		if !reflect.DeepEqual(doc, want) {
			t.Errorf("Status =\n%+v\nwant\n%+v", doc, want)
		}
	})

	t.Run("json keys", func(t *testing.T) {
		t.Parallel()
		// No tracked process: an empty list, never null.
		src := source(cfg, started, snap, attach.Status{}, attach.Counters{})
		b, err := json.Marshal(src.Document())
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		// docs/INTERFACE.md 4: at least these.
		for _, k := range []string{"attached_libraries", "tracked_pids", "events_processed", "uptime_seconds", "kernel_mode"} {
			if _, ok := m[k]; !ok {
				t.Errorf("/status lacks %q: %s", k, b)
			}
		}
		if string(m["tracked_pids"]) != "[]" || string(m["kernel_mode"]) != `"anonymous"` || string(m["events_processed"]) != "1234" {
			t.Errorf("tracked_pids %s, kernel_mode %s, events_processed %s", m["tracked_pids"], m["kernel_mode"], m["events_processed"])
		}
	})
}

// TestStatusProcesses checks the per-process view explain reads and the
// pods of each library, against a snapshot with known numbers.
func TestStatusProcesses(t *testing.T) {
	t.Parallel()
	cfg := &config.Config{KernelMode: "anonymous", ProbeProfile: "lean", NodeName: "node-1"}
	p := &aggregate.Process{
		Meta: aggregate.Meta{PID: 10, Comm: "infer", Namespace: "ml", Pod: "llm-0", Container: "server"},
		Calls: map[aggregate.OpStream]uint64{
			{Op: "cudaLaunchKernel", Stream: "default"}: 70, {Op: "cudaLaunchKernel", Stream: "0x10"}: 30,
			{Op: "cudaMemcpy", Stream: "default"}: 4,
		},
		Errors:   map[aggregate.OpCode]uint64{{Op: "cudaMemcpy", Code: "1"}: 1, {Op: "cudaMemcpy", Code: "2"}: 2},
		Memcpy:   map[aggregate.DirStream]uint64{{Direction: "HostToDevice", Stream: "default"}: 4096, {Direction: "HostToDevice", Stream: "0x10"}: 1},
		Memset:   map[aggregate.OpStream]uint64{{Op: "cudaMemset", Stream: "default"}: 8},
		Launches: map[aggregate.Kernel]aggregate.Launch{{Name: "anonymous", Class: "other"}: {Count: 100}},
		NCCL: &aggregate.NCCL{
			Calls:  map[string]uint64{"ncclAllReduce": 5},
			Bytes:  map[string]uint64{"ncclAllReduce": 5 << 20},
			Oldest: map[string]time.Duration{"ncclAllReduce": 1500 * time.Millisecond},
		},
	}
	bare := &aggregate.Process{Meta: aggregate.Meta{PID: 11, Comm: "host"}, Calls: map[aggregate.OpStream]uint64{{Op: "cudaFree", Stream: "default"}: 2}}
	snap := &aggregate.Snapshot{Processes: []*aggregate.Process{p, bare}}
	st := attach.Status{Attached: []attach.LibraryStatus{{Library: "libcudart.so", PIDs: []int{10, 11, 12}}}}
	src := source(cfg, time.Now(), snap, st, attach.Counters{Failures: map[[2]string]uint64{{"libcudart.so", "not_elf"}: 3}})
	doc := src.Document()

	if got := doc.AttachedLibraries[0].Pods; !reflect.DeepEqual(got, []string{"ml/llm-0"}) {
		t.Errorf("library pods = %v, want [ml/llm-0]", got)
	}
	if want := map[string]uint64{"libcudart.so/not_elf": 3}; !reflect.DeepEqual(doc.AttachFailureTotals, want) {
		t.Errorf("attach failure totals = %v, want %v", doc.AttachFailureTotals, want)
	}
	if want := map[string]uint64{"cudaLaunchKernel": 100, "cudaMemcpy": 4, "cudaFree": 2, "ncclAllReduce": 5}; !reflect.DeepEqual(doc.Operations, want) {
		t.Errorf("operations = %v, want %v", doc.Operations, want)
	}
	// Both processes map the attached libcudart only.
	layers := []status.Layer{{Layer: "runtime", State: "probed"}, {Layer: "driver", State: "absent"},
		{Layer: "nccl", State: "absent"}, {Layer: "nvtx", State: "absent"}}
	want := []status.ProcessStatus{{
		PID: 10, Comm: "infer", Layers: layers, Namespace: "ml", Pod: "llm-0", Container: "server", PodSource: "cgroup+pod-watch",
		Calls:       map[string]uint64{"cudaLaunchKernel": 100, "cudaMemcpy": 4},
		Launches:    100,
		Errors:      map[string]uint64{"cudaMemcpy": 3},
		MemcpyBytes: map[string]uint64{"HostToDevice": 4097}, MemsetBytes: 8,
		NCCLCalls: map[string]uint64{"ncclAllReduce": 5}, NCCLBytes: map[string]uint64{"ncclAllReduce": 5 << 20},
		NCCLOldestInflightSeconds: map[string]float64{"ncclAllReduce": 1.5},
	}, {
		PID: 11, Comm: "host", Layers: layers, PodSource: "none: no kubelet pod cgroup, or the pod is not in this node's watch",
		Calls: map[string]uint64{"cudaFree": 2}, Errors: map[string]uint64{}, MemcpyBytes: map[string]uint64{},
	}}
	if !reflect.DeepEqual(doc.Processes, want) {
		t.Errorf("processes =\n%+v\nwant\n%+v", doc.Processes, want)
	}
}

// TestStatusOptionalParts checks the parts that only some flags turn on:
// each is absent when its source is nil and copied when it is set.
func TestStatusOptionalParts(t *testing.T) {
	t.Parallel()
	cfg := &config.Config{KernelMode: "anonymous"}
	src := source(cfg, time.Now(), &aggregate.Snapshot{}, attach.Status{}, attach.Counters{})
	src.Features = status.KernelFeatures{ExitHook: true}
	doc := src.Document()
	if doc.Kubernetes != nil || doc.NVML != nil || doc.RecentLaunches != nil {
		t.Errorf("optional parts without sources: kubernetes %v, nvml %v, recent launches %v", doc.Kubernetes, doc.NVML, doc.RecentLaunches)
	}
	if doc.KernelFeatures == nil || *doc.KernelFeatures != src.Features {
		t.Errorf("kernel features = %v, want %v", doc.KernelFeatures, src.Features)
	}

	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	src.Kubernetes = func() k8s.Status { return k8s.Status{NodeName: "node-1", Synced: true, Pods: 3} }
	src.NVML = func() *nvml.Snapshot { return nil } // not polled yet
	src.RecentLaunches = func() []aggregate.LaunchEvent {
		return []aggregate.LaunchEvent{{Time: at, PID: 10, Operation: "cudaLaunchKernel", GridBlocks: 64}}
	}
	doc = src.Document()
	if want := (status.Kubernetes{NodeName: "node-1", Synced: true, Pods: 3}); doc.Kubernetes == nil || *doc.Kubernetes != want {
		t.Errorf("kubernetes = %v, want %v", doc.Kubernetes, want)
	}
	if want := (status.NVML{Reason: "not polled yet"}); doc.NVML == nil || !reflect.DeepEqual(*doc.NVML, want) {
		t.Errorf("nvml = %v, want %v", doc.NVML, want)
	}
	if want := []status.LaunchEvent{{Time: at, PID: 10, Operation: "cudaLaunchKernel", GridBlocks: 64}}; !reflect.DeepEqual(doc.RecentLaunches, want) {
		t.Errorf("recent launches = %v, want %v", doc.RecentLaunches, want)
	}
}

// TestStatusGraphs checks the CUDA graph view: per entry the kernels graph
// replays ran and the captured launch calls, on the first entry the
// process's graphs with the share of its kernels (over every GPU) that ran
// through graphs, and the node's replays of graphs built before attach.
func TestStatusGraphs(t *testing.T) {
	t.Parallel()
	kern := func(counts ...uint64) map[aggregate.Kernel]aggregate.Launch {
		m := map[aggregate.Kernel]aggregate.Launch{}
		for i, n := range counts {
			m[aggregate.Kernel{Name: fmt.Sprintf("k%d", i), Class: "other"}] = aggregate.Launch{Count: n}
		}
		return m
	}
	// pid 10 on two GPUs: 100+50 direct launches, 200+100+150 graph
	// kernels: 450 of 600 kernels through graphs.
	gpu0 := &aggregate.Process{
		Meta:     aggregate.Meta{PID: 10, Comm: "infer", GPU: "0"},
		Launches: kern(100), Graph: kern(200, 100), Captured: kern(12),
		Graphs: &aggregate.GraphStats{Graphs: 5, Execs: 4, Replays: 1200, UnknownReplays: 200, Kernels: 450},
	}
	gpu1 := &aggregate.Process{Meta: aggregate.Meta{PID: 10, Comm: "infer", GPU: "1"}, Launches: kern(50), Graph: kern(150)}
	// pid 11 replayed only graphs instantiated before attach: no kernel counted.
	early := &aggregate.Process{Meta: aggregate.Meta{PID: 11, Comm: "early"}, Graphs: &aggregate.GraphStats{Execs: 0, Replays: 7, UnknownReplays: 7}}
	// pid 12 used no graph.
	eager := &aggregate.Process{Meta: aggregate.Meta{PID: 12, Comm: "eager"}, Launches: kern(9)}
	snap := &aggregate.Snapshot{Processes: []*aggregate.Process{gpu0, gpu1, early, eager}}
	doc := source(&config.Config{}, time.Now(), snap, attach.Status{}, attach.Counters{}).Document()

	if doc.UnknownGraphReplays != 207 {
		t.Errorf("unknown graph replays %d, want 207", doc.UnknownGraphReplays)
	}
	share := 0.75
	type view struct {
		Launches, Graph, Captured uint64
		Graphs                    *status.Graphs
	}
	want := []view{
		{100, 300, 12, &status.Graphs{Graphs: 5, Execs: 4, Replays: 1200, UnknownReplays: 200, GraphKernelShare: &share}},
		{50, 150, 0, nil},
		{0, 0, 0, &status.Graphs{Replays: 7, UnknownReplays: 7}},
		{9, 0, 0, nil},
	}
	if len(doc.Processes) != len(want) {
		t.Fatalf("%d entries, want %d", len(doc.Processes), len(want))
	}
	for i, w := range want {
		ps := doc.Processes[i]
		got := view{ps.Launches, ps.GraphKernelLaunches, ps.CapturedLaunches, ps.Graphs}
		if !reflect.DeepEqual(got, w) {
			t.Errorf("entry %d (pid %d gpu %q) = %+v graphs %+v, want %+v graphs %+v", i, ps.PID, ps.GPU, got, got.Graphs, w, w.Graphs)
		}
	}

	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Unknown   json.RawMessage              `json:"unknown_graph_replays"`
		Processes []map[string]json.RawMessage `json:"processes"`
	}
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if string(m.Unknown) != "207" {
		t.Errorf("unknown_graph_replays %s, want 207", m.Unknown)
	}
	p0 := m.Processes[0]
	if got := string(p0["graphs"]); got != `{"graphs":5,"execs":4,"replays":1200,"unknown_replays":200,"graph_kernel_share":0.75}` {
		t.Errorf("graphs %s", got)
	}
	if string(p0["graph_kernel_launches"]) != "300" || string(p0["captured_launches"]) != "12" || string(p0["launches"]) != "100" {
		t.Errorf("launches %s, graph_kernel_launches %s, captured_launches %s, want 100, 300, 12", p0["launches"], p0["graph_kernel_launches"], p0["captured_launches"])
	}
	if got := string(m.Processes[2]["graphs"]); got != `{"graphs":0,"execs":0,"replays":7,"unknown_replays":7}` {
		t.Errorf("graphs of a process that ran no kernel: %s, want no graph_kernel_share", got)
	}
	for _, i := range []int{1, 3} {
		if g, ok := m.Processes[i]["graphs"]; ok {
			t.Errorf("entry %d has graphs %s, want none (not the first entry, or no graph)", i, g)
		}
	}
}

// TestStatusDegraded: a quarantine is listed as it came and makes the node
// degraded, with one reason naming the file, the process and the signal.
func TestStatusDegraded(t *testing.T) {
	t.Parallel()
	cfg := &config.Config{KernelMode: "anonymous"}
	src := source(cfg, time.Now(), &aggregate.Snapshot{}, attach.Status{}, attach.Counters{})
	if doc := src.Document(); doc.Degraded || doc.DegradedReasons != nil || doc.Quarantined == nil || len(doc.Quarantined) != 0 {
		t.Fatalf("without a breaker: degraded %v %q, quarantined %v; want false, none, []", doc.Degraded, doc.DegradedReasons, doc.Quarantined)
	}
	q := status.Quarantine{Library: "libcudart.so", Path: "/lib/libcudart.so.12", File: "8:1/7", Reason: "sigsegv", Scope: "tenant", Evidence: []string{"out_of_line_page"}, PID: 42, Comm: "train",
		Signal: "SIGSEGV", SinceHitSeconds: 0.0015, PIDs: []int{42, 43}}
	src.Quarantined = func() []status.Quarantine { return []status.Quarantine{q} }
	doc := src.Document()
	want := []string{"probes of libcudart.so (/lib/libcudart.so.12, file 8:1/7) quarantined for the tenant of the process: process 42 (train) died of SIGSEGV in the probes (out_of_line_page) 0.002 s after a probe hit"}
	if !doc.Degraded || !reflect.DeepEqual(doc.DegradedReasons, want) || !reflect.DeepEqual(doc.Quarantined, []status.Quarantine{q}) {
		t.Errorf("degraded %v %q, quarantined %+v; want true %q, %+v", doc.Degraded, doc.DegradedReasons, doc.Quarantined, want, q)
	}
	// Files a cap refuses (issue 47): degraded, with the caps.
	capped := source(&config.Config{KernelMode: "anonymous", MaxAttachedFiles: 1024, MaxAttachedFilesPerPID: 64}, time.Now(), &aggregate.Snapshot{}, attach.Status{}, attach.Counters{CappedFiles: 3})
	want = []string{"3 library files not attached: a cap was reached (--max-attached-files 1024, --max-attached-files-per-pid 64, --max-probe-descriptors 0, --max-teardown 0s; profi_system_limit_refusals_total)"}
	if doc := capped.Document(); !doc.Degraded || !reflect.DeepEqual(doc.DegradedReasons, want) {
		t.Errorf("with capped files: degraded %v %q, want true %q", doc.Degraded, doc.DegradedReasons, want)
	}
}

// FileDescriptors counts exactly: ten more descriptors (five pipes) are
// ten more open, and the limit is RLIMIT_NOFILE's soft limit.
func TestFileDescriptors(t *testing.T) {
	before, err := FileDescriptors()
	if err != nil {
		t.Fatal(err)
	}
	var fds [5][2]int
	for i := range fds {
		if err := unix.Pipe2(fds[i][:], unix.O_CLOEXEC); err != nil {
			t.Fatal(err)
		}
	}
	after, err := FileDescriptors()
	for i := range fds {
		unix.Close(fds[i][0])
		unix.Close(fds[i][1])
	}
	if err != nil {
		t.Fatal(err)
	}
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if after.Open != before.Open+10 || after.Limit != lim.Cur {
		t.Errorf("before %+v, after 5 pipes %+v; want open +10, limit %d", before, after, lim.Cur)
	}
}
