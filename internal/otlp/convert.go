package otlp

import (
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/resource"
)

// ScopeName is the instrumentation scope of every pushed metric.
const ScopeName = "github.com/profi-dev/profi"

// Family name rules of docs/INTERFACE.md §6.
const (
	// pushedPrefix: only the agent's own families are pushed; go_* and
	// process_* describe the agent process, like profi_system_*.
	pushedPrefix = "profi_"
	// selfPrefix families are self-observability and stay Prometheus-only.
	selfPrefix = "profi_system_"
)

// The counter families that encode a latency histogram next to its native
// family X_seconds: X_bucket_total, X_sum_seconds_total, X_count_total.
// They are not pushed: the native family goes out as an OTLP Histogram.
var counterHistogramSuffixes = []string{"_bucket_total", "_sum_seconds_total", "_count_total"}

// attributeNames are the label renames of docs/INTERFACE.md §6; any other label
// x becomes profi.x (AttributeName).
var attributeNames = map[string]string{
	"pod":          "k8s.pod.name",
	"namespace":    "k8s.namespace.name",
	"container":    "k8s.container.name",
	"gpu":          "gpu.id",
	"gpu_uuid":     "gpu.uuid",
	"gpu_model":    "gpu.model",
	"pid":          "process.pid",
	"comm":         "process.command",
	"operation":    "profi.operation",
	"kernel":       "profi.kernel",
	"kernel_class": "profi.kernel.class",
	"phase":        "profi.phase",
	"direction":    "profi.memcpy.direction",
	"stream":       "profi.cuda.stream",
	"error_code":   "profi.error.code",
}

// AttributeName is the OTLP attribute key of a Prometheus label.
func AttributeName(label string) string {
	if a, ok := attributeNames[label]; ok {
		return a
	}
	return "profi." + label
}

// LabelName inverts AttributeName (for tests and tools reading pushed data).
func LabelName(attr string) string {
	for l, a := range attributeNames {
		if a == attr {
			return l
		}
	}
	return strings.TrimPrefix(attr, "profi.")
}

// units maps a name suffix to its UCUM unit. Only units whose Prometheus
// spelling is already in the name: a backend that appends units to names
// (Prometheus OTLP ingestion) then leaves the name as it is.
var units = []struct{ suffix, unit string }{
	{"_seconds", "s"},
	{"_bytes", "By"},
	{"_ratio", "1"},
	{"_celsius", "Cel"},
	{"_watts", "W"},
}

func unitOf(name string) string {
	base := strings.TrimSuffix(name, "_total")
	for _, u := range units {
		if strings.HasSuffix(base, u.suffix) {
			return u.unit
		}
	}
	return ""
}

// Converter turns the families of a Gatherer into OTLP metric data. It
// remembers a start time per live series, so each point's start time is
// when its series appeared, not when the agent started; a series that
// disappears is forgotten, so memory follows the live series.
type Converter struct {
	gatherer prometheus.Gatherer
	resource *resource.Resource
	scope    instrumentation.Scope
	now      func() time.Time

	mu sync.Mutex
	// starts maps a series key (seriesKey) to its start time and attributes.
	starts map[string]seriesState
	// last is when the previous conversion gathered (at first, the agent's
	// start): a series first seen now was created after it.
	last time.Time
}

// NewConverter converts g's families under resource res. started is when
// the agent started (the earliest a series can have been created).
func NewConverter(g prometheus.Gatherer, res *resource.Resource, version string, started time.Time) *Converter {
	return &Converter{
		gatherer: g,
		resource: res,
		scope:    instrumentation.Scope{Name: ScopeName, Version: version},
		now:      time.Now,
		starts:   map[string]seriesState{},
		last:     started,
	}
}

// Series reports how many series start times are held (tests: memory is
// bounded by the live series).
func (c *Converter) Series() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.starts)
}

