package otlp

import (
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/metric/metricdata/metricdatatest"
	"go.opentelemetry.io/otel/sdk/resource"
)

// series is a settable collector: the test decides which series exist.
type series struct {
	mu      sync.Mutex
	metrics []prometheus.Metric
}

func (s *series) set(m ...prometheus.Metric) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.metrics = m
}

func (*series) Describe(chan<- *prometheus.Desc) {} // unchecked collector

func (s *series) Collect(ch chan<- prometheus.Metric) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range s.metrics {
		ch <- m
	}
}

var (
	callsDesc = prometheus.NewDesc("profi_cuda_calls_total", "Calls.", []string{"operation", "pid", "comm", "namespace", "pod", "container", "gpu", "gpu_uuid", "stream"}, nil)
	memDesc   = prometheus.NewDesc("profi_cuda_active_memory_bytes", "Active.", []string{"pid"}, nil)
	histDesc  = prometheus.NewDesc("profi_cuda_duration_seconds", "Latency.", []string{"operation", "namespace", "pod", "gpu"}, nil)
	bucketD   = prometheus.NewDesc("profi_cuda_duration_bucket_total", "Buckets.", []string{"operation", "namespace", "pod", "gpu", "le"}, nil)
	sumD      = prometheus.NewDesc("profi_cuda_duration_sum_seconds_total", "Sum.", []string{"operation", "namespace", "pod", "gpu"}, nil)
	countD    = prometheus.NewDesc("profi_cuda_duration_count_total", "Count.", []string{"operation", "namespace", "pod", "gpu"}, nil)
	selfDesc  = prometheus.NewDesc("profi_system_uptime_seconds", "Uptime.", nil, nil)
	goDesc    = prometheus.NewDesc("go_goroutines", "Goroutines.", nil, nil)
	infoDesc  = prometheus.NewDesc("profi_gpu_info", "Info.", []string{"gpu", "gpu_uuid", "gpu_model", "custom"}, nil)
	// A counter ending in _count_total with no X_seconds histogram next to it is pushed.
	lonelyD = prometheus.NewDesc("profi_thing_count_total", "Not a histogram part.", nil, nil)
)

func calls(pid string, v float64) prometheus.Metric {
	return prometheus.MustNewConstMetric(callsDesc, prometheus.CounterValue, v, "cudaMemcpy", pid, "train", "ns", "pod-a", "c", "0", "GPU-1", "default")
}

func callsAttrs(pid string) attribute.Set {
	return attribute.NewSet(
		attribute.String("profi.operation", "cudaMemcpy"),
		attribute.String("process.pid", pid),
		attribute.String("process.command", "train"),
		attribute.String("k8s.namespace.name", "ns"),
		attribute.String("k8s.pod.name", "pod-a"),
		attribute.String("k8s.container.name", "c"),
		attribute.String("gpu.id", "0"),
		attribute.String("gpu.uuid", "GPU-1"),
		attribute.String("profi.cuda.stream", "default"),
	)
}

func newTestConverter(s *series, started time.Time) (*Converter, *time.Time) {
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(s)
	res := resource.NewSchemaless(attribute.String("service.name", "profi"))
	c := NewConverter(reg, res, "v1.2.3", started)
	now := started
	c.now = func() time.Time { return now }
	return c, &now
}

