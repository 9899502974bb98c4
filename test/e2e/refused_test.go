package e2e

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/profi-dev/profi/internal/testutil"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// refusedStatus is the part of /status the refused-probe tests read.
type refusedStatus struct {
	AttachedLibraries []struct {
		Library string `json:"library"`
		Path    string `json:"path"`
		PIDs    []int  `json:"pids"`
		Probes  []struct {
			Symbol    string `json:"symbol"`
			Offset    uint64 `json:"offset"`
			Placement string `json:"placement"`
		} `json:"probes"`
		Refused []struct {
			Symbol     string `json:"symbol"`
			Reason     string `json:"reason"`
			Offset     uint64 `json:"offset"`
			FileOffset uint64 `json:"file_offset"`
			Code       string `json:"code"`
		} `json:"refused_probes"`
	} `json:"attached_libraries"`
	AttachFailures []struct {
		Path     string `json:"path"`
		Reason   string `json:"reason"`
		Error    string `json:"error"`
		Attempts int    `json:"attempts"`
	} `json:"attach_failures"`
}

// waitRuntimeSeen waits until the agent has attached the driver for pid
// and tried the runtime at path (attached or failed): the state a pass
// leaves, whatever its outcome.
func waitRuntimeSeen(t *testing.T, a *testutil.Agent, pid int, path string) refusedStatus {
	t.Helper()
	var st refusedStatus
	err := testenv.Eventually(15*time.Second, func() error {
		st = refusedStatus{}
		if err := a.Status(&st); err != nil {
			return err
		}
		driver, runtime := false, false
		for _, l := range st.AttachedLibraries {
			driver = driver || l.Library == "libcuda.so" && slices.Contains(l.PIDs, pid)
			runtime = runtime || l.Path == path
		}
		for _, f := range st.AttachFailures {
			runtime = runtime || f.Path == path
		}
		if !driver || !runtime {
			return fmt.Errorf("pid %d: driver attached %v, runtime %s tried %v; status %+v", pid, driver, path, runtime, st)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// graphLaunchesInDriver is what the agent counts of gt when the runtime's
// cudaGraphLaunch is not probed: the stub runtime implements it with
// cuGraphLaunch on the same thread, which the driver probe then counts as
// an outer call (same stream, same return code), so those calls appear
// as cuGraphLaunch.
func graphLaunchesInDriver(gt *testutil.GroundTruth) *testutil.GroundTruth {
	out := *gt
	out.Calls, out.CallsByStream, out.Errors = maps.Clone(gt.Calls), maps.Clone(gt.CallsByStream), maps.Clone(gt.Errors)
	const from, to = "cudaGraphLaunch", "cuGraphLaunch"
	out.Calls[to] += out.Calls[from]
	delete(out.Calls, from)
	for _, m := range []*map[string]map[string]uint64{&out.CallsByStream, &out.Errors} {
		merged := maps.Clone((*m)[to])
		if merged == nil {
			merged = map[string]uint64{}
		}
		for k, n := range (*m)[from] {
			merged[k] += n
		}
		if len(merged) > 0 {
			(*m)[to] = merged
		}
		delete(*m, from)
	}
	return &out
}

// runtimeCalls sums profi_cuda_calls_total of the runtime's functions for
// pid, and counts the functions.
func runtimeCalls(mfs map[string]*dto.MetricFamily, pid int) (calls float64, funcs int) {
	seen := map[string]bool{}
	for _, s := range testutil.Samples(mfs["profi_cuda_calls_total"]) {
		if op := s.Labels["operation"]; s.Labels["pid"] == strconv.Itoa(pid) && (strings.HasPrefix(op, "cuda") || strings.HasPrefix(op, "__cuda")) {
			calls += s.Value
			seen[op] = true
		}
	}
	return calls, len(seen)
}

// runtimeAttachFailures returns profi_system_attach_failures_total of
// libcudart by reason, less the harness's own --cudart /nonexistent
// (open_failed).
func runtimeAttachFailures(t *testing.T, a *testutil.Agent) map[string]float64 {
	t.Helper()
	mfs, err := a.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, s := range testutil.Samples(mfs["profi_system_attach_failures_total"]) {
		if s.Labels["library"] == "libcudart.so" {
			out[s.Labels["reason"]] += s.Value
		}
	}
	delete(out, "open_failed")
	return out
}

// Issue 17 item 2: a runtime whose cudaGraphLaunch starts with a
// lock-prefixed instruction, on which the kernel refuses uprobes. With
// uprobe_multi one refused address failed the link of the whole file, so
// every runtime function was counted 0 and the attach retried forever.
// Now the refused function alone is left out and reported (reason,
// offset), every other function of the library is counted exactly, with
// uprobe_multi and with classic uprobes.
func TestRefusedProbeLeavesTheRestOfTheLibrary(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"uprobe_multi", nil},
		{"classic uprobes", []string{"--no-uprobe-multi"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := startAgent(t, tc.args...)
			lib := fixtures.CudartLocked
			w := startWorkload(t, fixtures.WorkloadDlopen, append([]string{"--lib", lib, "--lib-cuda", fixtures.Cuda}, mixArgs...))
			if err := w.Load(); err != nil {
				t.Fatal(err)
			}
			waitRuntimeSeen(t, a, w.PID, lib)
			gt := runPhase(t, w)
			if gt.Calls["cudaGraphLaunch"] == 0 {
				t.Fatal("the workload made no cudaGraphLaunch call: the test proves nothing")
			}
			mfs := requireExact(t, a, expected([]*testutil.GroundTruth{graphLaunchesInDriver(gt)}), w.PID)
			n, fns := runtimeCalls(mfs, w.PID)
			t.Logf("exact: %.0f runtime calls of %d functions; cudaGraphLaunch's %d calls counted as the driver's cuGraphLaunch", n, fns, gt.Calls["cudaGraphLaunch"])

			var st refusedStatus
			if err := a.Status(&st); err != nil {
				t.Fatal(err)
			}
			if len(st.AttachFailures) != 0 {
				t.Errorf("attach failures %+v, want none", st.AttachFailures)
			}
			found := false
			for _, l := range st.AttachedLibraries {
				if l.Path != lib {
					continue
				}
				found = true
				for _, p := range l.Probes {
					if p.Symbol == "cudaGraphLaunch" {
						t.Errorf("cudaGraphLaunch listed as probed: %+v", p)
					}
				}
				if len(l.Refused) != 1 {
					t.Fatalf("refused probes %+v, want cudaGraphLaunch only", l.Refused)
				}
				r := l.Refused[0]
				if r.Symbol != "cudaGraphLaunch" || r.Reason != "lock_prefix" || r.Offset != 0 || r.FileOffset == 0 || !strings.HasPrefix(r.Code, "f00fc10d") {
					t.Errorf("refused probe %+v, want cudaGraphLaunch, lock_prefix at +0, code f00fc10d… (lock xadd %%ecx)", r)
				}
			}
			if !found {
				t.Fatalf("%s not attached: %+v", lib, st)
			}
			if got := runtimeAttachFailures(t, a); !maps.Equal(got, map[string]float64{"probe_refused": 1}) {
				t.Errorf("libcudart attach failures by reason %v, want probe_refused 1", got)
			}
		})
	}
}

// The same lock-prefixed entry, but the instruction ("lock incl" on a
// global, 7 bytes) changes neither the stack pointer nor an argument
// register: the probe goes on the next instruction, where arguments and
// return address are those of the entry, and every call, cudaGraphLaunch
// included, is counted exactly.
func TestRefusedProbeMovedPastInstruction(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"uprobe_multi", nil},
		{"classic uprobes", []string{"--no-uprobe-multi"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := startAgent(t, tc.args...)
			lib := fixtures.CudartLockedMovable
			w := startWorkload(t, fixtures.WorkloadDlopen, append([]string{"--lib", lib, "--lib-cuda", fixtures.Cuda}, mixArgs...))
			if err := w.Load(); err != nil {
				t.Fatal(err)
			}
			waitRuntimeSeen(t, a, w.PID, lib)
			gt := runPhase(t, w)
			mfs := requireExact(t, a, expected([]*testutil.GroundTruth{gt}), w.PID)
			n, fns := runtimeCalls(mfs, w.PID)
			t.Logf("exact: %.0f runtime calls of %d functions, cudaGraphLaunch's %d included", n, fns, gt.Calls["cudaGraphLaunch"])

			var st refusedStatus
			if err := a.Status(&st); err != nil {
				t.Fatal(err)
			}
			checked := false
			for _, l := range st.AttachedLibraries {
				if l.Path != lib {
					continue
				}
				if len(l.Refused) != 0 {
					t.Errorf("refused probes %+v, want none", l.Refused)
				}
				for _, p := range l.Probes {
					want, placement := uint64(0), ""
					if p.Symbol == "cudaGraphLaunch" {
						want, placement, checked = 7, "past_refused_instruction", true
					}
					if p.Offset != want || p.Placement != placement {
						t.Errorf("probe %+v: want offset %d, placement %q", p, want, placement)
					}
				}
			}
			if !checked {
				t.Fatalf("cudaGraphLaunch of %s not probed: %+v", lib, st)
			}
			if got := runtimeAttachFailures(t, a); len(got) != 0 {
				t.Errorf("libcudart attach failures by reason %v, want none", got)
			}
		})
	}
}
