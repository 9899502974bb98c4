package chartcheck

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/profi-dev/profi/internal/testutil"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// absentWithoutHardware are queried families a scrape on this machine
// cannot hold, and why. Everything else the rules and the dashboard query
// must be in the scrape of a real agent watching a CUDA workload, a CUDA
// graphs workload and a 2-rank NCCL job, with every label the queries use.
var absentWithoutHardware = map[string]string{
	"profi_gpu_":                           "NVML families: no NVIDIA driver on CI machines",
	"profi_nccl_straggler_ratio":           "needs a second communicator window with enough calls per rank",
	"profi_nccl_hang_detected_total":       "exported once a call hangs (test/e2e/nccl_test.go)",
	"profi_nccl_oldest_inflight_seconds":   "exported while a call is in flight (test/e2e/nccl_test.go)",
	"profi_system_probe_quarantined_files": "exported while a library file is quarantined (test/e2e/breaker_test.go)",
}

func absentOK(name string) bool {
	for p := range absentWithoutHardware {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// scraped turns a scrape into the series names PromQL sees, each with the
// union of its samples' label names.
func scraped(mfs map[string]*dto.MetricFamily) map[string][]string {
	out := map[string][]string{}
	add := func(name string, labels ...string) {
		for _, l := range labels {
			if !slices.Contains(out[name], l) {
				out[name] = append(out[name], l)
			}
		}
		if _, ok := out[name]; !ok {
			out[name] = nil
		}
	}
	for name, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName())
			}
			if mf.GetType() == dto.MetricType_HISTOGRAM {
				add(name+"_bucket", append(labels, "le")...)
				add(name+"_sum", labels...)
				add(name+"_count", labels...)
				continue
			}
			add(name, labels...)
		}
	}
	out["up"], out["scrape_duration_seconds"] = nil, nil
	return out
}

// TestQueriesAgainstARealScrape is TestQueriesUseEmittedNames against what
// a running agent really exports (full kernel mode, NVTX tracing, a CUDA
// workload and an NCCL job), not what the collectors describe: a family
// the queries use must be in the scrape with the labels they use, unless
// it needs hardware or a mode listed in absentWithoutHardware.
func TestQueriesAgainstARealScrape(t *testing.T) {
	testutil.RequireBPF(t)
	fx, err := testutil.BuildFixtures(testutil.SharedDir())
	if err != nil {
		t.Fatal(err)
	}
	bin, err := testutil.BuildAgent(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	a, err := testutil.StartAgent(ctx, bin, "--refresh-interval", "1", "--kernel-mode", "full", "--probe-profile", "full", "--cudart", "/nonexistent/libcudart.so")
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := a.Stop(); err != nil {
			t.Errorf("agent: %v\n%s", err, a.Logs())
		}
	}()
	w, err := testutil.StartWorkload(ctx, fx.Workload, []string{"--driver", "5", "--extra"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop() }()
	// test/workloads/graphs.c captures and replays CUDA graphs, so the
	// graph rules and panel are checked against series the agent emits.
	graphs := testutil.StartClient(t, nil, fx.Graphs, "20")
	// The ranks init once attached, so that the agent sees the
	// communicator's init (the rank sequence families need it).
	var ranks []*testutil.NCCLWorkload
	defer func() {
		for _, r := range ranks {
			r.Kill()
		}
	}()
	for rank := range 2 {
		r, err := testutil.StartNCCL(ctx, fx.NcclWorkload, testutil.NCCLArgs(rank, 2))
		if err != nil {
			t.Fatal(err)
		}
		ranks = append(ranks, r)
	}
	// Both attached (the NCCL ranks map libnccl), then one phase each.
	if err := testenv.Eventually(30*time.Second, func() error {
		var st struct {
			Attached []struct {
				PIDs []int `json:"pids"`
			} `json:"attached_libraries"`
		}
		if err := a.Status(&st); err != nil {
			return err
		}
		seen := map[int]bool{}
		for _, l := range st.Attached {
			for _, p := range l.PIDs {
				seen[p] = true
			}
		}
		for _, p := range []int{w.PID, graphs.PID, ranks[0].PID, ranks[1].PID} {
			if !seen[p] {
				return fmt.Errorf("pid %d not attached yet", p)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := testutil.InitJob(ranks); err != nil {
		t.Fatalf("nccl init: %v", err)
	}
	if _, err := w.Run(); err != nil {
		t.Fatalf("workload: %v\n%s", err, w.Stderr())
	}
	for _, r := range ranks {
		if _, err := r.Go(); err != nil {
			t.Fatalf("nccl rank: %v", err)
		}
	}
	graphs.Go(t)
	var fams map[string][]string
	if err := testenv.Eventually(15*time.Second, func() error {
		mfs, err := a.Metrics()
		if err != nil {
			return err
		}
		fams = scraped(mfs)
		for _, need := range []string{"profi_nccl_calls_total", "profi_nccl_rank_collectives_entered_total", "profi_cuda_launch_thread_busy_ratio", "profi_cuda_kernel_launches_total", "profi_cuda_graph_kernel_launches_total"} {
			if _, ok := fams[need]; !ok {
				return fmt.Errorf("%s not in the scrape yet", need)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, q := range ruleQueries(t) {
		if strings.HasPrefix(q.where, "profi.recording/") {
			_, by := parseQuery(q.expr)
			fams[strings.TrimPrefix(q.where, "profi.recording/")] = slices.DeleteFunc(by, func(l string) bool { return l == "le" })
		}
	}
	target := []string{"instance", "job"}
	var absent []string
	for _, q := range append(ruleQueries(t), dashboardQueries(t)...) {
		expr := q.expr
		if m := labelValuesRE.FindStringSubmatch(expr); m != nil {
			expr = m[1]
		}
		sels, _ := parseQuery(expr)
		for _, s := range sels {
			labels, ok := fams[s.metric]
			if !ok {
				if !absentOK(s.metric) {
					t.Errorf("%s: %s is not in the scrape of a running agent (query %q)", q.where, s.metric, q.expr)
				} else if !slices.Contains(absent, s.metric) {
					absent = append(absent, s.metric)
				}
				continue
			}
			for _, l := range s.labels {
				if !slices.Contains(labels, l) && !slices.Contains(target, l) {
					t.Errorf("%s: %s in the scrape has no label %q (labels %v)", q.where, s.metric, l, labels)
				}
			}
		}
	}
	sort.Strings(absent)
	t.Logf("queried but absent here, as listed: %v", absent)
}
