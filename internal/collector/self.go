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

// NewSelf creates the self histograms with the bounds of interface.md 5.7.
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
