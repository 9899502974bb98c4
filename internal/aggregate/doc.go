// Package aggregate turns the cumulative BPF map values into an immutable
// Snapshot once per drain interval. It sums the per-CPU values, applies
// the cardinality caps, resolves per-process metadata, and removes every
// key of a process once it has exited.
//
// Reading is loss-free by construction: BPF values are cumulative and
// keys are deleted only after their process has exited, so no increment
// can fall between a lookup and a delete. Per-PID families disappear when
// the process exits; the latency histograms (which carry no pid label)
// keep the exited process's contribution so they never go backwards.
//
// One goroutine (Run) owns all mutable state; readers get the latest
// Snapshot through an atomic pointer and never wait for a drain.
package aggregate
