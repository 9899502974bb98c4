//go:build linux

package aggregate

import (
	"time"

	"golang.org/x/sys/unix"
)

// bootTime is the wall time at which CLOCK_MONOTONIC (bpf_ktime_get_ns) was 0.
func bootTime() time.Time {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return time.Time{}
	}
	return time.Now().Add(-time.Duration(ts.Nano()))
}

// monotonicNs is CLOCK_MONOTONIC in ns: the clock of bpf_ktime_get_ns.
func monotonicNs() uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0
	}
	return uint64(ts.Nano())
}
