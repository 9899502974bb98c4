package chartcheck

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/profi-dev/profi/internal/explain"
)

// The rule names of docs/INTERFACE.md section 8, exactly: the interface's
// 13 recording rules and the additions.
var (
	wantRecording = []string{
		"profi:cuda_calls:rate5m", "profi:cuda_duration:p99:5m", "profi:cuda_duration:p50:5m",
		"profi:cuda_memcpy_bytes:rate5m", "profi:cuda_malloc_bytes:rate5m", "profi:cuda_active_memory:pod",
		"profi:memcpy_d2d_ratio", "profi:nccl_calls:rate5m", "profi:nccl_bytes:rate5m",
		"profi:nccl_duration:p99:5m", "profi:cuda_kernel_launches:rate5m",
		"profi:cuda_kernel_duration:p99:5m", "profi:cuda_errors:rate5m",
		// Addition (CUDA graphs, issue 16).
		"profi:cuda_graph_kernel_launches:rate5m", "profi:cuda_graph_kernel_ratio",
		// Addition (issue 32): CPU-bound or GPU-bound per pod.
		"profi:pod_kernels_run:rate5m", "profi:pod_api_latency:p99:5m", "profi:pod_sm_utilization",
		// Addition (issue 43): the NCCL rank that is behind.
		"profi:nccl_rank_collectives_behind",
	}
	// alert -> runbook slug (section 8.2).
	wantAlerts = map[string]string{
		"ProfiDroppedEvents": "event-loss", "ProfiRingBufferDropRate": "event-loss",
		"ProfiCardinalityDrops": "cardinality-explosion", "ProfiNoTrackedPids": "no-tracked-pids",
		"ProfiNCCLHangDetected": "nccl-hang", "ProfiNCCLStraggler": "nccl-straggler",
		"ProfiCUDAErrors": "cuda-errors", "ProfiGPUThrottling": "gpu-throttling",
		"ProfiExporterDown": "exporter-down", "ProfiEventLoopSlow": "event-loss",
		"ProfiMetricsAuthFailures": "metrics-auth-failures",
		// Addition (issue 31): the crash circuit breaker.
		"ProfiProbesQuarantined": "probe-quarantine", "ProfiProbesQuarantinedTenant": "probe-quarantine",
		// Addition (issue 32): Xid errors.
		"ProfiGPUXid": "gpu-xid",
		// Addition (issue 43): GPUs held idle.
		"ProfiGPUHeldIdle": "gpu-held-idle", "ProfiNCCLRankBehind": "nccl-rank-behind",
		"ProfiLaunchBound": "launch-bound",
	}
)

// prometheusRule decodes the rendered PrometheusRule strictly into the
// Prometheus Operator's Go types (an unknown field is an error).
func prometheusRule(t *testing.T) *monitoringv1.PrometheusRule {
	t.Helper()
	o := one(t, render(t, ""), "PrometheusRule")
	var pr monitoringv1.PrometheusRule
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, &pr, true); err != nil {
		t.Fatalf("PrometheusRule does not decode strictly into monitoring/v1: %v", err)
	}
	return &pr
}

