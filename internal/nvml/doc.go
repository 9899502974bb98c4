// Package nvml polls NVIDIA's management library (NVML) for GPU inventory
// and health: temperature, power, clocks, utilization, memory, volatile ECC
// totals, clock event (throttle) reasons, per-process device memory, PCIe
// throughput, NVLink error counters and XID events.
//
// Library is the subset of NVML profi calls, in NVML's own units.
// NewLibrary returns the real one (github.com/NVIDIA/go-nvml, build tags
// cgo && linux; a stub whose Init fails elsewhere). It dlopens the first of
// SearchPaths that exists: $PROFI_NVML_LIBRARY alone when set (a full path
// to libnvidia-ml.so.1), else libnvidia-ml.so.1 through the dynamic
// loader's search, then /run/nvidia/driver/usr/lib/<triplet>,
// /run/nvidia/driver/usr/lib64, /home/kubernetes/bin/nvidia/lib64 and
// /usr/local/nvidia/lib64. Every entry point beyond nvmlInit is checked
// with dlsym first, so an older driver reports ErrNotSupported instead of
// ending the process in the dynamic loader.
//
// Poller (Run) calls NVML on a separate goroutine under a timeout: a hung
// driver turns Snapshot.Up to false and no other call starts until the
// stuck one returns. Without NVML (no library, no driver) Snapshot.Up is
// false with the reason, one warning is logged and initialisation is
// retried every InitRetry. Fields a GPU does not support are skipped, not
// fatal. The Snapshot is published through an atomic pointer and is
// immutable, so scrapes never wait for a poll.
//
// The package must not format metrics (internal/collector does) nor read
// BPF maps. GPU indexes are NVML indexes, the one index space of
// docs/INTERFACE.md; gpu_uuid is the join key.
package nvml
