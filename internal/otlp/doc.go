// Package otlp pushes the agent's metrics to an OpenTelemetry collector
// (docs/INTERFACE.md §2.4, §6). It has no aggregation of its own: every push
// gathers the same prometheus.Gatherer that serves /metrics and converts
// the families (Converter), so OTLP and Prometheus always show the same
// data. The SDK exporters (otlpmetricgrpc, otlpmetrichttp) send it.
package otlp
