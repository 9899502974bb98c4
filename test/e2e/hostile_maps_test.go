package e2e

import (
	"fmt"
	"maps"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/ops"
	"github.com/profi-dev/profi/internal/testutil"
)

// Issue 30 item 2: the capture and graph maps are shared by every process
// on the node, and a process adds keys to them at will. A hostile process
// (test/workloads/hostile.c, its own libcudart.so.12) fills one while a
// victim (test/workloads/graphs.c) captures, builds and replays graphs
// after it; the victim's launches, captured launches and graph kernels
// must stay exact, the hostile process must hold exactly its share
// (bpfobj.PIDShare of the map) and every refused key be counted in
// profi_system_bpf_map_drops_total{map="pid_quota"}.

// Sizes of the capture and graph maps (bpf/maps.h): fixed, no flag.
const (
	capturesSize = 4096
	graphIDsSize = 65536
)

// hostileGraphFigures is what one scrape says about the victim's launches
// and the hostile process, for the checks and the log (the before
// and after figures).
type hostileGraphFigures struct {
	launches, captured, graphKernels float64 // the victim's, summed over kernels
	hostileCalls                     map[string]float64
	drops                            map[string]float64
}

func readHostileGraphs(mfs map[string]*dto.MetricFamily, victim, hostile int) hostileGraphFigures {
	f := hostileGraphFigures{hostileCalls: map[string]float64{}, drops: map[string]float64{}}
	v, h := strconv.Itoa(victim), strconv.Itoa(hostile)
	for fam, n := range map[string]*float64{
		"profi_cuda_kernel_launches_total":         &f.launches,
		"profi_cuda_graph_captured_launches_total": &f.captured,
		"profi_cuda_graph_kernel_launches_total":   &f.graphKernels,
	} {
		for _, s := range testutil.Samples(mfs[fam]) {
			if s.Labels["pid"] == v {
				*n += s.Value
			}
		}
	}
	for _, s := range testutil.Samples(mfs["profi_cuda_calls_total"]) {
		if s.Labels["pid"] == h {
			f.hostileCalls[s.Labels["operation"]] += s.Value
		}
	}
	for _, s := range testutil.Samples(mfs["profi_system_bpf_map_drops_total"]) {
		f.drops[s.Labels["map"]] = s.Value
	}
	return f
}

// requireGraphsBeside is requireGraphs for a victim beside a hostile
// process: the latency families carry no pid, so they hold the hostile
// process's calls too; check tests the hostile process's figures.
func requireGraphsBeside(t *testing.T, a *testutil.Agent, m mode, victim, hostile int, gt testutil.GraphsTruth,
	check func(f hostileGraphFigures) error) {
	t.Helper()
	base := graphsWant(m, victim, gt)
	newOps := graphsNewOps(m, gt)
	var last hostileGraphFigures
	var victimDiff string
	err := testutil.Eventually(20*time.Second, func() error {
		mfs, err := a.Metrics()
		if err != nil {
			return err
		}
		f := readHostileGraphs(mfs, victim, hostile)
		last = f
		got := graphsObserved(mfs, victim)
		want := maps.Clone(base)
		graphsNewOpsWant(want, got, victim, gt, newOps)
		for op, n := range f.hostileCalls {
			if _, timed := got[key("profi_cuda_duration_count_total", "operation="+op)]; !timed {
				continue
			}
			for _, k := range []string{key("profi_cuda_duration_count_total", "operation="+op),
				key("profi_cuda_duration_bucket_total", "operation="+op, "le=+Inf"),
				key("profi_cuda_duration_seconds", "operation="+op)} {
				want[k] += n
			}
		}
		if victimDiff = diff(want, got); victimDiff != "" {
			return fmt.Errorf("victim's metrics differ from its ground truth:\n%s", victimDiff)
		}
		return check(f)
	})
	t.Logf("victim: launches %v of %v, captured launches %v of %v, graph kernels %v of %v; hostile calls %v; drops pid_quota %v capture_streams %v graph_nodes %v graph_quota %v",
		last.launches, testutil.Sum(gt.Launches), last.captured, testutil.Sum(gt.Captured), last.graphKernels, testutil.Sum(gt.GraphKernels),
		last.hostileCalls, last.drops["pid_quota"], last.drops["capture_streams"], last.drops["graph_nodes"], last.drops["graph_quota"])
	if victimDiff != "" {
		t.Logf("victim: %d series differ", strings.Count(victimDiff, "\n"))
	}
	if err != nil {
		t.Fatal(err)
	}
}

