package discover

import (
	"bytes"
	"fmt"
	"strconv"
)

// ParseTracerPID returns the TracerPid field of a /proc/PID/status file:
// the process tracing this one (gdb, strace, CRIU, a profiler), 0 for
// none. The arm64 uprobe single-step handler misbehaved for traced
// processes (issue 31, docs/KERNELS.md "Known uprobe bugs"), so whether a
// process has a tracer decides whether it may be probed. A status without
// the field, or with a malformed one, is an error.
func ParseTracerPID(status []byte) (int, error) {
	const key = "\nTracerPid:"
	i := bytes.Index(status, []byte(key))
	if i < 0 {
		if !bytes.HasPrefix(status, []byte(key[1:])) {
			return 0, fmt.Errorf("no TracerPid in status")
		}
		i = -1
	}
	rest := status[i+len(key):]
	if nl := bytes.IndexByte(rest, '\n'); nl >= 0 {
		rest = rest[:nl]
	}
	pid, err := strconv.Atoi(string(bytes.TrimSpace(rest)))
	if err != nil || pid < 0 {
		return 0, fmt.Errorf("malformed TracerPid %q", rest)
	}
	return pid, nil
}
