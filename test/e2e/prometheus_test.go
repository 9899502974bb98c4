package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/profi-dev/profi/internal/testutil"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// prometheusServer is a real Prometheus scraping one agent every second.
type prometheusServer struct{ url string }

func startPrometheus(t *testing.T, agentURL string) *prometheusServer {
	t.Helper()
	target := strings.TrimPrefix(agentURL, "http://")
	p := startPrometheusWith(t, fmt.Sprintf("global: {scrape_interval: 1s, evaluation_interval: 1s}\nscrape_configs:\n- job_name: profi\n  static_configs: [{targets: [%q]}]\n", target))
	if err := testenv.Eventually(30*time.Second, func() error {
		v, err := p.query(`up{job="profi"}`)
		if err == nil && (len(v) != 1 || v[0].value != 1) {
			err = fmt.Errorf("up = %+v", v)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return p
}

type sample struct {
	labels map[string]string
	value  float64
}

// query runs an instant query through the HTTP API.
func (p *prometheusServer) query(expr string) ([]sample, error) {
	resp, err := http.Get(p.url + "/api/v1/query?query=" + url.QueryEscape(expr))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []struct {
				Metric map[string]string `json:"metric"`
				Value  [2]any            `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return nil, err
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("query %s: %s", expr, r.Error)
	}
	var out []sample
	for _, x := range r.Data.Result {
		s, _ := x.Value[1].(string)
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return nil, fmt.Errorf("query %s: value %v", expr, x.Value[1])
		}
		out = append(out, sample{x.Metric, v})
	}
	return out, nil
}

// promqlExample is one query of docs/NCCL-PROMQL.md.
type promqlExample struct {
	expr string
	// by is the label the results are keyed by; want the exact values
	// (nil: only the label values are checked, for rates).
	by   string
	want func(gts []*testutil.NCCLGroundTruth) map[string]float64
	keys func(gts []*testutil.NCCLGroundTruth) []string
}

func ncclOpsWith(gts []*testutil.NCCLGroundTruth, f func(gt *testutil.NCCLGroundTruth, op string) float64) map[string]float64 {
	out := map[string]float64{}
	for _, gt := range gts {
		for _, op := range ncclProbed {
			if v := f(gt, op); v > 0 {
				out[op] += v
			}
		}
	}
	return out
}

var dataOpsKeys = func(gts []*testutil.NCCLGroundTruth) []string {
	var out []string
	for _, op := range testutil.NCCLDataFuncs {
		if gts[0].Calls[op] > 0 {
			out = append(out, op)
		}
	}
	return out
}

var promqlExamples = []promqlExample{
	{
		expr: `sum by (operation) (profi_nccl_calls_total)`, by: "operation",
		want: func(gts []*testutil.NCCLGroundTruth) map[string]float64 {
			return ncclOpsWith(gts, func(gt *testutil.NCCLGroundTruth, op string) float64 { return float64(gt.Calls[op]) })
		},
	},
	{
		expr: `sum by (operation) (profi_nccl_bytes_total)`, by: "operation",
		want: func(gts []*testutil.NCCLGroundTruth) map[string]float64 {
			return ncclOpsWith(gts, func(gt *testutil.NCCLGroundTruth, op string) float64 {
				if gt.Calls[op] == 0 {
					return 0
				}
				return float64(gt.Bytes[op])
			})
		},
	},
	{
		expr: `sum by (operation) (profi_cuda_errors_total{operation=~"nccl.*", error_code!="7"})`, by: "operation",
		want: func(gts []*testutil.NCCLGroundTruth) map[string]float64 {
			return ncclOpsWith(gts, func(gt *testutil.NCCLGroundTruth, op string) float64 {
				var n uint64
				for code, c := range gt.Errors[op] {
					if code != "7" {
						n += c
					}
				}
				return float64(n)
			})
		},
	},
	{
		expr: `count by (communicator) (profi_nccl_communicator_info)`, by: "communicator",
		want: func(gts []*testutil.NCCLGroundTruth) map[string]float64 {
			return map[string]float64{gts[0].CommHash: float64(len(gts))}
		},
	},
	{
		expr: `sum by (operation) (rate(profi_nccl_bytes_total[1m]))`, by: "operation", keys: dataOpsKeys,
	},
	{
		expr: `histogram_quantile(0.99, sum by (le, operation) (rate(profi_nccl_duration_bucket_total{operation="ncclAllReduce"}[1m])))`, by: "operation",
		keys: func([]*testutil.NCCLGroundTruth) []string { return []string{"ncclAllReduce"} },
	},
	{
		expr: `max by (pid, operation) (profi_nccl_oldest_inflight_seconds) > 30`, by: "operation",
		want: func([]*testutil.NCCLGroundTruth) map[string]float64 { return map[string]float64{} },
	},
	{
		expr: `increase(profi_nccl_hang_detected_total[5m]) > 0`, by: "operation",
		want: func([]*testutil.NCCLGroundTruth) map[string]float64 { return map[string]float64{} },
	},
}

// The PromQL examples of docs/NCCL-PROMQL.md, run by a real
// Prometheus against a real agent watching a 2-rank NCCL job: the exact
// ones equal the ground truth, the rate ones return exactly the expected
// series. Every example is quoted verbatim in the document.
func TestNCCLPromQLExamples(t *testing.T) {
	doc, err := os.ReadFile("../../docs/NCCL-PROMQL.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, ex := range promqlExamples {
		if !strings.Contains(string(doc), ex.expr) {
			t.Errorf("docs/NCCL-PROMQL.md does not quote %s", ex.expr)
		}
	}
	a := startAgent(t)
	ranks := startJob(t, a, 2, func(int) []string { return []string{"--iters", "12"} })
	var gts []*testutil.NCCLGroundTruth
	for _, w := range ranks {
		gt, err := w.Go()
		if err != nil {
			t.Fatal(err)
		}
		gts = append(gts, gt)
	}
	requireNCCLExact(t, a, gts)
	p := startPrometheus(t, a.URL)
	for _, ex := range promqlExamples {
		err := testenv.Eventually(15*time.Second, func() error {
			res, err := p.query(ex.expr)
			if err != nil {
				return err
			}
			got := map[string]float64{}
			for _, s := range res {
				got[s.labels[ex.by]] = s.value
			}
			if ex.want != nil {
				want := ex.want(gts)
				if fmt.Sprint(got) != fmt.Sprint(want) {
					return fmt.Errorf("%s = %v, want %v", ex.expr, got, want)
				}
				return nil
			}
			keys := ex.keys(gts)
			if len(got) != len(keys) {
				return fmt.Errorf("%s: series %v, want one per %v", ex.expr, got, keys)
			}
			for _, k := range keys {
				if v, ok := got[k]; !ok || v < 0 {
					return fmt.Errorf("%s: series %v, want %s present and >= 0", ex.expr, got, k)
				}
			}
			return nil
		})
		if err != nil {
			t.Error(err)
		}
	}
}
