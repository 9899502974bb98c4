// Package e2e runs the real profi binary against stub CUDA libraries and
// compares its /metrics with the workloads' own ground truth, exactly.
// Everything here loads and attaches real BPF programs: it needs root and
// a kernel with uprobes (PROFI_E2E=1 turns a skip into a failure).
package e2e

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/profi-dev/profi/internal/discover"
	"github.com/profi-dev/profi/internal/testutil"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

var (
	fixtures *testutil.Fixtures
	agentBin string
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if dir := os.Getenv(mapperEnv); dir != "" {
		return mapFiles(dir)
	}
	if why := testutil.BPFUnavailable(); why == "" {
		var err error
		if fixtures, err = testutil.TestFixtures(); err != nil {
			fmt.Fprintln(os.Stderr, "build fixtures:", err)
			return 1
		}
		dir, err := os.MkdirTemp("", "profi-e2e-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		if agentBin, err = testutil.TestAgent(dir); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	return m.Run()
}

// startAgent runs profi with a 1 s discovery period (plus args) and stops
// it at the end of the test, failing the test if it did not exit cleanly.
func startAgent(t *testing.T, args ...string) *testutil.Agent {
	t.Helper()
	return startAgentWith(t, testutil.StartAgent, args...)
}

// startAgentWith is startAgent with another starter (testutil.StartAgentServing).
func startAgentWith(t *testing.T, start func(context.Context, string, ...string) (*testutil.Agent, error), args ...string) *testutil.Agent {
	t.Helper()
	testutil.RequireBPF(t)
	a, err := start(context.Background(), agentBin, append(append([]string{"--refresh-interval", "1", "--cudart", "/nonexistent/libcudart.so"}, args...), testutil.AgentArgs()...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := a.Stop(); err != nil {
			t.Errorf("agent did not exit cleanly: %v\n%s", err, a.Logs())
		}
		if t.Failed() {
			t.Logf("agent log:\n%s", a.Logs())
		}
	})
	return a
}

// startWorkload starts a fixture workload and stops it at the end of the test.
func startWorkload(t *testing.T, bin string, args []string, opts ...testutil.Option) *testutil.Workload {
	t.Helper()
	w, err := testutil.StartWorkload(context.Background(), bin, args, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Stop() })
	return w
}

// waitAttached waits until /status lists pid among the processes of an
// attached file of every CUDA library the process maps (runtime and
// driver: one pass attaches them one after the other).
func waitAttached(t *testing.T, a *testutil.Agent, pid int) {
	t.Helper()
	err := testenv.Eventually(15*time.Second, func() error {
		maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
		if err != nil {
			return err
		}
		want := map[string]bool{}
		for _, line := range strings.Split(string(maps), "\n") {
			if i := strings.Index(line, "/"); i >= 0 {
				if lib, ok := discover.Classify(line[i:]); ok && (lib == discover.LibCudart || lib == discover.LibCuda) {
					want[string(lib)] = true
				}
			}
		}
		var st status
		if err := a.Status(&st); err != nil {
			return err
		}
		found := false
		for _, l := range st.AttachedLibraries {
			if slices.Contains(l.PIDs, pid) {
				found = true
				delete(want, l.Library)
			}
		}
		if !found || len(want) > 0 {
			return fmt.Errorf("pid %d: libraries %v not attached yet; status: %+v", pid, want, st)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// status is the part of /status the tests read.
type status struct {
	AttachedLibraries []struct {
		Library string   `json:"library"`
		Path    string   `json:"path"`
		PIDs    []int    `json:"pids"`
		Missing []string `json:"missing_symbols"`
		Probes  []struct {
			Symbol string `json:"symbol"`
		} `json:"probes"`
	} `json:"attached_libraries"`
	AttachFailures  []statusFailure `json:"attach_failures"`
	TrackedPIDs     []int           `json:"tracked_pids"`
	EventsProcessed uint64          `json:"events_processed"`
	KernelMode      string          `json:"kernel_mode"`
}

type statusFailure struct {
	Library string `json:"library"`
	Path    string `json:"path"`
	PIDs    []int  `json:"pids"`
	Reason  string `json:"reason"`
	Error   string `json:"error"`
}

// countLib counts the attached library files of one library.
func countLib(st status, lib string) int {
	n := 0
	for _, l := range st.AttachedLibraries {
		if l.Library == lib {
			n++
		}
	}
	return n
}
