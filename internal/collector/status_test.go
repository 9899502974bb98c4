package collector

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

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
		doc.UptimeSeconds, doc.Drops = 0, nil
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
			KernelFeatures: &status.KernelFeatures{},
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
	if want := (status.NVML{Reason: "not polled yet"}); doc.NVML == nil || *doc.NVML != want {
		t.Errorf("nvml = %v, want %v", doc.NVML, want)
	}
	if want := []status.LaunchEvent{{Time: at, PID: 10, Operation: "cudaLaunchKernel", GridBlocks: 64}}; !reflect.DeepEqual(doc.RecentLaunches, want) {
		t.Errorf("recent launches = %v, want %v", doc.RecentLaunches, want)
	}
}