// Convert gathers once and returns the OTLP data, and the number of series
// it could not convert (malformed histograms). A Gatherer error with some
// families gathered still returns those, with the error: one broken
// collector does not stop the push of the others.
func (c *Converter) Convert() (*metricdata.ResourceMetrics, int, error) {
	mfs, gatherErr := c.gatherer.Gather()
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()

	histograms := map[string]bool{}
	for _, mf := range mfs {
		if mf.GetType() == dto.MetricType_HISTOGRAM {
			histograms[mf.GetName()] = true
		}
	}

	// A series seen for the first time was created after the previous
	// gather: that is its start time. Using the earlier bound keeps the
	// first point's cumulative value consistent (every event counted in it
	// happened after its start time).
	cv := conversion{now: now, prev: c.last, old: c.starts, starts: make(map[string]seriesState, len(c.starts))}
	var out []metricdata.Metrics
	for _, mf := range mfs {
		name := mf.GetName()
		if !pushed(name, mf.GetType(), histograms) {
			continue
		}
		if m, ok := cv.family(mf); ok {
			out = append(out, m)
		}
	}
	c.starts, c.last = cv.starts, now

	rm := &metricdata.ResourceMetrics{Resource: c.resource}
	if len(out) > 0 {
		rm.ScopeMetrics = []metricdata.ScopeMetrics{{Scope: c.scope, Metrics: out}}
	}
	if gatherErr != nil {
		gatherErr = fmt.Errorf("gather metrics: %w", gatherErr)
	}
	return rm, cv.dropped, gatherErr
}

// pushed reports whether a family goes out over OTLP (docs/INTERFACE.md §6).
func pushed(name string, typ dto.MetricType, histograms map[string]bool) bool {
	if !strings.HasPrefix(name, pushedPrefix) || strings.HasPrefix(name, selfPrefix) {
		return false
	}
	if typ != dto.MetricType_COUNTER {
		return true
	}
	for _, s := range counterHistogramSuffixes {
		if base, ok := strings.CutSuffix(name, s); ok && histograms[base+"_seconds"] {
			return false
		}
	}
	return true
}

type conversion struct {
	now, prev   time.Time
	old, starts map[string]seriesState
	dropped     int
}

// seriesState is what a series keeps between conversions: its start time,
// and its attribute set, which the key determines. attribute.NewSet (sort,
// dedupe, copy) per point was most of a push at 2·10⁴ series.
type seriesState struct {
	start time.Time
	attrs attribute.Set
}

// start returns the start time and attributes of one series and keeps
// them for the next conversion. A created timestamp exported with the
// series wins.
func (cv *conversion) start(name string, m *dto.Metric, created interface{ AsTime() time.Time }) (time.Time, attribute.Set) {
	key := seriesKey(name, m.GetLabel())
	st, ok := cv.old[key]
	if !ok {
		st = seriesState{start: cv.prev, attrs: attributes(m.GetLabel())}
	}
	if created != nil {
		if t := created.AsTime(); !t.IsZero() && t.Unix() > 0 && !t.After(cv.now) {
			st.start = t
		}
	}
	cv.starts[key] = st
	return st.start, st.attrs
}