// One conversion, compared field by field with the exact expected data:
// names, help, units, attribute renames, temporality, monotonicity,
// histogram bounds and per-bucket counts, times; profi_system_*, go_* and
// the counter-made histogram families are absent.
func TestConvertExact(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	s := &series{}
	c, now := newTestConverter(s, t0)
	s.set(
		calls("42", 7),
		prometheus.MustNewConstMetric(memDesc, prometheus.GaugeValue, 4096, "42"),
		prometheus.MustNewConstHistogram(histDesc, 9, 1.5, map[float64]uint64{1e-6: 2, 5e-6: 5, 1e-3: 5, 1: 7}, "cudaMemcpy", "ns", "pod-a", "0"),
		prometheus.MustNewConstMetric(bucketD, prometheus.CounterValue, 2, "cudaMemcpy", "ns", "pod-a", "0", "1e-06"),
		prometheus.MustNewConstMetric(sumD, prometheus.CounterValue, 1.5, "cudaMemcpy", "ns", "pod-a", "0"),
		prometheus.MustNewConstMetric(countD, prometheus.CounterValue, 9, "cudaMemcpy", "ns", "pod-a", "0"),
		prometheus.MustNewConstMetric(selfDesc, prometheus.GaugeValue, 12),
		prometheus.MustNewConstMetric(goDesc, prometheus.GaugeValue, 12),
		prometheus.MustNewConstMetric(infoDesc, prometheus.GaugeValue, 1, "0", "GPU-1", "H100", "x"),
		prometheus.MustNewConstMetric(lonelyD, prometheus.CounterValue, 3),
	)
	t1 := t0.Add(time.Minute)
	*now = t1
	got, dropped, err := c.Convert()
	if err != nil || dropped != 0 {
		t.Fatalf("Convert: dropped %d, err %v", dropped, err)
	}
	want := metricdata.ResourceMetrics{
		Resource: resource.NewSchemaless(attribute.String("service.name", "profi")),
		ScopeMetrics: []metricdata.ScopeMetrics{{
			Scope: instrumentation.Scope{Name: ScopeName, Version: "v1.2.3"},
			Metrics: []metricdata.Metrics{
				{Name: "profi_cuda_active_memory_bytes", Description: "Active.", Unit: "By", Data: metricdata.Gauge[float64]{
					DataPoints: []metricdata.DataPoint[float64]{{Attributes: attribute.NewSet(attribute.String("process.pid", "42")), Time: t1, Value: 4096}},
				}},
				{Name: "profi_cuda_calls_total", Description: "Calls.", Data: metricdata.Sum[float64]{
					Temporality: metricdata.CumulativeTemporality, IsMonotonic: true,
					DataPoints: []metricdata.DataPoint[float64]{{Attributes: callsAttrs("42"), StartTime: t0, Time: t1, Value: 7}},
				}},
				{Name: "profi_cuda_duration_seconds", Description: "Latency.", Unit: "s", Data: metricdata.Histogram[float64]{
					Temporality: metricdata.CumulativeTemporality,
					DataPoints: []metricdata.HistogramDataPoint[float64]{{
						Attributes: attribute.NewSet(
							attribute.String("profi.operation", "cudaMemcpy"), attribute.String("k8s.namespace.name", "ns"),
							attribute.String("k8s.pod.name", "pod-a"), attribute.String("gpu.id", "0")),
						StartTime: t0, Time: t1, Count: 9, Sum: 1.5,
						Bounds:       []float64{1e-6, 5e-6, 1e-3, 1},
						BucketCounts: []uint64{2, 3, 0, 2, 2},
					}},
				}},
				{Name: "profi_gpu_info", Description: "Info.", Data: metricdata.Gauge[float64]{
					DataPoints: []metricdata.DataPoint[float64]{{Attributes: attribute.NewSet(
						attribute.String("gpu.id", "0"), attribute.String("gpu.uuid", "GPU-1"),
						attribute.String("gpu.model", "H100"), attribute.String("profi.custom", "x")), Time: t1, Value: 1}},
				}},
				{Name: "profi_thing_count_total", Description: "Not a histogram part.", Data: metricdata.Sum[float64]{
					Temporality: metricdata.CumulativeTemporality, IsMonotonic: true,
					DataPoints: []metricdata.DataPoint[float64]{{Attributes: attribute.NewSet(), StartTime: t0, Time: t1, Value: 3}},
				}},
			},
		}},
	}
	metricdatatest.AssertEqual(t, want, *got)
}

// Start times: stable across pushes while a series lives; a new series
// starts at the previous gather (it was created after it); a series that
// disappears is forgotten (memory follows the live series) and starts
// afresh when it comes back. A created timestamp exported with the series
// wins.
func TestStartTimes(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	s := &series{}
	c, now := newTestConverter(s, t0)
	starts := func(at time.Time) map[string]time.Time {
		t.Helper()
		*now = at
		rm, _, err := c.Convert()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]time.Time{}
		for _, m := range rm.ScopeMetrics[0].Metrics {
			for _, dp := range m.Data.(metricdata.Sum[float64]).DataPoints {
				pid, _ := dp.Attributes.Value("process.pid")
				out[pid.AsString()] = dp.StartTime
				if !dp.Time.Equal(at) {
					t.Errorf("pid %s: time %v, want %v", pid.AsString(), dp.Time, at)
				}
			}
		}
		return out
	}
	check := func(got, want map[string]time.Time) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("start times %v, want %v", got, want)
		}
		for k, w := range want {
			if !got[k].Equal(w) {
				t.Errorf("pid %s: start %v, want %v", k, got[k], w)
			}
		}
		if c.Series() != len(want) {
			t.Errorf("converter holds %d series, want %d (the live ones)", c.Series(), len(want))
		}
	}
	t1, t2, t3, t4 := t0.Add(time.Minute), t0.Add(2*time.Minute), t0.Add(3*time.Minute), t0.Add(4*time.Minute)

	s.set(calls("1", 1), calls("2", 1))
	check(starts(t1), map[string]time.Time{"1": t0, "2": t0})
	s.set(calls("1", 5), calls("3", 1)) // 2 gone, 3 new
	check(starts(t2), map[string]time.Time{"1": t0, "3": t1})
	s.set(calls("1", 6), calls("2", 1), calls("3", 2)) // 2 is back: a new series
	check(starts(t3), map[string]time.Time{"1": t0, "2": t2, "3": t1})

	created := t0.Add(90 * time.Second)
	s.set(calls("1", 6), prometheus.MustNewConstMetricWithCreatedTimestamp(callsDesc, prometheus.CounterValue, 1, created,
		"cudaMemcpy", "4", "train", "ns", "pod-a", "c", "0", "GPU-1", "default"))
	check(starts(t4), map[string]time.Time{"1": t0, "4": created})
}

