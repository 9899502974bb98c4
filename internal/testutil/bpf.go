package testutil

import (
	"os"
	"testing"

	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// BPFUnavailable says why BPF tests cannot run here, or "" when they can.
func BPFUnavailable() string {
	if os.Geteuid() != 0 {
		return "needs root (CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE)"
	}
	if _, err := os.Stat("/sys/kernel/btf/vmlinux"); err != nil {
		return "needs a kernel with BTF (/sys/kernel/btf/vmlinux)"
	}
	if _, err := os.Stat("/sys/bus/event_source/devices/uprobe/type"); err != nil {
		return "needs the uprobe PMU (/sys/bus/event_source/devices/uprobe/type)"
	}
	return ""
}

// RequireBPF skips the test when BPF cannot run here, or fails it when
// PROFI_E2E=1 says it must.
func RequireBPF(tb testing.TB) {
	tb.Helper()
	if why := BPFUnavailable(); why != "" {
		if os.Getenv(testenv.E2EEnv) == "1" {
			tb.Fatalf("BPF test cannot run (%s) and %s=1 forbids skipping", why, testenv.E2EEnv)
		}
		tb.Skipf("skipping BPF test: %s (set %s=1 to make this a failure)", why, testenv.E2EEnv)
	}
}
