// Package collector exposes profi's state as Prometheus metrics. Every
// family is a const metric built at scrape time from the latest
// aggregate.Snapshot and the attach counters, so nothing goes stale, no
// per-event metric call exists, and a scrape costs O(series), not
// O(events). Metric and label names come from docs/INTERFACE.md and are
// declared here once.
package collector
