package collector

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/profi-dev/profi/internal/aggregate"
	"github.com/profi-dev/profi/internal/attach"
	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/discover"
	"github.com/profi-dev/profi/internal/ops"
	"github.com/profi-dev/profi/internal/testutil/promtest"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("output differs from %s (go test -update rewrites it):\n%s", path, lineDiff(string(want), string(got)))
	}
}

// lineDiff lists the lines only in want (-) or only in got (+).
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	for _, l := range w {
		if !slices.Contains(g, l) {
			b.WriteString("- " + l + "\n")
		}
	}
	for _, l := range g {
		if !slices.Contains(w, l) {
			b.WriteString("+ " + l + "\n")
		}
	}
	if b.Len() == 0 {
		return "(same lines, different order)"
	}
	return b.String()
}

// fakeSource and fakeProcs let the real aggregator build a Process whose
// memory series are admitted: that flag is not settable from outside the
// aggregate package.
type fakeSource struct{ pid uint32 }

func (s fakeSource) Aggregated(fn func(bpfobj.ProfiAggKey, *bpfobj.ProfiAggVal)) error {
	fn(bpfobj.ProfiAggKey{Pid: s.pid, Op: uint32(ops.OpCudaMalloc)}, &bpfobj.ProfiAggVal{Count: 1})
	return nil
}
func (fakeSource) Launches(func(bpfobj.ProfiLaunchKey, *bpfobj.ProfiLaunchVal)) error { return nil }
func (fakeSource) NCCL(func(bpfobj.ProfiNcclKey, *bpfobj.ProfiNcclVal)) error         { return nil }
func (fakeSource) NCCLInflight(func(uint64, *bpfobj.ProfiNcclCall)) error             { return nil }
func (fakeSource) CUDAInflight(func(uint64, *bpfobj.ProfiInflightCall)) error         { return nil }
func (fakeSource) Unseen(uint32) (bpfobj.ProfiProcIdentity, bool) {
	return bpfobj.ProfiProcIdentity{}, false
}
func (fakeSource) NCCLComms(func(bpfobj.ProfiNcclCommKey, *bpfobj.ProfiNcclComm)) error { return nil }
func (fakeSource) Drops() ([bpfobj.NumDrops]uint64, error)                              { return [bpfobj.NumDrops]uint64{}, nil }
func (fakeSource) DeletePIDs(map[uint32]bool) error                                     { return nil }
func (fakeSource) DeleteDead(func(uint32) bool) (int, error)                            { return 0, nil }
func (fakeSource) GraphNodes(func(bpfobj.ProfiGraphNodeKey, *bpfobj.ProfiGraphNodeVal)) error {
	return nil
}
func (fakeSource) GraphReplays(func(bpfobj.ProfiReplayKey, uint64)) error { return nil }
func (fakeSource) Quotas(func(uint32, bpfobj.ProfiPidQuota)) error        { return nil }
func (fakeSource) Tenants(func(uint64, *bpfobj.ProfiTenantQuota)) error   { return nil }
func (fakeSource) Launchers(func(tid, pid uint32)) error                  { return nil }

type fakeProcs struct{}

func (fakeProcs) Lookup(int) (string, uint64, bool)        { return "x", 1, true }
func (fakeProcs) Alive(int, uint64) bool                   { return true }
func (fakeProcs) ThreadCPU(int, int) (time.Duration, bool) { return 0, false }

// withMemory returns an empty Process whose memory series are exported.
func withMemory(t *testing.T, meta aggregate.Meta) *aggregate.Process {
	t.Helper()
	a := aggregate.New(aggregate.Options{Source: fakeSource{pid: uint32(meta.PID)}, Procs: fakeProcs{}})
	if err := a.Drain(); err != nil {
		t.Fatal(err)
	}
	p := a.Snapshot().Processes[0]
	if !p.HasMemory() {
		t.Fatal("aggregator did not admit the memory series")
	}
	p.Meta = meta
	p.Calls, p.Errors, p.Memcpy, p.Launches = nil, nil, nil, nil
	return p
}

