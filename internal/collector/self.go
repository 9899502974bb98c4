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
		"cert_not_allowed", // Addition: --metrics-tls-allowed-client-sans
	}
	// Addition: profi_system_http_refused_total{reason} (issue 17, the
	// server's Limits; server.RefusalReasons, checked equal by its tests).
	HTTPRefusalReasons = []string{"conn_limit", "conn_evicted", "handshake_evicted", "request_limit"}
	CacheResults       = []string{"hit", "miss"}
	HandshakeResults   = []string{"ok", "bad_cert", "error"}
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
	// Refused counts connections and requests refused or cut off by the
	// listener's limits; Connections is the number open (Additions).
	Refused     *prometheus.CounterVec // reason
	Connections prometheus.Gauge
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
		Refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "profi_system_http_refused_total",
			Help: "Connections, TLS handshakes and requests refused or closed by the HTTP limits, by reason.",
		}, []string{"reason"}),
		Connections: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "profi_system_http_connections",
			Help: "Connections open on the metrics listener (TLS handshakes in progress included).",
		}),
	}
	for _, v := range HTTPRefusalReasons {
		h.Refused.WithLabelValues(v)
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
		h.TLSHandshakes, h.TLSReloadFailures, h.Refused, h.Connections}
}
