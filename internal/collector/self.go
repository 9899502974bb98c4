package collector

import "github.com/prometheus/client_golang/prometheus"

// Self holds the agent's own timing histograms. They are observed once
// per scan, drain or scrape (never per CUDA call), so plain client_golang
// histograms fit.
type Self struct {
	ScanDuration   prometheus.Histogram
	DrainDuration  prometheus.Histogram
	EncodeDuration prometheus.Histogram
	EventDuration  prometheus.Histogram
}

// NewSelf creates the self histograms with the bounds of docs/INTERFACE.md 5.7.
func NewSelf() *Self {
	return &Self{
		ScanDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "profi_system_discovery_scan_duration_seconds",
			Help:    "Duration of one /proc discovery pass, attach included.",
			Buckets: []float64{0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5},
		}),
		DrainDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "profi_system_aggregated_map_drain_duration_seconds",
			Help:    "Duration of one drain of the BPF aggregation maps.",
			Buckets: []float64{1e-5, 5e-5, 1e-4, 5e-4, 0.001, 0.005, 0.01},
		}),
		EncodeDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "profi_system_prometheus_encode_duration_seconds",
			Help:    "Duration of one /metrics render.",
			Buckets: []float64{1e-4, 5e-4, 0.001, 0.005, 0.01, 0.05, 0.1},
		}),
		EventDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "profi_system_event_loop_process_duration_seconds",
			Help:    "Processing time of one events ring-buffer record (--detailed-launches).",
			Buckets: []float64{1e-6, 5e-6, 1e-5, 5e-5, 1e-4, 5e-4, 0.001},
		}),
	}
}

// Collectors returns the histograms for registration.
func (s *Self) Collectors() []prometheus.Collector {
	return []prometheus.Collector{s.ScanDuration, s.DrainDuration, s.EncodeDuration, s.EventDuration}
}

// Label values of the HTTP security self-metrics (docs/INTERFACE.md 5.7). Every
// value is initialised at zero, so a rate or an alert on a reason works
// before its first occurrence.
var (
	AuthMethods        = []string{"mtls", "bearer"}
	AuthFailureReasons = []string{
		"no_auth", "tokenreview_deny", "tokenreview_error", "audience_mismatch",
		"rate_limited",                     // Addition (docs/INTERFACE.md 5.7)
		"forbidden", "authorization_error", // Addition: --metrics-auth-authorize (SubjectAccessReview)
	}
	CacheResults     = []string{"hit", "miss"}
	HandshakeResults = []string{"ok", "bad_cert", "error"}
)

// HTTP holds the self-metrics of the /metrics listener's TLS and
// authentication. They change once per connection or request, never per
// CUDA call.
type HTTP struct {
	AuthSuccess        *prometheus.CounterVec // method
	AuthFailures       *prometheus.CounterVec // reason
	TokenReviewCache   *prometheus.CounterVec // result
	TokenReviewLatency prometheus.Histogram
	TLSHandshakes      *prometheus.CounterVec // result
	// TLSReloadFailures counts certificate, key or client CA files that
	// changed on disk but could not be loaded (the old material stays).
	TLSReloadFailures prometheus.Counter
}

// NewHTTP creates the HTTP security self-metrics with every label value at zero.
func NewHTTP() *HTTP {
	h := &HTTP{
		AuthSuccess: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "profi_system_http_auth_success_total",
			Help: "Requests to /metrics or /status authenticated, by method.",
		}, []string{"method"}),
		AuthFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "profi_system_http_auth_failures_total",
			Help: "Requests to /metrics or /status rejected, by reason.",
		}, []string{"reason"}),
		TokenReviewCache: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "profi_system_http_tokenreview_cache_total",
			Help: "Bearer token lookups in the TokenReview cache (hit: answered from a positive or negative entry).",
		}, []string{"result"}),
		TokenReviewLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "profi_system_http_tokenreview_latency_seconds",
			Help:    "Latency of one TokenReview API call.",
			Buckets: []float64{0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5},
		}),
		TLSHandshakes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "profi_system_http_tls_handshakes_total",
			Help: "TLS handshakes on the metrics listener, by result (bad_cert: missing, expired or untrusted client certificate).",
		}, []string{"result"}),
		TLSReloadFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "profi_system_http_tls_reload_failures_total",
			Help: "Changed TLS certificate, key or client CA files that could not be loaded; the previous material stays in use.",
		}),
	}
	for _, v := range AuthMethods {
		h.AuthSuccess.WithLabelValues(v)
	}
	for _, v := range AuthFailureReasons {
		h.AuthFailures.WithLabelValues(v)
	}
	for _, v := range CacheResults {
		h.TokenReviewCache.WithLabelValues(v)
	}
	for _, v := range HandshakeResults {
		h.TLSHandshakes.WithLabelValues(v)
	}
	return h
}

// Collectors returns the metrics for registration.
func (h *HTTP) Collectors() []prometheus.Collector {
	return []prometheus.Collector{h.AuthSuccess, h.AuthFailures, h.TokenReviewCache, h.TokenReviewLatency,
		h.TLSHandshakes, h.TLSReloadFailures}
}
