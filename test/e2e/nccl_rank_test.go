package e2e

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/profi-dev/profi/internal/discover"
	"github.com/profi-dev/profi/internal/testutil"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// The NCCL rank that is behind (issue 43 item 3), as a fleet sees it: two
// agents, each the agent of its own node (--node-name node-a, node-b;
// --pid keeps each to its node's rank), one Prometheus scraping both with
// the chart's rules as helm renders them (window 10s, for 0s). Two ranks
// of one communicator, each in its pod's cgroup, run a phase; then rank 0
// enters one more all-reduce, which blocks (NCCL would wait for rank 1
// there), and rank 1 never calls it. Each agent exports its rank's
// sequence exactly (the workload's own count of collectives on the
// communicator), and ProfiNCCLRankBehind names rank 1's pod and node, and
// nothing else.
func TestNCCLRankBehind(t *testing.T) {
	testutil.RequireBPF(t)
	rules := chartRules(t, "prometheusRule.alerts.ncclRankBehind.window=10s", "prometheusRule.alerts.ncclRankBehind.for=0s")
	s := podWatchServer(t)
	type node struct {
		name, pod string
		rank      *testutil.NCCLWorkload
		agent     *testutil.Agent
	}
	nodes := []*node{{name: "node-a", pod: "train-0"}, {name: "node-b", pod: "train-1"}}
	for i, n := range nodes {
		id := randomContainerID(t)
		pod := createPodOn(t, s.Client(), n.name, "ml", n.pod, "trainer", id)
		_, dir := podCgroup(t, "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"+
			strings.ReplaceAll(string(pod.UID), "-", "_")+".slice/cri-containerd-"+id+".scope")
		w, err := testutil.StartNCCL(context.Background(), fixtures.NcclWorkload, testutil.NCCLArgs(i, len(nodes)),
			testutil.WithWrapper("sh", "-c", `echo $$ > "$0/cgroup.procs" && exec "$@"`, dir))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(w.Kill)
		n.rank = w
		n.agent = startAgentWith(t, testutil.StartAgentServing, "--node-name", n.name, "--pid", strconv.Itoa(w.PID))
	}
	for _, n := range nodes {
		waitLibAttached(t, n.agent, n.rank.PID, discover.LibNCCL)
	}
	id, comm := "", ""
	for _, n := range nodes {
		in, err := n.rank.InitWithID(id)
		if err != nil {
			t.Fatalf("init: %v\n%s", err, n.rank.Stderr())
		}
		id, comm = in.ID, in.CommHash
	}
	var gts []*testutil.NCCLGroundTruth
	for _, n := range nodes {
		gt, err := n.rank.Go()
		if err != nil {
			t.Fatalf("go: %v\n%s", err, n.rank.Stderr())
		}
		if gt.Collectives == 0 {
			t.Fatalf("rank %d made no collective on the communicator", gt.Rank)
		}
		gts = append(gts, gt)
	}
	if err := nodes[0].rank.Block("ncclAllReduce"); err != nil {
		t.Fatal(err)
	}

	// Each agent: its rank's entered and returned collectives, exactly.
	for i, n := range nodes {
		entered, returned := gts[i].Collectives, gts[i].Collectives
		if i == 0 {
			entered++ // the blocked all-reduce
		}
		labels := fmt.Sprintf("communicator=%s rank=%d nranks=2 node=%s namespace=ml pod=%s container=trainer pid=%d",
			comm, i, n.name, n.pod, n.rank.PID)
		wantSeries := map[string]float64{
			"profi_nccl_rank_collectives_entered_total " + labels:  float64(entered),
			"profi_nccl_rank_collectives_returned_total " + labels: float64(returned),
		}
		got := map[string]float64{}
		if err := testenv.Eventually(20*time.Second, func() error {
			mfs, err := n.agent.Metrics()
			if err != nil {
				return err
			}
			clear(got)
			for _, fam := range []string{"profi_nccl_rank_collectives_entered_total", "profi_nccl_rank_collectives_returned_total"} {
				for _, s := range testutil.Samples(mfs[fam]) {
					l := s.Labels
					got[fmt.Sprintf("%s communicator=%s rank=%s nranks=%s node=%s namespace=%s pod=%s container=%s pid=%s", fam,
						l["communicator"], l["rank"], l["nranks"], l["node"], l["namespace"], l["pod"], l["container"], l["pid"])] = s.Value
				}
			}
			if !maps.Equal(got, wantSeries) {
				return fmt.Errorf("rank sequence differs")
			}
			return nil
		}); err != nil {
			t.Fatalf("%s: %v\ngot  %v\nwant %v", n.name, err, got, wantSeries)
		}
		t.Logf("%s: %v", n.name, got)
	}

	// The fleet's Prometheus: the alert names rank 1, its pod and node.
	cfg := "global: {scrape_interval: 1s, evaluation_interval: 1s}\nrule_files: [" + strconv.Quote(rules) + "]\nscrape_configs:\n- job_name: profi\n  static_configs: [{targets: ["
	for i, n := range nodes {
		if i > 0 {
			cfg += ", "
		}
		cfg += strconv.Quote(strings.TrimPrefix(n.agent.URL, "http://"))
	}
	p := startPrometheusWith(t, cfg+"]}]\n")
	var firing []sample
	if err := testenv.Eventually(60*time.Second, func() error {
		var err error
		firing, err = p.query(`ALERTS{alertname="ProfiNCCLRankBehind", alertstate="firing"}`)
		if err == nil && len(firing) == 0 {
			err = fmt.Errorf("not firing yet")
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	// Kept firing: no other rank joins it over a few evaluations.
	time.Sleep(3 * time.Second)
	firing, err := p.query(`ALERTS{alertname="ProfiNCCLRankBehind", alertstate="firing"}`)
	if err != nil {
		t.Fatal(err)
	}
	if len(firing) != 1 {
		t.Fatalf("firing %+v, want exactly rank 1's alert", firing)
	}
	l := firing[0].labels
	t.Logf("firing: %v", l)
	wantLabels := map[string]string{"communicator": comm, "rank": "1", "nranks": "2", "node": "node-b", "namespace": "ml",
		"pod": "train-1", "container": "trainer", "pid": strconv.Itoa(nodes[1].rank.PID), "severity": "critical"}
	for k, v := range wantLabels {
		if l[k] != v {
			t.Errorf("alert label %s=%q, want %q (labels %v)", k, l[k], v, l)
		}
	}
	behind, err := p.query(`max by (communicator) (profi_nccl_rank_collectives_entered_total) - on (communicator) group_right () profi_nccl_rank_collectives_entered_total`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, s := range behind {
		got[s.labels["rank"]+"@"+s.labels["node"]] = s.value
	}
	if w := map[string]float64{"0@node-a": 0, "1@node-b": 1}; !maps.Equal(got, w) {
		t.Errorf("collectives behind: %v, want %v", got, w)
	}
}

// chartRules renders the chart's PrometheusRule with helm template (the
// given --set values) and writes its rule groups to a Prometheus rules
// file, whose path it returns.
func chartRules(t *testing.T, set ...string) string {
	t.Helper()
	var obj struct {
		Spec struct {
			Groups []any `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(helmTemplate(t, "templates/prometheusrule.yaml", set...), &obj); err != nil || len(obj.Spec.Groups) == 0 {
		t.Fatalf("PrometheusRule: %v (%d groups)", err, len(obj.Spec.Groups))
	}
	out, err := yaml.Marshal(map[string]any{"groups": obj.Spec.Groups})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "profi-rules.yaml")
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}