// Malformed histogram buckets (cumulative counts that decrease) are left
// out and counted, never sent as nonsense.
func TestMalformedHistogramDropped(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	s := &series{}
	c, _ := newTestConverter(s, t0)
	s.set(
		prometheus.MustNewConstHistogram(histDesc, 5, 1, map[float64]uint64{1e-6: 4, 1: 3}, "a", "", "", ""),
		prometheus.MustNewConstHistogram(histDesc, 2, 1, map[float64]uint64{1e-6: 1, 1: 3}, "b", "", "", ""),
		prometheus.MustNewConstHistogram(histDesc, 3, 1, map[float64]uint64{1e-6: 1, 1: 3}, "c", "", "", ""),
	)
	rm, dropped, err := c.Convert()
	if err != nil {
		t.Fatal(err)
	}
	if dropped != 2 {
		t.Errorf("dropped %d series, want 2", dropped)
	}
	h := rm.ScopeMetrics[0].Metrics[0].Data.(metricdata.Histogram[float64])
	if len(h.DataPoints) != 1 {
		t.Fatalf("%d points, want 1", len(h.DataPoints))
	}
	if op, _ := h.DataPoints[0].Attributes.Value("profi.operation"); op.AsString() != "c" {
		t.Errorf("kept %v, want operation c", op.AsString())
	}
}

func TestAttributeNames(t *testing.T) {
	for label, attr := range map[string]string{
		"pod": "k8s.pod.name", "namespace": "k8s.namespace.name", "container": "k8s.container.name",
		"gpu": "gpu.id", "gpu_uuid": "gpu.uuid", "gpu_model": "gpu.model", "pid": "process.pid",
		"comm": "process.command", "operation": "profi.operation", "kernel": "profi.kernel",
		"kernel_class": "profi.kernel.class", "phase": "profi.phase", "direction": "profi.memcpy.direction",
		"stream": "profi.cuda.stream", "error_code": "profi.error.code",
		"clock_type": "profi.clock_type", "reason": "profi.reason",
	} {
		if got := AttributeName(label); got != attr {
			t.Errorf("AttributeName(%q) = %q, want %q", label, got, attr)
		}
		if got := LabelName(attr); got != label {
			t.Errorf("LabelName(%q) = %q, want %q", attr, got, label)
		}
	}
}

func TestAdvance(t *testing.T) {
	t0 := time.Unix(1000, 0)
	const iv = 10 * time.Second
	for _, tc := range []struct {
		now        time.Duration // after the due tick t0
		wantNext   time.Duration
		wantMissed int64
	}{
		{1 * time.Second, 10 * time.Second, 0},  // push done before the next tick
		{10 * time.Second, 20 * time.Second, 1}, // exactly at the next tick: it is missed
		{25 * time.Second, 30 * time.Second, 2}, // ran past two ticks
	} {
		next, missed := advance(t0, t0.Add(tc.now), iv)
		if !next.Equal(t0.Add(tc.wantNext)) || missed != tc.wantMissed {
			t.Errorf("advance(now=+%v) = (+%v, %d), want (+%v, %d)", tc.now, next.Sub(t0), missed, tc.wantNext, tc.wantMissed)
		}
	}
}

// BenchmarkConvert measures one push's conversion at 2·10⁴ counter series
// after the first (the series' attributes are built once, then reused).
func BenchmarkConvert(b *testing.B) {
	reg := prometheus.NewRegistry()
	calls := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "profi_cuda_calls_total", Help: "h"},
		[]string{"operation", "pid", "comm", "namespace", "pod", "container", "gpu", "gpu_uuid", "stream"})
	reg.MustRegister(calls)
	for i := range 20_000 {
		calls.WithLabelValues("cuLaunchKernel", strconv.Itoa(1000+i%4), "scale", "", "", "", "", "", strconv.Itoa(i)).Add(float64(i))
	}
	c := NewConverter(reg, resource.Empty(), "v", time.Now())
	if _, _, err := c.Convert(); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := c.Convert(); err != nil {
			b.Fatal(err)
		}
	}
}