// testSnapshot has a value in every family, with distinct numbers.
func testSnapshot(t *testing.T) *aggregate.Snapshot {
	t.Helper()
	p1 := withMemory(t, aggregate.Meta{
		PID: 4242, Comm: "python3", Namespace: "ml", Pod: "trainer-0", Container: "main",
		GPU: "0", GPUUUID: "GPU-5f2a8c1e-0000-1111-2222-333344445555",
	})
	p1.Calls = map[aggregate.OpStream]uint64{
		{Op: "cudaMalloc", Stream: "default"}:              3,
		{Op: "cudaMemcpyAsync", Stream: "0x55d0c2a4f1e0"}:  7,
		{Op: "cudaLaunchKernel", Stream: "other"}:          12,
		{Op: "cudaGraphInstantiate", Stream: "default"}:    1,
		{Op: "cudaMemcpyAsync", Stream: "default"}:         2,
		{Op: "cudaFreeAsync", Stream: "0x7f3a00001000"}:    4,
		{Op: "cudaMallocAsync", Stream: "0x7f3a00001000"}:  5,
		{Op: "cudaGraphLaunch", Stream: "0x55d0c2a4f1e0"}:  6,
		{Op: "cudaMemcpy", Stream: "default"}:              8,
		{Op: "cudaFree", Stream: "default"}:                9,
		{Op: "unknown", Stream: "default"}:                 10,
		{Op: "cudaLaunchKernel", Stream: "0x55d0c2a4f1e0"}: 11,
	}
	p1.Errors = map[aggregate.OpCode]uint64{
		{Op: "cudaMalloc", Code: "2"}:   1,
		{Op: "cudaMemcpy", Code: "700"}: 2,
	}
	p1.Memcpy = map[aggregate.DirStream]uint64{
		{Direction: "h2d", Stream: "0x55d0c2a4f1e0"}: 4096,
		{Direction: "d2h", Stream: "default"}:        8192,
		{Direction: "default", Stream: "default"}:    100,
		{Direction: "unknown", Stream: "default"}:    5,
	}
	p1.MallocBytes, p1.FreedBytes = 3<<20, 1<<20
	p1.Launches = map[aggregate.Kernel]aggregate.Launch{{Name: "anonymous", Class: "other"}: {Count: 23, GridBlocks: 1200, BlockThreads: 3072, SharedBytes: 512}}
	p1.Captured = map[aggregate.Kernel]aggregate.Launch{{Name: "anonymous", Class: "other"}: {Count: 29}}
	p1.Graph = map[aggregate.Kernel]aggregate.Launch{{Name: "anonymous", Class: "other", Phase: "decode"}: {Count: 31000}}
	p1.LaunchThreads, p1.LaunchThreadCPU = 2, 37500*time.Millisecond
	p1.LaunchBound = &aggregate.LaunchBound{BusiestTID: 4243, BusiestShare: 0.75, LaunchRate: 41000}

	// Hand-built: no memory series, no pod, a comm that needs escaping.
	p2 := &aggregate.Process{
		Meta:  aggregate.Meta{PID: 7, Comm: `a "quoted" \name`},
		Calls: map[aggregate.OpStream]uint64{{Op: "cudaFree", Stream: "default"}: 1},
		// Frees of allocations made before attach: active memory is not negative.
		MallocBytes: 10, FreedBytes: 20,
	}

	// The folded series of the container's exited processes: pid="".
	folded := &aggregate.Process{
		Meta:     aggregate.Meta{Comm: "python3", Namespace: "ml", Pod: "trainer-0", Container: "main", GPU: "0", GPUUUID: "GPU-5f2a8c1e-0000-1111-2222-333344445555"},
		Exited:   true,
		Calls:    map[aggregate.OpStream]uint64{{Op: "cudaLaunchKernel", Stream: "default"}: 300},
		Launches: map[aggregate.Kernel]aggregate.Launch{{Name: "anonymous", Class: "other"}: {Count: 300, GridBlocks: 300, BlockThreads: 300}},
	}

	var h1 aggregate.Hist
	h1.Buckets = []uint64{1, 0, 2, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 1}
	h1.Count, h1.SumNs = 7, 1_500_000_123
	h2 := aggregate.Hist{Buckets: make([]uint64, len(bpfobj.LatencyBoundsNs)+1)}
	h2.Buckets[13] = 1
	h2.Count, h2.SumNs = 1, 2_000_000_000
	var drops [bpfobj.NumDrops]uint64
	for i := range drops {
		drops[i] = uint64(i) + 101
	}
	return &aggregate.Snapshot{
		Time:      time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		Processes: []*aggregate.Process{p2, p1},
		Exited:    []*aggregate.Process{folded},
		Hists: map[aggregate.HistKey]*aggregate.Hist{
			{Op: "cudaMalloc", Namespace: "ml", Pod: "trainer-0", GPU: "0"}: &h1,
			{Op: "cudaFree"}: &h2,
		},
		Drops:            drops,
		RingDropRate:     0.5,
		CardinalityDrops: 3,
		ExpiredSeries:    2,
		RejectedComms:    1,
		TenantRefusals: []aggregate.TenantRefusals{
			{Tenant: 8812, Namespace: "ml", Pod: "trainer-0", Container: "main", Refused: [bpfobj.NumQuotaMaps]uint64{bpfobj.QuotaAggregated: 40, bpfobj.QuotaLaunchAgg: 2}},
			{Tenant: 1<<63 | 4242, Refused: [bpfobj.NumQuotaMaps]uint64{bpfobj.QuotaMallocSizes: 7}},
		},
		Series: 42,
		Events: 1234,
	}
}