// TestRuleNamesAndRunbooks pins the groups, the 19 recording rules and 17
// alerts by name, their labels and annotations, and that each alert links
// to its own runbook, which exists and has the three sections.
func TestRuleNamesAndRunbooks(t *testing.T) {
	pr := prometheusRule(t)
	if len(pr.Spec.Groups) != 2 || pr.Spec.Groups[0].Name != "profi.recording" || pr.Spec.Groups[1].Name != "profi.alerts" {
		t.Fatalf("groups %+v, want profi.recording and profi.alerts", pr.Spec.Groups)
	}
	if iv := pr.Spec.Groups[0].Interval; iv == nil || *iv != "30s" {
		t.Errorf("profi.recording interval %v, want 30s", iv)
	}
	var rec []string
	for _, r := range pr.Spec.Groups[0].Rules {
		rec = append(rec, r.Record)
	}
	if !slices.Equal(rec, wantRecording) {
		t.Errorf("recording rules %q, want %q", rec, wantRecording)
	}
	alerts := map[string]bool{}
	for _, r := range pr.Spec.Groups[1].Rules {
		alerts[r.Alert] = true
		slug, ok := wantAlerts[r.Alert]
		if !ok {
			t.Errorf("unexpected alert %q", r.Alert)
			continue
		}
		if r.Labels["component"] != "profi" || !slices.Contains([]string{"critical", "warning", "info"}, r.Labels["severity"]) {
			t.Errorf("%s labels %v", r.Alert, r.Labels)
		}
		for _, a := range []string{"summary", "description", "runbook_url"} {
			if r.Annotations[a] == "" {
				t.Errorf("%s has no %s", r.Alert, a)
			}
		}
		wantURL := "https://github.com/profi-dev/profi/blob/main/deploy/runbooks/" + slug + ".md"
		if r.Annotations["runbook_url"] != wantURL {
			t.Errorf("%s runbook_url %q, want %q", r.Alert, r.Annotations["runbook_url"], wantURL)
		}
	}
	if len(alerts) != len(wantAlerts) {
		t.Errorf("%d distinct alerts, want %d", len(alerts), len(wantAlerts))
	}
	slugs := map[string]bool{}
	for _, s := range wantAlerts {
		slugs[s] = true
	}
	files, _ := filepath.Glob(filepath.Join(repoRoot(t), "deploy/runbooks/*.md"))
	if len(files) != len(slugs) {
		t.Errorf("%d runbooks in deploy/runbooks, want %d", len(files), len(slugs))
	}
	for s := range slugs {
		b, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy/runbooks", s+".md"))
		if err != nil {
			t.Error(err)
			continue
		}
		for _, sec := range []string{"## Meaning", "## Confirm", "## What to do", "```promql"} {
			if !strings.Contains(string(b), sec) {
				t.Errorf("runbook %s lacks %q", s, sec)
			}
		}
	}
}

// TestPromtoolRules writes the rendered rule groups to a rules file and runs
// promtool check rules and promtool test rules (deploy/profi/tests): every
// alert fires on its bad case and stays silent on the healthy ones.
func TestPromtoolRules(t *testing.T) {
	promtool := requirePromtool(t)
	pr := prometheusRule(t)
	b, err := json.Marshal(map[string]any{"groups": pr.Spec.Groups})
	if err != nil {
		t.Fatal(err)
	}
	rules, err := yaml.JSONToYAML(b)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "profi-rules.yaml"), rules, 0o644); err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy/profi/tests/rules_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules_test.yaml"), tests, 0o644); err != nil {
		t.Fatal(err)
	}
	check := exec.Command(promtool, "check", "rules", "profi-rules.yaml")
	check.Dir = dir
	out, err := check.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	if want := "SUCCESS: 37 rules found"; !strings.Contains(string(out), want) {
		t.Errorf("promtool check rules: %s, want %q (19 recording rules, 18 alerting rules: ProfiCUDAErrors has a warning twin for out-of-memory, ProfiProbesQuarantined one for a tenant)", out, want)
	}
	test := exec.Command(promtool, "test", "rules", "rules_test.yaml")
	test.Dir = dir
	if out, err := test.CombinedOutput(); err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
}

// ProfiLaunchBound's default thresholds are `profi explain`'s launch
// verdict's (internal/explain), so that the alert and the verdict agree.
func TestLaunchBoundThresholdsAreExplains(t *testing.T) {
	pr := prometheusRule(t)
	var expr string
	for _, r := range pr.Spec.Groups[1].Rules {
		if r.Alert == "ProfiLaunchBound" {
			expr = r.Expr.String()
		}
	}
	for _, want := range []string{
		fmt.Sprintf("(profi_cuda_launch_thread_busy_ratio[5m])) >= %v\n", explain.LaunchBoundShare),
		fmt.Sprintf("(rate(profi_cuda_kernel_launches_total[5m])) >= %v\n", explain.LaunchBoundRate),
		fmt.Sprintf("[5m])) < %v", explain.LaunchBoundGPUBusy),
	} {
		if !strings.Contains(expr, want) {
			t.Errorf("ProfiLaunchBound %q lacks %q", expr, want)
		}
	}
}
