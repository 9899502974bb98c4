// Package budget enforces --overhead-budget: it estimates what profi's
// probes cost each traced process (probe hits × measured cost per hit)
// as a share of the process's CPU time and, above the budget, duty-cycles
// the hot probes of the library files that process maps: detached for part
// of every cycle, so the trap cost stops while they are off.
//
// The cost per hit is a trap cost calibrated at start-up on a probe of the
// agent's own (Calibrate) plus the average run time of profi's BPF
// programs from the kernel's BPF run-time statistics. Hits per process come
// from the pid_hits BPF map. Counts measured while a file is duty-cycled
// are scaled by the aggregator (Scale) and exported as estimates, with the
// sampling ratio per process.
package budget