func testCounters() attach.Counters {
	return attach.Counters{
		Failures: map[[2]string]uint64{
			{"libcudart.so", attach.ReasonNotELF}:         2,
			{"libcudart.so", attach.ReasonSymbolNotFound}: 4,
		},
		Attached:          map[discover.Library]int{discover.LibCudart: 2},
		TrackedPIDs:       []int{7, 4242},
		ScanProblems:      5,
		TriggersCoalesced: 6, HandoverWakeups: 3, HandoverLimited: 1,
	}
}

func newCollector(t *testing.T) *Collector {
	t.Helper()
	snap := testSnapshot(t)
	return New(Data{
		Snapshot:    func() *aggregate.Snapshot { return snap },
		Attach:      testCounters,
		Started:     time.Now().Add(-time.Hour),
		GPURejected: func() uint64 { return 4 },
	})
}

const uptimeFamily = "profi_system_uptime_seconds"

// newExposition registers c in a pedantic registry and joins them as the
// agent does. Its Gather runs through prometheus.Gatherers, which checks
// every family and series as a registry checks its own, the per-process
// families included.
func newExposition(t *testing.T, c *Collector) prometheus.Gatherer {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	return prometheus.Gatherers{NewExposition(reg, c)}
}

// familyNames are the families a scrape returns, but for the uptime, whose
// value depends on the clock.
func familyNames(t *testing.T, reg prometheus.Gatherer) []string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, mf := range mfs {
		if mf.GetName() != uptimeFamily {
			names = append(names, mf.GetName())
		}
	}
	return names
}

// exposition renders the families the registry gathers in the text format
// 0.0.4, leaving out the uptime, whose value depends on the clock.
func exposition(t *testing.T, reg prometheus.Gatherer, withUptime bool) []byte {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if mf.GetName() == uptimeFamily && !withUptime {
			continue
		}
		if err := enc.Encode(mf); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}

func TestGoldenExposition(t *testing.T) {
	t.Parallel()
	reg := newExposition(t, newCollector(t))
	got := exposition(t, reg, false)
	golden(t, "metrics.golden.prom", got)

	// The exposition parses back into the families gathered, with names
	// valid under the classic (pre-UTF-8) scheme.
	p := expfmt.NewTextParser(model.LegacyValidation)
	parsed, err := p.TextToMetricFamilies(bytes.NewReader(got))
	if err != nil {
		t.Fatalf("parse exposition: %v", err)
	}
	if n := len(familyNames(t, reg)); len(parsed) != n {
		t.Errorf("exposition parses into %d families, want %d", len(parsed), n)
	}
}

func TestUptime(t *testing.T) {
	t.Parallel()
	reg := newExposition(t, newCollector(t))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != uptimeFamily {
			continue
		}
		if mf.GetType() != dto.MetricType_GAUGE || len(mf.GetMetric()) != 1 {
			t.Fatalf("uptime family = %v", mf)
		}
		// Started an hour ago: at least 3600 s, whatever the scheduler does.
		if v := mf.GetMetric()[0].GetGauge().GetValue(); v < 3600 {
			t.Errorf("uptime = %v, want at least 3600", v)
		}
		return
	}
	t.Errorf("no %s family", uptimeFamily)
}

// wantLE are the `le` strings of docs/INTERFACE.md 5.3, in order.
var wantLE = []string{"1e-06", "5e-06", "1e-05", "5e-05", "0.0001", "0.0005", "0.001", "0.005", "0.01", "0.05", "0.1", "0.5", "1", "+Inf"}

