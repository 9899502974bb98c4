package testutil

import (
	"fmt"
	"os"
	"strings"
)

// Where a test binary runs without a compiler or Go (the VMs of the kernel
// matrix, test/vm), the fixtures and the agent are built beforehand and
// named by these variables.
const (
	// FixturesEnv names a directory that BuildFixtures filled elsewhere
	// (at the same absolute path: the workloads' RUNPATH records it).
	FixturesEnv = "PROFI_FIXTURES"
	// AgentEnv names a built profi binary.
	AgentEnv = "PROFI_AGENT"
	// AgentArgsEnv holds arguments (space-separated) that the end-to-end
	// tests add to every agent they start: the kernel matrix runs the
	// same tests with --no-uprobe-multi for the classic link mode.
	AgentArgsEnv = "PROFI_E2E_AGENT_ARGS"
	// ScaleDownEnv divides the call counts of the tests that read it
	// (ScaleDown): the VMs' emulated kernels trap far slower than hardware.
	ScaleDownEnv = "PROFI_E2E_SCALE_DOWN"
)

// TestFixtures returns the fixtures named by FixturesEnv, or builds them
// into SharedDir.
func TestFixtures() (*Fixtures, error) {
	dir := os.Getenv(FixturesEnv)
	if dir == "" {
		return BuildFixtures(SharedDir())
	}
	fx := fixturesIn(dir)
	for _, p := range fx.all() {
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("testutil: %s=%s: %w", FixturesEnv, dir, err)
		}
	}
	return fx, nil
}

// TestAgent returns the agent named by AgentEnv, or builds it into dir.
func TestAgent(dir string) (string, error) {
	if p := os.Getenv(AgentEnv); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("testutil: %s: %w", AgentEnv, err)
		}
		return p, nil
	}
	return BuildAgent(dir)
}

// AgentArgs are the arguments of AgentArgsEnv.
func AgentArgs() []string { return strings.Fields(os.Getenv(AgentArgsEnv)) }

// ScaleDown divides a call count by ScaleDownEnv (1 when unset); counts
// that must keep a ratio are divided alike, and ground truth comes from
// the scaled count, so it stays exact.
func ScaleDown(n int) int {
	var d int
	if _, err := fmt.Sscan(os.Getenv(ScaleDownEnv), &d); err != nil || d < 1 {
		return n
	}
	return max(n/d, 1)
}
