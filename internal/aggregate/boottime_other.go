//go:build !linux

package aggregate

import "time"

func bootTime() time.Time { return time.Time{} }

func monotonicNs() uint64 { return 0 }
