// Package attach owns the uprobe links. Probe sets are data (ops.Probes); the
// Attacher attaches them once per library file, keyed by the (device,
// inode) that /proc/PID/maps reports, because a uprobe on a file fires in
// every process that maps it. Links are released when no process maps the
// file any more. Failed attaches are retried with backoff and reported with
// a reason; no failure stops the agent.
//
// The Attacher has one owner goroutine (the discovery loop) that calls Sync
// and Close; Status and Counters may be called from any goroutine.
//
// It must not scan /proc (package discover does) nor read BPF maps
// (package aggregate does).
package attach