func TestLabelSetsAndBuckets(t *testing.T) {
	t.Parallel()
	reg := newExposition(t, newCollector(t))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	// Label sets of docs/INTERFACE.md 5.1, in their order (the registry sorts
	// label pairs by name, so the order is checked on the descriptors below).
	labelSets := map[string][]string{
		"profi_cuda_calls_total":                      {"operation", "pid", "comm", "namespace", "pod", "container", "gpu", "gpu_uuid", "stream"},
		"profi_cuda_duration_bucket_total":            {"operation", "namespace", "pod", "gpu", "le"},
		"profi_cuda_duration_sum_seconds_total":       {"operation", "namespace", "pod", "gpu"},
		"profi_cuda_duration_count_total":             {"operation", "namespace", "pod", "gpu"},
		"profi_cuda_duration_seconds":                 {"operation", "namespace", "pod", "gpu"},
		"profi_cuda_memcpy_bytes_total":               {"direction", "pid", "comm", "namespace", "pod", "container", "gpu", "gpu_uuid", "stream"},
		"profi_cuda_malloc_bytes_total":               {"pid", "comm", "namespace", "pod", "container", "gpu", "gpu_uuid"},
		"profi_cuda_active_memory_bytes":              {"pid", "comm", "namespace", "pod", "container", "gpu", "gpu_uuid"},
		"profi_cuda_held_idle_seconds":                {"pid", "comm", "namespace", "pod", "container", "gpu", "gpu_uuid"},
		"profi_cuda_errors_total":                     {"operation", "pid", "comm", "namespace", "pod", "container", "gpu", "gpu_uuid", "error_code"},
		"profi_cuda_kernel_launches_total":            {"kernel", "pid", "comm", "namespace", "pod", "container", "gpu", "gpu_uuid", "kernel_class", "phase"},
		"profi_tracked_pids":                          {},
		"profi_dropped_events_total":                  {},
		"profi_cardinality_limit_drops_total":         {},
		"profi_system_launch_agg_drops_total":         {},
		"profi_system_ring_buffer_drops_rate":         {},
		"profi_system_discovery_attached_libraries":   {"library"},
		"profi_system_metric_handle_cache_size":       {},
		"profi_system_uptime_seconds":                 {},
		"profi_system_attach_failures_total":          {"library", "reason"},
		"profi_system_bpf_map_drops_total":            {"map"},
		"profi_cuda_kernel_grid_blocks_total":         {"kernel", "pid", "comm", "namespace", "pod", "container", "gpu", "gpu_uuid", "kernel_class", "phase"},
		"profi_cuda_kernel_block_threads_total":       {"kernel", "pid", "comm", "namespace", "pod", "container", "gpu", "gpu_uuid", "kernel_class", "phase"},
		"profi_cuda_kernel_shared_memory_bytes_total": {"kernel", "pid", "comm", "namespace", "pod", "container", "gpu", "gpu_uuid", "kernel_class", "phase"},
	}
	types := map[string]dto.MetricType{
		"profi_cuda_duration_seconds":               dto.MetricType_HISTOGRAM,
		"profi_cuda_active_memory_bytes":            dto.MetricType_GAUGE,
		"profi_cuda_held_idle_seconds":              dto.MetricType_GAUGE,
		"profi_tracked_pids":                        dto.MetricType_GAUGE,
		"profi_system_ring_buffer_drops_rate":       dto.MetricType_GAUGE,
		"profi_system_discovery_attached_libraries": dto.MetricType_GAUGE,
		"profi_system_metric_handle_cache_size":     dto.MetricType_GAUGE,
		"profi_system_uptime_seconds":               dto.MetricType_GAUGE,
	}
	seen := map[string]bool{}
	for _, mf := range mfs {
		name := mf.GetName()
		seen[name] = true
		want, ok := labelSets[name]
		if !ok {
			continue
		}
		wantType, ok := types[name]
		if !ok {
			wantType = dto.MetricType_COUNTER
		}
		if mf.GetType() != wantType {
			t.Errorf("%s is a %v, want %v", name, mf.GetType(), wantType)
		}
		for _, m := range mf.GetMetric() {
			var got []string
			for _, lp := range m.GetLabel() {
				got = append(got, lp.GetName())
			}
			if sorted := slices.Sorted(slices.Values(want)); !slices.Equal(got, sorted) {
				t.Errorf("%s labels = %v, want %v", name, got, want)
			}
		}
	}
	for name := range labelSets {
		if !seen[name] {
			t.Errorf("family %s missing", name)
		}
	}

	// Descriptor order is the interface order.
	descs := make(chan *prometheus.Desc, 128)
	newCollector(t).Describe(descs)
	close(descs)
	for d := range descs {
		s := d.String()
		for name, want := range labelSets {
			if !strings.Contains(s, `fqName: "`+name+`"`) || name == "profi_cuda_duration_bucket_total" {
				continue
			}
			if !strings.Contains(s, "variableLabels: {"+strings.Join(want, ",")+"}") {
				t.Errorf("descriptor %s, want variable labels in the order %v", s, want)
			}
		}
	}

	// Bucket counters: cumulative, le strings of docs/INTERFACE.md 5.3, sum in seconds.
	for _, mf := range mfs {
		switch mf.GetName() {
		case "profi_cuda_duration_bucket_total":
			var les []string
			for _, m := range mf.GetMetric() {
				if labelValue(m, "operation") != "cudaMalloc" {
					continue
				}
				les = append(les, labelValue(m, "le"))
			}
			slices.SortFunc(les, func(a, b string) int { return slices.Index(wantLE, a) - slices.Index(wantLE, b) })
			if !slices.Equal(les, wantLE) {
				t.Errorf("le values = %v, want %v", les, wantLE)
			}
		case "profi_cuda_duration_seconds":
			for _, m := range mf.GetMetric() {
				if labelValue(m, "operation") != "cudaMalloc" {
					continue
				}
				h := m.GetHistogram()
				var cum []uint64
				for _, b := range h.GetBucket() {
					cum = append(cum, b.GetCumulativeCount())
				}
				if want := []uint64{1, 1, 3, 3, 3, 6, 6, 6, 6, 6, 6, 6, 6}; !slices.Equal(cum, want) {
					t.Errorf("native buckets = %v, want %v", cum, want)
				}
				if h.GetSampleCount() != 7 || h.GetSampleSum() != 1.500000123 {
					t.Errorf("native count, sum = %d, %v; want 7, 1.500000123", h.GetSampleCount(), h.GetSampleSum())
				}
			}
		}
	}
}

