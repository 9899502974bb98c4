package e2e

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/profi-dev/profi/internal/discover"
	"github.com/profi-dev/profi/internal/testutil"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// ncclProbed are the NCCL functions profi probes (attach.ncclProbes).
var ncclProbed = []string{
	"ncclAllReduce", "ncclAllGather", "ncclReduceScatter", "ncclBroadcast", "ncclReduce",
	"ncclSend", "ncclRecv", "ncclAlltoAll", "ncclGroupStart", "ncclGroupEnd", "ncclCommInitRank",
	"ncclCommInitRankConfig", "ncclCommInitAll", "ncclCommDestroy", "ncclCommAbort",
}

// startJob starts the ranks of one NCCL job, waits until profi has
// attached libnccl in each, then initialises them (rank 0 makes the unique
// id) so the agent sees every communicator's init.
func startJob(t *testing.T, a *testutil.Agent, nranks int, args func(rank int) []string) []*testutil.NCCLWorkload {
	t.Helper()
	var ranks []*testutil.NCCLWorkload
	for rank := range nranks {
		var extra []string
		if args != nil {
			extra = args(rank)
		}
		w, err := testutil.StartNCCL(context.Background(), fixtures.NcclWorkload, testutil.NCCLArgs(rank, nranks, extra...))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = w.Stop() })
		waitLibAttached(t, a, w.PID, discover.LibNCCL)
		ranks = append(ranks, w)
	}
	if err := testutil.InitJob(ranks); err != nil {
		t.Fatalf("init: %v", err)
	}
	return ranks
}

// series returns the value of every series of family, keyed by the given
// labels' values joined with "|".
func series(mfs map[string]*dto.MetricFamily, family string, labels ...string) map[string]float64 {
	out := map[string]float64{}
	for _, s := range testutil.Samples(mfs[family]) {
		k := ""
		for i, l := range labels {
			if i > 0 {
				k += "|"
			}
			k += s.Labels[l]
		}
		out[k] += s.Value
	}
	return out
}

// ncclExpected is what /metrics must show for the ranks' ground truths.
func ncclExpected(gts []*testutil.NCCLGroundTruth) values {
	want := values{}
	for _, gt := range gts {
		pid := strconv.Itoa(gt.PID)
		for _, op := range ncclProbed {
			if n := gt.Calls[op]; n > 0 {
				want[key("profi_nccl_calls_total", "operation="+op, "pid="+pid)] = float64(n)
				if op != "ncclGroupStart" {
					want[key("profi_nccl_duration_count_total", "operation="+op)] += float64(n)
				}
			}
			for code, n := range gt.Errors[op] {
				want[key("profi_cuda_errors_total", "operation="+op, "pid="+pid, "error_code="+code)] = float64(n)
			}
		}
		for op, b := range gt.Bytes {
			if gt.Calls[op] > 0 {
				want[key("profi_nccl_bytes_total", "operation="+op, "pid="+pid)] = float64(b)
			}
		}
		want[key("profi_nccl_communicator_info", "pid="+pid, "communicator="+gt.CommHash,
			"rank="+strconv.Itoa(gt.Rank), "nranks="+strconv.Itoa(gt.NRanks))] = 1
	}
	return want
}

// ncclObserved reads the same families from /metrics for the given pids.
func ncclObserved(mfs map[string]*dto.MetricFamily, pids []int) values {
	got := values{}
	own := map[string]bool{}
	for _, p := range pids {
		own[strconv.Itoa(p)] = true
	}
	add := func(family string, labels ...string) {
		for _, s := range testutil.Samples(mfs[family]) {
			if pid, ok := s.Labels["pid"]; ok && !own[pid] {
				continue
			}
			if family == "profi_cuda_errors_total" && !strings.HasPrefix(s.Labels["operation"], "nccl") {
				continue
			}
			got[key(family, pick(s.Labels, labels)...)] += s.Value
		}
	}
	add("profi_nccl_calls_total", "operation", "pid")
	add("profi_nccl_bytes_total", "operation", "pid")
	add("profi_cuda_errors_total", "operation", "pid", "error_code")
	add("profi_nccl_duration_count_total", "operation")
	add("profi_nccl_communicator_info", "pid", "communicator", "rank", "nranks")
	return got
}

