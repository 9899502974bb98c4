package e2e

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/profi-dev/profi/internal/ops"
	statusdoc "github.com/profi-dev/profi/internal/status"
	"github.com/profi-dev/profi/internal/testutil"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// graphLaunchFuncs are the functions that replay an executable graph.
var graphLaunchFuncs = []string{"cudaGraphLaunch", "cudaGraphLaunch_ptsz", "cuGraphLaunch", "cuGraphLaunch_ptsz"}

// The operator view of CUDA graphs (/status, profi explain, profi top)
// against the graphs workload with an executable graph instantiated before
// the agent attached: every number from its ground truth (the metrics
// themselves are checked in graphs_test.go).
func TestGraphsOperatorView(t *testing.T) {
	m := mode{ops.KernelModeAnonymous, ops.ProfileFull}
	c := startClient(t, nil, fixtures.Graphs, strconv.Itoa(graphsReplays), "early")
	a := startGraphsAgent(t, m)
	var gt testutil.GraphsTruth
	pid := c.run(t, a, &gt)
	if gt.UnknownGraphReplays != graphsReplays {
		t.Fatalf("graphs ground truth %+v: want %d unknown graph replays", gt, graphsReplays)
	}
	direct, graph, captured := testutil.Sum(gt.Launches), testutil.Sum(gt.GraphKernels), testutil.Sum(gt.Captured)
	// Replays: every successful graph launch, of the early graph too.
	var replays uint64
	for _, fn := range graphLaunchFuncs {
		replays += gt.Calls[fn]
		for _, n := range gt.Errors[fn] {
			replays -= n
		}
	}
	share := float64(graph) / float64(direct+graph)

	// The process's /status entry, once its counts are final (the
	// workload is idle after its run).
	var doc statusdoc.Doc
	var p statusdoc.ProcessStatus
	err := testenv.Eventually(15*time.Second, func() error {
		doc = statusdoc.Doc{}
		if err := a.Status(&doc); err != nil {
			return err
		}
		var entries []statusdoc.ProcessStatus
		for _, e := range doc.Processes {
			if e.PID == pid {
				entries = append(entries, e)
			}
		}
		if len(entries) != 1 || entries[0].Graphs == nil {
			return fmt.Errorf("/status entries of pid %d: %+v, want one, with graphs", pid, entries)
		}
		p = entries[0]
		g := p.Graphs
		if p.Launches != direct || p.GraphKernelLaunches != graph || p.CapturedLaunches != captured {
			return fmt.Errorf("/status launches %d, graph kernel launches %d, captured launches %d; want %d, %d, %d",
				p.Launches, p.GraphKernelLaunches, p.CapturedLaunches, direct, graph, captured)
		}
		if g.GraphKernelShare == nil {
			return fmt.Errorf("/status graphs %+v: no graph_kernel_share", g)
		}
		if g.Replays != replays || g.UnknownReplays != gt.UnknownGraphReplays || *g.GraphKernelShare != share {
			return fmt.Errorf("/status graphs %+v (share %v), want %d replays, %d unknown, share %v", g, *g.GraphKernelShare, replays, gt.UnknownGraphReplays, share)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	g := p.Graphs
	if g.Graphs == 0 {
		t.Errorf("/status graphs %+v: no graph seen built", g)
	}
	if doc.UnknownGraphReplays != gt.UnknownGraphReplays {
		t.Errorf("/status unknown_graph_replays %d, want %d", doc.UnknownGraphReplays, gt.UnknownGraphReplays)
	}

	// explain's whole percent: never 100 % while some kernels ran eagerly.
	pct := fmt.Sprintf("%.0f%%", share*100)
	switch {
	case share > 0 && share < 0.01:
		pct = "<1%"
	case share < 1 && share > 0.99:
		pct = ">99%"
	}
	text, _ := profiCmd(t, "explain", "--agent", a.URL, strconv.Itoa(pid))
	for _, want := range []string{
		fmt.Sprintf("    kernels that ran: %d (%d direct launches, %d through graph replays); %d launch calls captured into graphs (they ran nothing then)\n",
			direct+graph, direct, graph, captured),
		fmt.Sprintf("    graphs: %d built (%d executable alive), %d replays (%d of them ran graphs built before profi attached or past its caps: their kernels are not counted), %s of the process's counted kernels ran through graphs\n",
			g.Graphs, g.Execs, replays, gt.UnknownGraphReplays, pct),
	} {
		if !strings.Contains(text, want) {
			t.Errorf("explain lacks %q:\n%s", want, text)
		}
	}

	// Idle since its run: no rate, no graph share; LAUNCHES counts the
	// kernels that ran.
	out, code := profiCmd(t, "top", "--agent", a.URL, "--once", "--raw", "--interval", "500ms")
	if code != 0 {
		t.Fatalf("top --once: exit %d\n%s", code, out)
	}
	if row := topRow(out, pid); len(row) < 7 || strings.Join(row[4:7], " ") != fmt.Sprintf("0.0 - %d", direct+graph) {
		t.Errorf("top row %q, want LAUNCH/S 0.0, GRAPH%% -, LAUNCHES %d:\n%s", row, direct+graph, out)
	}
}