func labelValue(m *dto.Metric, name string) string {
	for _, lp := range m.GetLabel() {
		if lp.GetName() == name {
			return lp.GetValue()
		}
	}
	return ""
}

// TestGoldenPinsLE reads the golden file itself: every le string of
// docs/INTERFACE.md 5.3 is there, for the counter family and the native histogram.
func TestGoldenPinsLE(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join("testdata", "metrics.golden.prom"))
	if err != nil {
		t.Skip("no golden yet:", err)
	}
	lines := strings.Split(string(b), "\n")
	for _, family := range []string{"profi_cuda_duration_bucket_total{", "profi_cuda_duration_seconds_bucket{"} {
		for _, le := range wantLE {
			if !slices.ContainsFunc(lines, func(l string) bool {
				return strings.HasPrefix(l, family) && strings.Contains(l, `le="`+le+`"`)
			}) {
				t.Errorf("golden has no %s...le=%q} line", family, le)
			}
		}
	}
}

func TestLint(t *testing.T) {
	t.Parallel()
	// What testutil.CollectAndLint does: a pedantic registry, then promlint.
	reg := newExposition(t, newCollector(t))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if f := p.Metric + ": " + p.Text; !slices.Contains(promtest.InterfaceLintFindings, f) {
			t.Errorf("lint finding not forced by the interface: %s", f)
		}
	}
}

func TestPromtool(t *testing.T) {
	t.Parallel()
	reg := newExposition(t, newCollector(t))
	promtest.CheckPromtool(t, exposition(t, reg, true))
}

func TestSelfBuckets(t *testing.T) {
	t.Parallel()
	s := NewSelf()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(s.Collectors()...)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	// docs/INTERFACE.md 5.7: 1-5 steps within each documented range.
	want := map[string][]float64{
		"profi_system_discovery_scan_duration_seconds":       {0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5},
		"profi_system_aggregated_map_drain_duration_seconds": {1e-5, 5e-5, 1e-4, 5e-4, 0.001, 0.005, 0.01},
		"profi_system_prometheus_encode_duration_seconds":    {1e-4, 5e-4, 0.001, 0.005, 0.01, 0.05, 0.1},
		"profi_system_event_loop_process_duration_seconds":   {1e-6, 5e-6, 1e-5, 5e-5, 1e-4, 5e-4, 0.001},
	}
	if len(mfs) != len(want) {
		t.Errorf("%d families, want %d", len(mfs), len(want))
	}
	for _, mf := range mfs {
		var bounds []float64
		for _, b := range mf.GetMetric()[0].GetHistogram().GetBucket() {
			bounds = append(bounds, b.GetUpperBound())
		}
		if !slices.Equal(bounds, want[mf.GetName()]) {
			t.Errorf("%s bounds = %v, want %v", mf.GetName(), bounds, want[mf.GetName()])
		}
		if mf.GetType() != dto.MetricType_HISTOGRAM || len(mf.GetMetric()[0].GetLabel()) != 0 {
			t.Errorf("%s: type %v, labels %v", mf.GetName(), mf.GetType(), mf.GetMetric()[0].GetLabel())
		}
	}
}
