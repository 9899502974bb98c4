package otlptest

import (
	"fmt"
	"math"
	"sort"

	dto "github.com/prometheus/client_model/go"
	colmetricpb "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	metricpb "go.opentelemetry.io/proto/otlp/metrics/v1"
	"google.golang.org/protobuf/proto"

	"github.com/profi-dev/profi/internal/otlp"
)

// Families turns a received export back into Prometheus families, the
// attributes renamed back to labels (otlp.LabelName), so that it can be
// compared with a scrape of /metrics: monotonic cumulative Sums become
// counters, Gauges gauges, cumulative explicit-bucket Histograms classic
// histograms. Anything else (delta temporality, a non-monotonic Sum, an
// exponential histogram, a point whose bucket counts do not add up to its
// count) is an error: the agent never sends it.
//
// Several requests (one push split into batches) are merged: a family cut
// across batches is put back together.
func Families(reqs ...*colmetricpb.ExportMetricsServiceRequest) (map[string]*dto.MetricFamily, error) {
	out := map[string]*dto.MetricFamily{}
	for _, req := range reqs {
		for _, rm := range req.GetResourceMetrics() {
			for _, sm := range rm.GetScopeMetrics() {
				for _, m := range sm.GetMetrics() {
					mf, err := family(m)
					if err != nil {
						return nil, fmt.Errorf("%s: %w", m.GetName(), err)
					}
					prev, ok := out[m.GetName()]
					switch {
					case !ok:
						out[m.GetName()] = mf
					case prev.GetType() != mf.GetType() || prev.GetHelp() != mf.GetHelp():
						return nil, fmt.Errorf("%s: sent as %v and as %v", m.GetName(), prev.GetType(), mf.GetType())
					default:
						prev.Metric = append(prev.Metric, mf.Metric...)
					}
				}
			}
		}
	}
	return out, nil
}

func family(m *metricpb.Metric) (*dto.MetricFamily, error) {
	mf := &dto.MetricFamily{Name: proto.String(m.GetName()), Help: proto.String(m.GetDescription())}
	switch d := m.GetData().(type) {
	case *metricpb.Metric_Sum:
		if !d.Sum.GetIsMonotonic() || d.Sum.GetAggregationTemporality() != metricpb.AggregationTemporality_AGGREGATION_TEMPORALITY_CUMULATIVE {
			return nil, fmt.Errorf("sum is not monotonic cumulative: %v", d.Sum.GetAggregationTemporality())
		}
		mf.Type = dto.MetricType_COUNTER.Enum()
		for _, p := range d.Sum.GetDataPoints() {
			mf.Metric = append(mf.Metric, &dto.Metric{Label: labels(p.GetAttributes()), Counter: &dto.Counter{Value: proto.Float64(value(p))}})
		}
	case *metricpb.Metric_Gauge:
		mf.Type = dto.MetricType_GAUGE.Enum()
		for _, p := range d.Gauge.GetDataPoints() {
			mf.Metric = append(mf.Metric, &dto.Metric{Label: labels(p.GetAttributes()), Gauge: &dto.Gauge{Value: proto.Float64(value(p))}})
		}
	case *metricpb.Metric_Histogram:
		if d.Histogram.GetAggregationTemporality() != metricpb.AggregationTemporality_AGGREGATION_TEMPORALITY_CUMULATIVE {
			return nil, fmt.Errorf("histogram is not cumulative: %v", d.Histogram.GetAggregationTemporality())
		}
		mf.Type = dto.MetricType_HISTOGRAM.Enum()
		for _, p := range d.Histogram.GetDataPoints() {
			bounds, counts := p.GetExplicitBounds(), p.GetBucketCounts()
			if len(counts) != len(bounds)+1 {
				return nil, fmt.Errorf("%d bucket counts for %d bounds", len(counts), len(bounds))
			}
			h := &dto.Histogram{SampleCount: proto.Uint64(p.GetCount()), SampleSum: proto.Float64(p.GetSum())}
			var cum uint64
			for i, b := range bounds {
				cum += counts[i]
				h.Bucket = append(h.Bucket, &dto.Bucket{UpperBound: proto.Float64(b), CumulativeCount: proto.Uint64(cum)})
			}
			if cum+counts[len(bounds)] != p.GetCount() {
				return nil, fmt.Errorf("bucket counts add up to %d, count is %d", cum+counts[len(bounds)], p.GetCount())
			}
			mf.Metric = append(mf.Metric, &dto.Metric{Label: labels(p.GetAttributes()), Histogram: h})
		}
	default:
		return nil, fmt.Errorf("unexpected data type %T", d)
	}
	return mf, nil
}

func value(p *metricpb.NumberDataPoint) float64 {
	if v, ok := p.GetValue().(*metricpb.NumberDataPoint_AsInt); ok {
		return float64(v.AsInt)
	}
	return p.GetAsDouble()
}

func labels(attrs []*commonpb.KeyValue) []*dto.LabelPair {
	out := make([]*dto.LabelPair, 0, len(attrs))
	for _, a := range attrs {
		out = append(out, &dto.LabelPair{Name: proto.String(otlp.LabelName(a.GetKey())), Value: proto.String(a.GetValue().GetStringValue())})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GetName() < out[j].GetName() })
	return out
}

// Attributes flattens a resource's attributes (string values).
func Attributes(attrs []*commonpb.KeyValue) map[string]string {
	out := map[string]string{}
	for _, a := range attrs {
		out[a.GetKey()] = a.GetValue().GetStringValue()
	}
	return out
}

// Diff lists every difference between two sets of families (type, help,
// series, values, histogram buckets), one line each; "" when equal.
func Diff(want, got map[string]*dto.MetricFamily) string {
	w, g := lines(want), lines(got)
	var out []string
	for l := range w {
		if !g[l] {
			out = append(out, "  missing: "+l)
		}
	}
	for l := range g {
		if !w[l] {
			out = append(out, "  unexpected: "+l)
		}
	}
	sort.Strings(out)
	s := ""
	for _, l := range out {
		s += l + "\n"
	}
	return s
}

func lines(mfs map[string]*dto.MetricFamily) map[string]bool {
	out := map[string]bool{}
	for name, mf := range mfs {
		out[fmt.Sprintf("%s %s help=%q", name, mf.GetType(), mf.GetHelp())] = true
		for _, m := range mf.GetMetric() {
			series := name + "{"
			for i, l := range m.GetLabel() {
				if i > 0 {
					series += ","
				}
				series += fmt.Sprintf("%s=%q", l.GetName(), l.GetValue())
			}
			series += "}"
			switch {
			case m.Counter != nil:
				out[fmt.Sprintf("%s counter %v", series, m.GetCounter().GetValue())] = true
			case m.Gauge != nil:
				out[fmt.Sprintf("%s gauge %v", series, m.GetGauge().GetValue())] = true
			case m.Untyped != nil:
				out[fmt.Sprintf("%s gauge %v", series, m.GetUntyped().GetValue())] = true
			case m.Histogram != nil:
				h := m.GetHistogram()
				out[fmt.Sprintf("%s count=%d sum=%v", series, h.GetSampleCount(), h.GetSampleSum())] = true
				for _, b := range h.GetBucket() {
					if math.IsInf(b.GetUpperBound(), 1) {
						continue // the text format lists +Inf; its count is the sample count
					}
					out[fmt.Sprintf("%s le=%v cumulative=%d", series, b.GetUpperBound(), b.GetCumulativeCount())] = true
				}
			}
		}
	}
	return out
}
