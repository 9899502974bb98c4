package chartcheck

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/profi-dev/profi/internal/breaker"
	"github.com/profi-dev/profi/internal/collector"
	"github.com/profi-dev/profi/internal/nvml"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// described returns every family the agent's collectors describe (what
// cmd/profi registers), with its variable labels. A native histogram family
// X also yields X_bucket (+ le), X_sum and X_count.
func described(t *testing.T) map[string][]string {
	t.Helper()
	var cs []prometheus.Collector
	cs = append(cs, collector.New(collector.Data{}), collector.NewGPU(func() *nvml.Snapshot { return nil }))
	cs = append(cs, collector.NewSelf().Collectors()...)
	cs = append(cs, collector.NewHTTP().Collectors()...)
	cs = append(cs, breaker.New(breaker.Options{}))
	cs = append(cs, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	ch := make(chan *prometheus.Desc, 4096)
	for _, c := range cs {
		c.Describe(ch)
	}
	close(ch)
	re := regexp.MustCompile(`fqName: "([^"]+)".*variableLabels: \{([^}]*)\}`)
	out := map[string][]string{}
	for d := range ch {
		m := re.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("cannot read %s", d)
		}
		var labels []string
		for _, l := range strings.Split(m[2], ",") {
			if l = strings.TrimSpace(l); l != "" {
				labels = append(labels, l)
			}
		}
		out[m[1]] = labels
	}
	return out
}

// queryable expands described families into the series names PromQL sees.
func queryable(fams map[string][]string) map[string][]string {
	out := map[string][]string{}
	for name, labels := range fams {
		out[name] = labels
		// Histograms (native or not) are exposed with these suffixes; for
		// families that are not histograms the extra names are harmless,
		// since a query on them would still find no series in the scrape test.
		if strings.HasSuffix(name, "_seconds") {
			out[name+"_bucket"] = append(slices.Clone(labels), "le")
			out[name+"_sum"] = labels
			out[name+"_count"] = labels
		}
	}
	// Series Prometheus adds itself, for the job's targets.
	out["up"] = nil
	out["scrape_duration_seconds"] = nil
	return out
}

// Families the rules query that the agent does not emit yet, with the issue
// that adds them. The test fails once one is emitted, so the list shrinks.
var pending = map[string]string{}

// A selector found in a PromQL expression: a metric name, the labels its
// matchers use, and the labels of by/without/on clauses of the expression.
type selector struct {
	metric string
	labels []string
}

