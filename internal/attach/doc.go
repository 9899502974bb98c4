// Package attach owns the uprobe links. Probe sets are data (ops.Probes); the
// Attacher attaches them once per library file, keyed by the (device,
// inode) that /proc/PID/maps reports, because a uprobe on a file fires in
// every process that maps it. Links are released when no process maps the
// file any more. Failed attaches are retried with backoff and reported with
// a reason; no failure stops the agent.
//
// The Attacher has one owner goroutine (the discovery loop) that calls Sync
// and Close; Status and Counters may be called from any goroutine, and
// WatchLoads and WatchLearning run on goroutines of their own.
//
// Where to probe inside a file and how a probe set becomes links, per
// architecture, is package uprobe's. The Attacher writes the maps that say
// which processes and runtime ranges it serves (pid_files), reads
// only the handover's learning maps (rt_sites, rt_ops: handover.go) and
// two rings, the loader's (WatchLoads) and the handover's wake-ups
// (WatchLearning), and never an aggregation map (package
// aggregate reads those). It must not scan /proc (package discover does).
//
// attacher.go holds the Attacher's types, lifecycle and the policy of a
// pass (Sync); each other concern (opening files, linking, full-mode
// upgrades, the budget's pause, the process maps, traced processes, the
// handover, status, counters) has a file of its own.
package attach
