package otlp

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// Metrics are the push's self-metrics (Prometheus-only, like every
// profi_system_ family).
type Metrics struct {
	Exports *prometheus.CounterVec
	Skipped prometheus.Counter
	Dropped prometheus.Counter
}

// Push outcomes of profi_system_otlp_exports_total.
const (
	ResultSuccess = "success"
	ResultFailure = "failure"
)

// NewMetrics creates the self-metrics, both results at zero.
func NewMetrics() *Metrics {
	m := &Metrics{
		Exports: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "profi_system_otlp_exports_total",
			Help: "OTLP pushes by result (failure: collector unreachable, timeout, rejected or partly rejected batch). A failed batch is not kept or retried later.",
		}, []string{"result"}),
		Skipped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "profi_system_otlp_skipped_pushes_total",
			Help: "OTLP push ticks skipped because the previous push was still running (missed ticks are not queued).",
		}),
		Dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "profi_system_otlp_unconverted_series_total",
			Help: "Series left out of an OTLP push because they could not be converted (malformed histogram buckets).",
		}),
	}
	m.Exports.WithLabelValues(ResultSuccess)
	m.Exports.WithLabelValues(ResultFailure)
	return m
}

// Collectors returns the collectors to register.
func (m *Metrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.Exports, m.Skipped, m.Dropped}
}

// MaxPointsPerExport bounds one export request. A node at the default
// --max-time-series (50000) makes a batch of about 20 MB, over the 4 MiB
// that gRPC servers, the OpenTelemetry Collector's included, accept by
// default; 2000 points stay under 1 MiB.
const MaxPointsPerExport = 2000

// Split cuts rm into batches of at most maxPoints data points, in order.
// The batches share rm's slices (no copy).
func Split(rm *metricdata.ResourceMetrics, maxPoints int) []*metricdata.ResourceMetrics {
	var out []*metricdata.ResourceMetrics
	var cur *metricdata.ResourceMetrics
	room := 0
	newBatch := func() {
		cur = &metricdata.ResourceMetrics{Resource: rm.Resource}
		out = append(out, cur)
		room = maxPoints
	}
	add := func(scope instrumentation.Scope, m metricdata.Metrics) {
		last := len(cur.ScopeMetrics) - 1
		if last < 0 || cur.ScopeMetrics[last].Scope != scope {
			cur.ScopeMetrics = append(cur.ScopeMetrics, metricdata.ScopeMetrics{Scope: scope})
			last++
		}
		cur.ScopeMetrics[last].Metrics = append(cur.ScopeMetrics[last].Metrics, m)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			n := points(m.Data)
			if n == 0 {
				if cur == nil {
					newBatch()
				}
				add(sm.Scope, m)
				continue
			}
			for lo := 0; lo < n; {
				if cur == nil || room == 0 {
					newBatch()
				}
				take := min(n-lo, room)
				part := m
				part.Data = slicePoints(m.Data, lo, lo+take)
				add(sm.Scope, part)
				room -= take
				lo += take
			}
		}
	}
	if len(out) == 0 {
		out = append(out, rm) // nothing to send still proves the collector is reachable
	}
	return out
}

func points(a metricdata.Aggregation) int {
	switch d := a.(type) {
	case metricdata.Sum[float64]:
		return len(d.DataPoints)
	case metricdata.Gauge[float64]:
		return len(d.DataPoints)
	case metricdata.Histogram[float64]:
		return len(d.DataPoints)
	case metricdata.Summary:
		return len(d.DataPoints)
	}
	return 0
}

func slicePoints(a metricdata.Aggregation, lo, hi int) metricdata.Aggregation {
	switch d := a.(type) {
	case metricdata.Sum[float64]:
		d.DataPoints = d.DataPoints[lo:hi]
		return d
	case metricdata.Gauge[float64]:
		d.DataPoints = d.DataPoints[lo:hi]
		return d
	case metricdata.Histogram[float64]:
		d.DataPoints = d.DataPoints[lo:hi]
		return d
	case metricdata.Summary:
		d.DataPoints = d.DataPoints[lo:hi]
		return d
	}
	return a
}

// Pusher converts and exports on a fixed period.
type Pusher struct {
	conv     *Converter
	exp      Exporter
	interval time.Duration
	timeout  time.Duration
	metrics  *Metrics
	log      *slog.Logger
	// failures counts consecutive failed pushes: only the first is logged
	// as a warning, so a collector that is down costs one line, not one
	// per interval.
	failures int
}

// NewPusher pushes conv's data through exp every interval, each push
// bounded by timeout.
func NewPusher(conv *Converter, exp Exporter, interval, timeout time.Duration, m *Metrics, log *slog.Logger) *Pusher {
	return &Pusher{conv: conv, exp: exp, interval: interval, timeout: timeout, metrics: m, log: log}
}

// Run pushes one interval after start and then every interval until ctx
// ends. A push that runs past the next tick makes the loop skip the ticks
// it missed (counted), never queue them: at most one batch exists at a
// time, whatever the collector does.
func (p *Pusher) Run(ctx context.Context) error {
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = p.exp.Shutdown(sctx)
	}()
	next := time.Now().Add(p.interval)
	timer := time.NewTimer(time.Until(next))
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		}
		_ = p.Push(ctx)
		var missed int64
		next, missed = advance(next, time.Now(), p.interval)
		if missed > 0 {
			p.metrics.Skipped.Add(float64(missed))
		}
		timer.Reset(time.Until(next))
	}
}

// advance returns the tick after due that is still in the future at now,
// and how many ticks in between were missed (a push that ran long).
func advance(due, now time.Time, interval time.Duration) (next time.Time, missed int64) {
	next = due.Add(interval)
	if now.Before(next) {
		return next, 0
	}
	missed = int64(now.Sub(next)/interval) + 1
	return next.Add(time.Duration(missed) * interval), missed
}

// Push converts and exports once; the error is also counted and logged.
func (p *Pusher) Push(ctx context.Context) error {
	rm, dropped, gatherErr := p.conv.Convert()
	if dropped > 0 {
		p.metrics.Dropped.Add(float64(dropped))
	}
	if gatherErr != nil {
		p.log.Warn("OTLP push: some metrics could not be gathered", "err", gatherErr)
	}
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	var err error
	for _, b := range Split(rm, MaxPointsPerExport) {
		if err = p.exp.Export(ctx, b); err != nil {
			break // the rest would fail the same way; the next push sends current values
		}
	}
	if err != nil {
		p.metrics.Exports.WithLabelValues(ResultFailure).Inc()
		p.failures++
		if p.failures == 1 {
			p.log.Warn("OTLP push failed; the batch is dropped and the next push sends current values (further failures are logged at debug level)", "err", err)
		} else {
			p.log.Debug("OTLP push failed", "err", err, "consecutive_failures", p.failures)
		}
		return err
	}
	p.metrics.Exports.WithLabelValues(ResultSuccess).Inc()
	if p.failures > 0 {
		p.log.Info("OTLP push recovered", "failed_pushes", p.failures)
		p.failures = 0
	}
	return nil
}
