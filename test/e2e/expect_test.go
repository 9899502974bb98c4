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
)

// timedOps are the operations with a return probe: their calls feed the
// latency histograms (anonymous launches are counted, not timed).
var timedOps = []string{"cudaMalloc", "cudaFree", "cudaMemcpy", "cudaMemcpyAsync", "cudaMallocAsync", "cudaFreeAsync", "cudaGraphLaunch", "cudaGraphInstantiate"}

// streamless operations take no stream argument: all their calls are stream="default".
var streamless = []string{"cudaMalloc", "cudaFree", "cudaMemcpy", "cudaGraphInstantiate"}

// values maps "family{label=value,...}" to a value.
type values map[string]float64

func key(family string, labels ...string) string {
	return family + "{" + strings.Join(labels, ",") + "}"
}

// expected derives every series the agent must export for these
// workloads from their ground truth alone. Histogram families carry no
// pid, so they hold the sum over all processes ever run under the agent
// (histories holds earlier phases of exited processes too).
func expected(live []*testutil.GroundTruth, histories ...*testutil.GroundTruth) values {
	v := values{}
	for _, g := range live {
		pid := "pid=" + strconv.Itoa(g.PID)
		for op, n := range g.Calls {
			if slices.Contains(streamless, op) {
				v[key("profi_cuda_calls_total", "operation="+op, pid, "stream=default")] += float64(n)
			}
		}
		for op, byStream := range g.CallsByStream {
			for s, n := range byStream {
				v[key("profi_cuda_calls_total", "operation="+op, pid, "stream="+s)] += float64(n)
			}
		}
		for op, byCode := range g.Errors {
			if op == "cudaLaunchKernel" {
				continue // counted at entry in anonymous mode: the return code is not seen
			}
			for code, n := range byCode {
				v[key("profi_cuda_errors_total", "operation="+op, pid, "error_code="+code)] += float64(n)
			}
		}
		for dir, n := range g.MemcpyBytes {
			if n > 0 {
				v[key("profi_cuda_memcpy_bytes_total", "direction="+dir, pid)] += float64(n)
			}
		}
		v[key("profi_cuda_malloc_bytes_total", pid)] = float64(g.MallocBytes)
		v[key("profi_cuda_active_memory_bytes", pid)] = float64(g.ActiveBytes)
		if g.Launches > 0 {
			k := []string{"kernel=anonymous", pid}
			v[key("profi_cuda_kernel_launches_total", k...)] = float64(g.Launches)
			v[key("profi_cuda_kernel_grid_blocks_total", k...)] = float64(g.LaunchGridBlocks)
			v[key("profi_cuda_kernel_block_threads_total", k...)] = float64(g.LaunchBlockThreads)
			v[key("profi_cuda_kernel_shared_memory_bytes_total", k...)] = float64(g.LaunchSharedBytes)
		}
	}
	for _, g := range append(slices.Clone(live), histories...) {
		for _, op := range timedOps {
			if n := g.Calls[op]; n > 0 {
				v[key("profi_cuda_duration_count_total", "operation="+op)] += float64(n)
				v[key("profi_cuda_duration_bucket_total", "operation="+op, "le=+Inf")] += float64(n)
				v[key("profi_cuda_duration_seconds", "operation="+op)] += float64(n)
			}
		}
	}
	return v
}

// observed reads the same series from a scrape; per-PID families only
// for the given pids (other processes on the machine may be probed too).
func observed(mfs map[string]*dto.MetricFamily, pids ...int) values {
	v := values{}
	want := map[string]bool{}
	for _, p := range pids {
		want[strconv.Itoa(p)] = true
	}
	perPID := map[string][]string{
		"profi_cuda_calls_total":                      {"operation", "pid", "stream"},
		"profi_cuda_errors_total":                     {"operation", "pid", "error_code"},
		"profi_cuda_memcpy_bytes_total":               {"direction", "pid"}, // summed over streams
		"profi_cuda_malloc_bytes_total":               {"pid"},
		"profi_cuda_active_memory_bytes":              {"pid"},
		"profi_cuda_kernel_launches_total":            {"kernel", "pid"},
		"profi_cuda_kernel_grid_blocks_total":         {"kernel", "pid"},
		"profi_cuda_kernel_block_threads_total":       {"kernel", "pid"},
		"profi_cuda_kernel_shared_memory_bytes_total": {"kernel", "pid"},
	}
	for fam, labels := range perPID {
		for _, s := range testutil.Samples(mfs[fam]) {
			if !want[s.Labels["pid"]] {
				continue
			}
			v[key(fam, pick(s.Labels, labels)...)] += s.Value
		}
	}
	for _, s := range testutil.Samples(mfs["profi_cuda_duration_count_total"]) {
		v[key("profi_cuda_duration_count_total", "operation="+s.Labels["operation"])] += s.Value
	}
	for _, s := range testutil.Samples(mfs["profi_cuda_duration_bucket_total"]) {
		if s.Labels["le"] == "+Inf" {
			v[key("profi_cuda_duration_bucket_total", "operation="+s.Labels["operation"], "le=+Inf")] += s.Value
		}
	}
	for _, s := range testutil.Samples(mfs["profi_cuda_duration_seconds"]) {
		v[key("profi_cuda_duration_seconds", "operation="+s.Labels["operation"])] += s.Value
	}
	return v
}

func pick(labels map[string]string, names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = n + "=" + labels[n]
	}
	return out
}

// diff lists every series whose value differs, both ways.
func diff(want, got values) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if got[k] != want[k] {
			fmt.Fprintf(&b, "  %s: want %v, got %v\n", k, want[k], got[k])
		}
	}
	for _, k := range slices.Sorted(maps.Keys(got)) {
		if _, ok := want[k]; !ok {
			fmt.Fprintf(&b, "  %s: unexpected series with value %v\n", k, got[k])
		}
	}
	return b.String()
}

// requireExact waits (the agent drains every second) until the scrape
// matches the ground truth exactly, then fails with the full diff if it
// never does.
func requireExact(t *testing.T, a *testutil.Agent, want values, pids ...int) map[string]*dto.MetricFamily {
	t.Helper()
	var mfs map[string]*dto.MetricFamily
	err := testutil.Eventually(15*time.Second, func() error {
		var err error
		if mfs, err = a.Metrics(); err != nil {
			return err
		}
		if d := diff(want, observed(mfs, pids...)); d != "" {
			return fmt.Errorf("metrics differ from ground truth:\n%s", d)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return mfs
}