// startHostileBeside starts the agent (anonymous kernel mode, full
// profile), the hostile workload and the graphs workload, and waits until
// both are attached.
func startHostileBeside(t *testing.T) (*testutil.Agent, *testutil.Workload, *client) {
	t.Helper()
	m := mode{ops.KernelModeAnonymous, ops.ProfileFull}
	a := startGraphsAgent(t, m)
	hostile := startWorkload(t, fixtures.Hostile, []string{"0"})
	victim := startClient(t, nil, fixtures.Graphs, strconv.Itoa(graphsReplays))
	waitAttached(t, a, hostile.PID)
	return a, hostile, victim
}

// One process holding 4,096 open captures (one per fake stream), the size
// of captures: before, the map was full and the victim's captures failed
// (its captured launches counted as run, its graphs empty). It holds its
// share (1,024) of captures and capture_streams; the other 3,072 captures
// are refused, each counted once.
func TestHostileOpenCaptures(t *testing.T) {
	a, hostile, victim := startHostileBeside(t)
	const n = capturesSize
	h, err := hostile.RunHostileCommand("captures " + strconv.Itoa(n))
	if err != nil || h["captures"] != n {
		t.Fatalf("hostile captures: %v %v", h, err)
	}
	var gt testutil.GraphsTruth
	pid := victim.run(t, a, &gt)
	share := float64(bpfobj.PIDShare(capturesSize))
	requireGraphsBeside(t, a, mode{ops.KernelModeAnonymous, ops.ProfileFull}, pid, hostile.PID, gt, func(f hostileGraphFigures) error {
		switch {
		case f.hostileCalls["cudaStreamBeginCapture"] != n:
			return fmt.Errorf("hostile cudaStreamBeginCapture calls %v, want %d", f.hostileCalls["cudaStreamBeginCapture"], n)
		case f.drops["pid_quota"] != n-share:
			return fmt.Errorf("pid_quota drops %v, want the refused captures %v", f.drops["pid_quota"], n-share)
		case f.drops["capture_streams"] != 0 || f.drops["graph_nodes"] != 0 || f.drops["graph_quota"] != 0:
			return fmt.Errorf("a capture or graph map filled up")
		}
		return nil
	})
}

// One process capturing into one graph and ending the capture again and
// again, its runtime handing out a new graph handle at each end: 70,000
// handles, more than graph_ids holds (65,536). Before, the map was full
// and the victim's graphs unknown (its graph kernels 0). It holds its
// share (16,384) of graph_ids: the graph it captures into and 16,383
// ended captures' handles; every other handle is refused, counted once.
func TestHostileGraphHandles(t *testing.T) {
	a, hostile, victim := startHostileBeside(t)
	const n = 70000
	h, err := hostile.RunHostileCommand("graphids " + strconv.Itoa(n))
	if err != nil || h["graphids"] != n {
		t.Fatalf("hostile graphids: %v %v", h, err)
	}
	var gt testutil.GraphsTruth
	pid := victim.run(t, a, &gt)
	share := float64(bpfobj.PIDShare(graphIDsSize))
	requireGraphsBeside(t, a, mode{ops.KernelModeAnonymous, ops.ProfileFull}, pid, hostile.PID, gt, func(f hostileGraphFigures) error {
		switch {
		case f.hostileCalls["cudaStreamBeginCaptureToGraph"] != n || f.hostileCalls["cudaStreamEndCapture"] != n:
			return fmt.Errorf("hostile calls %v, want %d captures into a graph and %d ends", f.hostileCalls, n, n)
		case f.drops["pid_quota"] != n-(share-1):
			return fmt.Errorf("pid_quota drops %v, want the refused graph handles %v", f.drops["pid_quota"], n-(share-1))
		case f.drops["capture_streams"] != 0 || f.drops["graph_nodes"] != 0 || f.drops["graph_quota"] != 0:
			return fmt.Errorf("a capture or graph map filled up")
		}
		return nil
	})
}