func (cv *conversion) family(mf *dto.MetricFamily) (metricdata.Metrics, bool) {
	name := mf.GetName()
	out := metricdata.Metrics{Name: name, Description: mf.GetHelp(), Unit: unitOf(name)}
	switch mf.GetType() {
	case dto.MetricType_COUNTER:
		sum := metricdata.Sum[float64]{Temporality: metricdata.CumulativeTemporality, IsMonotonic: true}
		for _, m := range mf.GetMetric() {
			var created interface{ AsTime() time.Time }
			if ts := m.GetCounter().GetCreatedTimestamp(); ts != nil {
				created = ts
			}
			start, attrs := cv.start(name, m, created)
			sum.DataPoints = append(sum.DataPoints, metricdata.DataPoint[float64]{
				Attributes: attrs,
				StartTime:  start,
				Time:       cv.now,
				Value:      m.GetCounter().GetValue(),
			})
		}
		out.Data = sum
	case dto.MetricType_GAUGE, dto.MetricType_UNTYPED:
		// Gauges carry no start time (OTLP: optional, meaningless for them).
		var g metricdata.Gauge[float64]
		for _, m := range mf.GetMetric() {
			v := m.GetGauge().GetValue()
			if m.Untyped != nil {
				v = m.GetUntyped().GetValue()
			}
			g.DataPoints = append(g.DataPoints, metricdata.DataPoint[float64]{
				Attributes: attributes(m.GetLabel()),
				Time:       cv.now,
				Value:      v,
			})
		}
		out.Data = g
	case dto.MetricType_HISTOGRAM:
		h := metricdata.Histogram[float64]{Temporality: metricdata.CumulativeTemporality}
		for _, m := range mf.GetMetric() {
			dp, ok := histogramPoint(m.GetHistogram())
			if !ok {
				cv.dropped++
				continue
			}
			var created interface{ AsTime() time.Time }
			if ts := m.GetHistogram().GetCreatedTimestamp(); ts != nil {
				created = ts
			}
			dp.StartTime, dp.Attributes = cv.start(name, m, created)
			dp.Time = cv.now
			h.DataPoints = append(h.DataPoints, dp)
		}
		out.Data = h
	case dto.MetricType_SUMMARY:
		s := metricdata.Summary{}
		for _, m := range mf.GetMetric() {
			sm := m.GetSummary()
			var created interface{ AsTime() time.Time }
			if ts := sm.GetCreatedTimestamp(); ts != nil {
				created = ts
			}
			start, attrs := cv.start(name, m, created)
			dp := metricdata.SummaryDataPoint{
				Attributes: attrs,
				StartTime:  start,
				Time:       cv.now,
				Count:      sm.GetSampleCount(),
				Sum:        sm.GetSampleSum(),
			}
			for _, q := range sm.GetQuantile() {
				dp.QuantileValues = append(dp.QuantileValues, metricdata.QuantileValue{Quantile: q.GetQuantile(), Value: q.GetValue()})
			}
			s.DataPoints = append(s.DataPoints, dp)
		}
		out.Data = s
	default:
		cv.dropped += len(mf.GetMetric())
		return out, false
	}
	return out, true
}

// histogramPoint converts a classic Prometheus histogram (cumulative
// buckets, +Inf implied by the count) into explicit OTLP buckets
// (per-bucket counts, one more than the finite bounds). Both use inclusive
// upper bounds, so the bounds carry over unchanged. Cumulative counts that
// decrease are malformed: not converted.
func histogramPoint(h *dto.Histogram) (metricdata.HistogramDataPoint[float64], bool) {
	dp := metricdata.HistogramDataPoint[float64]{Count: h.GetSampleCount(), Sum: h.GetSampleSum()}
	var prev uint64
	for _, b := range h.GetBucket() {
		if math.IsInf(b.GetUpperBound(), 1) {
			continue
		}
		cum := b.GetCumulativeCount()
		if cum < prev {
			return dp, false
		}
		dp.Bounds = append(dp.Bounds, b.GetUpperBound())
		dp.BucketCounts = append(dp.BucketCounts, cum-prev)
		prev = cum
	}
	if dp.Count < prev {
		return dp, false
	}
	dp.BucketCounts = append(dp.BucketCounts, dp.Count-prev)
	return dp, true
}

func attributes(labels []*dto.LabelPair) attribute.Set {
	kvs := make([]attribute.KeyValue, 0, len(labels))
	for _, l := range labels {
		kvs = append(kvs, attribute.String(AttributeName(l.GetName()), l.GetValue()))
	}
	return attribute.NewSet(kvs...)
}

// seriesKey identifies a series: family name and label pairs (a registry
// gathers labels sorted by name), NUL-separated. A value containing NUL
// could collide with another label set; the two would only share a start
// time.
func seriesKey(name string, labels []*dto.LabelPair) string {
	var b strings.Builder
	b.WriteString(name)
	for _, l := range labels {
		b.WriteByte(0)
		b.WriteString(l.GetName())
		b.WriteByte(0)
		b.WriteString(l.GetValue())
	}
	return b.String()
}