var (
	promqlKeywords = map[string]bool{
		"sum": true, "min": true, "max": true, "avg": true, "count": true, "stddev": true, "stdvar": true,
		"topk": true, "bottomk": true, "quantile": true, "group": true, "count_values": true,
		"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
		"and": true, "or": true, "unless": true, "bool": true, "offset": true,
		"label_values": true,
	}
	tokenRE = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|\[[^\]]*\]|[A-Za-z_:][A-Za-z0-9_:]*|\$[A-Za-z_]+|[0-9.]+(?:e[-+]?[0-9]+)?|=~|!~|!=|==|>=|<=|[{}(),=<>+*/^-]`)
)

// parseQuery extracts the selectors and grouping labels of a PromQL
// expression. Good enough for our own queries: no strings with braces, no
// subqueries; an unknown function is a metric name and fails the test.
func parseQuery(q string) (sels []selector, grouping []string) {
	toks := tokenRE.FindAllString(q, -1)
	for i := 0; i < len(toks); i++ {
		tok := toks[i]
		next := ""
		if i+1 < len(toks) {
			next = toks[i+1]
		}
		switch {
		case promqlKeywords[tok] && next == "(" && (tok == "by" || tok == "without" || tok == "on" || tok == "ignoring" || tok == "group_left" || tok == "group_right"):
			j := i + 2
			for ; j < len(toks) && toks[j] != ")"; j++ {
				if toks[j] != "," {
					grouping = append(grouping, toks[j])
				}
			}
			i = j
		case promqlKeywords[tok] || functions[tok]:
		case regexp.MustCompile(`^[A-Za-z_:][A-Za-z0-9_:]*$`).MatchString(tok) && next != "(":
			s := selector{metric: tok}
			if next == "{" {
				j := i + 2
				for ; j < len(toks) && toks[j] != "}"; j++ {
					if j+1 < len(toks) && slices.Contains([]string{"=", "!=", "=~", "!~"}, toks[j+1]) {
						s.labels = append(s.labels, toks[j])
					}
				}
				i = j
			}
			sels = append(sels, s)
		case tok == "{":
			// label_values(metric{...}, label) handled above; a bare {…} selector is not used.
		}
	}
	return sels, grouping
}

var functions = map[string]bool{
	"rate": true, "irate": true, "increase": true, "histogram_quantile": true, "clamp_min": true,
	"clamp_max": true, "abs": true, "delta": true, "deriv": true, "label_replace": true, "vector": true,
	"absent": true, "max_over_time": true, "min_over_time": true, "avg_over_time": true, "time": true,
}

type query struct{ where, expr string }

var labelValuesRE = regexp.MustCompile(`^label_values\((.*),\s*([a-z_]+)\)$`)

func ruleQueries(t *testing.T) []query {
	pr := prometheusRule(t)
	var qs []query
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			qs = append(qs, query{g.Name + "/" + r.Record + r.Alert, r.Expr.String()})
		}
	}
	return qs
}

func dashboardJSON(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy/profi/dashboards/profi.json"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func dashboardQueries(t *testing.T) []query {
	var d struct {
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(dashboardJSON(t), &d); err != nil {
		t.Fatal(err)
	}
	var qs []query
	for _, v := range d.Templating.List {
		if m, ok := v.Query.(map[string]any); ok {
			qs = append(qs, query{"variable " + v.Name, m["query"].(string)})
		}
	}
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			qs = append(qs, query{"panel " + p.Title, tg.Expr})
		}
	}
	return qs
}

// TestQueriesUseEmittedNames checks every metric and label that the rules
// and the dashboard query against the families the agent's collectors
// describe: no query can silently return nothing because of a wrong name
// or a label the series lack (the Rust exporter's dashboard had such queries).
func TestQueriesUseEmittedNames(t *testing.T) {
	fams := queryable(described(t))
	for name := range pending {
		if _, ok := fams[name]; ok {
			t.Errorf("%s is emitted now: remove it from pending", name)
		}
		fams[name] = []string{"reason"}
	}
	// Recording rules are queryable with their by labels.
	for _, q := range ruleQueries(t) {
		if strings.HasPrefix(q.where, "profi.recording/") {
			_, by := parseQuery(q.expr)
			fams[strings.TrimPrefix(q.where, "profi.recording/")] = slices.DeleteFunc(by, func(l string) bool { return l == "le" })
		}
	}
	// Labels Prometheus adds to every scraped series.
	target := []string{"instance", "job"}
	qs := append(ruleQueries(t), dashboardQueries(t)...)
	used := map[string]bool{}
	for _, q := range qs {
		expr := q.expr
		// label_values(selector, label): the selector is a query, the label one of its labels.
		if m := labelValuesRE.FindStringSubmatch(expr); m != nil {
			expr = m[1]
		}
		sels, grouping := parseQuery(expr)
		if len(sels) == 0 {
			t.Errorf("%s: no metric found in %q", q.where, q.expr)
		}
		var union []string
		for _, s := range sels {
			labels, ok := fams[s.metric]
			if !ok {
				t.Errorf("%s: metric %s is not emitted by the agent (query %q)", q.where, s.metric, q.expr)
				continue
			}
			used[s.metric] = true
			union = append(union, labels...)
			for _, l := range s.labels {
				if !slices.Contains(labels, l) && !slices.Contains(target, l) {
					t.Errorf("%s: %s has no label %q (labels %v)", q.where, s.metric, l, labels)
				}
			}
		}
		for _, l := range grouping {
			if !slices.Contains(union, l) && !slices.Contains(target, l) {
				t.Errorf("%s: grouping label %q is on none of %v", q.where, l, sels)
			}
		}
		if m := labelValuesRE.FindStringSubmatch(q.expr); m != nil {
			if s, _ := parseQuery(m[1]); len(s) == 1 && !slices.Contains(fams[s[0].metric], m[2]) {
				t.Errorf("%s: %s has no label %q", q.where, s[0].metric, m[2])
			}
		}
	}
	var names []string
	for n := range used {
		names = append(names, n)
	}
	sort.Strings(names)
	t.Logf("%d queries use %d metrics: %v", len(qs), len(names), names)
}

// TestDashboard validates the dashboard with grafana-foundation-sdk (strict
// unmarshal and Validate) and pins what docs/INTERFACE.md section 10 fixes: uid,
// title, variables, rows, a datasource variable (no ${DS_PROMETHEUS} import
// input), kernel panels excluding anonymous and other.
func TestDashboard(t *testing.T) {
	raw := dashboardJSON(t)
	plugins.RegisterDefaultPlugins()
	// The classic schema is what the Grafana sidecar loads from a ConfigMap;
	// dashboardv2 is for Grafana 12's new API only.
	var d dashboard.Dashboard //nolint:staticcheck // SA1019: see above
	if err := d.UnmarshalJSONStrict(raw); err != nil && err.Error() != "" {
		t.Fatalf("strict unmarshal: %v", err)
	}
	// Validate returns a typed-nil error list on success: compare its text, not nil.
	if errs := d.Validate(); errs != nil && errs.Error() != "" {
		t.Fatalf("validate: %v", errs)
	}
	if d.Uid == nil || *d.Uid != "profi-exporter" || d.Title == nil || *d.Title != "profi-exporter — GPU Profiler" {
		t.Errorf("uid %v title %v", d.Uid, d.Title)
	}
	s := string(raw)
	if strings.Contains(s, "DS_PROMETHEUS") || strings.Contains(s, "__inputs") {
		t.Error("dashboard uses an import input: the Grafana sidecar cannot resolve it")
	}
	var vars []string
	for _, v := range d.Templating.List {
		vars = append(vars, v.Name)
	}
	if want := []string{"datasource", "namespace", "pod", "gpu"}; !slices.Equal(vars, want) {
		t.Errorf("variables %v, want %v", vars, want)
	}
	var rows []string
	var generic struct {
		Panels []map[string]any `json:"panels"`
	}
	if err := json.Unmarshal(raw, &generic); err != nil {
		t.Fatal(err)
	}
	for _, p := range generic.Panels {
		if p["type"] == "row" {
			rows = append(rows, p["title"].(string))
			continue
		}
		ds, _ := p["datasource"].(map[string]any)
		if ds["uid"] != "${datasource}" {
			t.Errorf("panel %v: datasource %v, want the ${datasource} variable", p["title"], ds)
		}
		for _, tg := range p["targets"].([]any) {
			e := tg.(map[string]any)["expr"].(string)
			if strings.Contains(e, "profi_cuda_kernel_") && !strings.Contains(e, `kernel!~"anonymous|other"`) &&
				strings.Contains(p["title"].(string), "ernel") && !strings.Contains(p["title"].(string), "per pod") {
				t.Errorf("panel %v: kernel query %q does not exclude anonymous and other", p["title"], e)
			}
		}
	}
	wantRows := []string{"Health & Overview", "CUDA Runtime API", "GPU Memory", "NCCL Multi-GPU Communication",
		"CUDA Kernel Tracing", "Errors & Diagnostics", "GPU Hardware Health (NVML)", "NCCL Anomaly Detection",
		"Profiler Self-Observability",
		"CPU-bound or GPU-bound (per pod)",                                                                      // addition (issue 32)
		"GPUs held idle (per pod)", "GPU seconds per pod", "NCCL rank behind (fleet)", "Launch-bound (per pod)"} // additions (issue 43)
	if !slices.Equal(rows, wantRows) {
		t.Errorf("rows %q, want %q", rows, wantRows)
	}
	// The ConfigMap carries the file unchanged, with the sidecar label.
	cm := find(render(t, ""), "ConfigMap")
	if len(cm) != 1 || cm[0].GetLabels()["grafana_dashboard"] != "1" || cm[0].GetAnnotations()["grafana_folder"] != "GPU / profi" {
		t.Fatalf("dashboard ConfigMap %v", cm)
	}
	data, _, _ := unstructuredString(cm[0].Object, "data", "profi.json")
	if strings.TrimSpace(data) != strings.TrimSpace(s) {
		t.Error("ConfigMap profi.json differs from deploy/profi/dashboards/profi.json")
	}
}

// TestMetricsDocumented fails when the agent emits a family that
// docs/METRICS.md does not document: every family the collectors describe,
// and every profi_ name literal in the agent's non-test code.
func TestMetricsDocumented(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(repoRoot(t), "docs/METRICS.md"))
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]string{}
	for n := range described(t) {
		if strings.HasPrefix(n, "profi_") {
			names[n] = "collector"
		}
	}
	lit := regexp.MustCompile(`"(profi_[a-z0-9_]+)"`)
	prefixes := map[string]bool{}
	for n := range names {
		for i := range n {
			if n[i] == '_' {
				prefixes[n[:i]] = true
			}
		}
	}
	for _, dir := range []string{"internal", "cmd"} {
		_ = filepath.WalkDir(filepath.Join(repoRoot(t), dir), func(p string, e os.DirEntry, err error) error {
			if err != nil || e.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") || strings.Contains(p, "testutil") {
				return err
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			for _, m := range lit.FindAllStringSubmatch(string(b), -1) {
				// Prefixes the code extends (profi_cuda_duration + "_seconds", profi_system_).
				if strings.HasSuffix(m[1], "_") || prefixes[m[1]] {
					continue
				}
				if _, ok := names[m[1]]; !ok {
					names[m[1]] = p
				}
			}
			return nil
		})
	}
	documented := func(n string) bool {
		if strings.Contains(string(doc), "`"+n+"`") {
			return true
		}
		// Sibling families written as suffixes in the same table row:
		// "`profi_x_bucket_total`, `_sum_seconds_total`, `profi_x_seconds`".
		for _, suffix := range []string{"_sum_seconds_total", "_count_total", "_seconds"} {
			base, ok := strings.CutSuffix(n, suffix)
			if !ok {
				continue
			}
			for _, line := range strings.Split(string(doc), "\n") {
				if strings.Contains(line, "`"+base+"_") && (strings.Contains(line, "`"+suffix+"`") || strings.Contains(line, "`"+base+suffix+"`")) {
					return true
				}
			}
		}
		return false
	}
	for _, n := range sortedKeys(names) {
		if !documented(n) {
			t.Errorf("%s (from %s) is not documented in docs/METRICS.md", n, names[n])
		}
	}
	t.Logf("%d families checked", len(names))
}