func requireNCCLExact(t *testing.T, a *testutil.Agent, gts []*testutil.NCCLGroundTruth) map[string]*dto.MetricFamily {
	t.Helper()
	want := ncclExpected(gts)
	var pids []int
	for _, gt := range gts {
		pids = append(pids, gt.PID)
	}
	var mfs map[string]*dto.MetricFamily
	err := testenv.Eventually(10*time.Second, func() error {
		var err error
		if mfs, err = a.Metrics(); err != nil {
			return err
		}
		if d := diff(want, ncclObserved(mfs, pids)); d != "" {
			return fmt.Errorf("NCCL metrics differ from the ground truth:\n%s", d)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return mfs
}

// Two ranks of one job: every probed call, byte and error code is exact
// per rank, the latency histogram counts every timed call, and each rank's
// communicator carries NCCL's commHash, its rank and the job size. The
// same with classic uprobes (a kernel without uprobe_multi).
func TestNCCLExact(t *testing.T) {
	for _, tc := range []struct {
		name  string
		args  []string
		multi bool
	}{
		{"uprobe_multi", nil, true},
		{"classic uprobes", []string{"--no-uprobe-multi"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := startAgent(t, tc.args...)
			ranks := startJob(t, a, 2, func(int) []string { return []string{"--iters", "12"} })
			var gts []*testutil.NCCLGroundTruth
			for _, w := range ranks {
				gt, err := w.Go()
				if err != nil {
					t.Fatalf("go: %v\n%s", err, w.Stderr())
				}
				gts = append(gts, gt)
			}
			requireNCCLExact(t, a, gts)

			var st struct {
				AttachedLibraries []struct {
					Library     string `json:"library"`
					UprobeMulti bool   `json:"uprobe_multi"`
				} `json:"attached_libraries"`
			}
			if err := a.Status(&st); err != nil {
				t.Fatal(err)
			}
			for _, l := range st.AttachedLibraries {
				if l.Library == "libnccl.so" && l.UprobeMulti != tc.multi {
					t.Errorf("libnccl attached with uprobe_multi = %v, want %v", l.UprobeMulti, tc.multi)
				}
			}
		})
	}
}

// ncclHealth is the hang state of one process on /metrics.
type ncclHealth struct {
	stale  float64
	hangs  map[string]float64 // operation -> profi_nccl_hang_detected_total
	oldest map[string]float64 // operation -> profi_nccl_oldest_inflight_seconds
}

func readHealth(t *testing.T, a *testutil.Agent, pid int) ncclHealth {
	t.Helper()
	mfs, err := a.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	h := ncclHealth{hangs: map[string]float64{}, oldest: map[string]float64{}}
	for _, s := range testutil.Samples(mfs["profi_nccl_stale_entries"]) {
		h.stale = s.Value
	}
	for fam, m := range map[string]map[string]float64{"profi_nccl_hang_detected_total": h.hangs, "profi_nccl_oldest_inflight_seconds": h.oldest} {
		for _, s := range testutil.Samples(mfs[fam]) {
			if s.Labels["pid"] == strconv.Itoa(pid) {
				m[s.Labels["operation"]] = s.Value
			}
		}
	}
	return h
}

// A rank blocked in a collective longer than --nccl-hang-timeout raises
// the stale gauge and its oldest in-flight age, and the hang counter by
// exactly one however many checks see it; when the call returns, the
// gauges clear and the counter stays at one.
func TestNCCLHangCountedOnce(t *testing.T) {
	a := startAgent(t, "--nccl-hang-timeout", "1")
	ranks := startJob(t, a, 2, nil)
	w := ranks[0]
	done := make(chan error, 1)
	go func() {
		_, err := w.Hang(4*time.Second, "ncclAllGather")
		done <- err
	}()
	err := testenv.Eventually(3500*time.Millisecond, func() error {
		h := readHealth(t, a, w.PID)
		if h.stale != 1 || h.hangs["ncclAllGather"] != 1 || h.oldest["ncclAllGather"] < 1 {
			return fmt.Errorf("during the hang: %+v; want stale 1, one hang, oldest >= 1 s", h)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // more checks after the call returned
	h := readHealth(t, a, w.PID)
	if h.stale != 0 || len(h.oldest) != 0 || h.hangs["ncclAllGather"] != 1 || len(h.hangs) != 1 {
		t.Errorf("after the hang: %+v; want stale 0, no oldest series, exactly one ncclAllGather hang", h)
	}
}

// Killing a rank while it is blocked inside a collective clears its state:
// the stale gauge drops to 0 and its series go, so no alert keeps firing.
func TestNCCLKilledRankClearsHang(t *testing.T) {
	a := startAgent(t, "--nccl-hang-timeout", "1")
	ranks := startJob(t, a, 2, nil)
	w := ranks[1]
	if err := w.Block("ncclAllReduce"); err != nil {
		t.Fatal(err)
	}
	if err := testenv.Eventually(5*time.Second, func() error {
		if h := readHealth(t, a, w.PID); h.stale != 1 || h.hangs["ncclAllReduce"] != 1 {
			return fmt.Errorf("blocked rank: %+v; want stale 1, one hang", h)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	w.Kill()
	if err := testenv.Eventually(5*time.Second, func() error {
		if h := readHealth(t, a, w.PID); h.stale != 0 || len(h.hangs) != 0 || len(h.oldest) != 0 {
			return fmt.Errorf("killed rank: %+v; want stale 0 and no series of pid %d", h, w.PID)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// The straggler ratio compares a rank with the other ranks of its own
// communicator: in a 2-rank job whose rank 1 takes 2 ms per data call, rank
// 1's ratio is far above 1 and rank 0's far below; a single-rank job on the
// same node has no peers, so no ratio.
func TestNCCLStragglerPerCommunicator(t *testing.T) {
	a := startAgent(t, "--gc-interval", "2")
	job := startJob(t, a, 2, func(rank int) []string {
		if rank == 1 {
			return []string{"--iters", "4", "--delay-ns", "2000000"}
		}
		return []string{"--iters", "4"}
	})
	alone := startJob(t, a, 1, func(int) []string { return []string{"--iters", "4"} })
	for _, w := range append(job, alone...) {
		go func() { _, _ = w.Go() }()
	}
	pid := func(w *testutil.NCCLWorkload) string { return strconv.Itoa(w.PID) }
	err := testenv.Eventually(15*time.Second, func() error {
		mfs, err := a.Metrics()
		if err != nil {
			return err
		}
		r := series(mfs, "profi_nccl_straggler_ratio", "pid", "operation")
		slow, fast := r[pid(job[1])+"|ncclAllReduce"], r[pid(job[0])+"|ncclAllReduce"]
		if slow < 5 || fast <= 0 || fast > 0.2 {
			return fmt.Errorf("ncclAllReduce ratios: slow rank %v, fast rank %v; want > 5 and in (0, 0.2] (all: %v)", slow, fast, r)
		}
		for k := range r {
			if strings.HasPrefix(k, pid(alone[0])+"|") {
				return fmt.Errorf("single-rank job has a straggler ratio %s: it has no peers", k)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
