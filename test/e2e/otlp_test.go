package e2e

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"

	"github.com/profi-dev/profi/internal/otlp/otlptest"
	"github.com/profi-dev/profi/internal/testutil"
)

// otlpPushable is the part of a scrape that docs/INTERFACE.md §6 says is
// pushed: profi_ families minus profi_system_ ones and the counter-made
// latency histograms (their native families go out as OTLP Histograms).
func otlpPushable(mfs map[string]*dto.MetricFamily) map[string]*dto.MetricFamily {
	out := map[string]*dto.MetricFamily{}
	for n, mf := range mfs {
		if !strings.HasPrefix(n, "profi_") || strings.HasPrefix(n, "profi_system_") {
			continue
		}
		hist := false
		for _, base := range []string{"profi_cuda_duration", "profi_cuda_kernel_duration", "profi_nccl_duration"} {
			for _, s := range []string{"_bucket_total", "_sum_seconds_total", "_count_total"} {
				hist = hist || n == base+s
			}
		}
		if !hist {
			out[n] = mf
		}
	}
	return out
}

// nextPush waits for an export that started after this call: the one
// after the next, since the next may have gathered before.
func nextPush(t *testing.T, r *otlptest.Receiver) otlptest.Request {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := r.Wait(ctx, r.Len()+2)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// requirePushEqualsScrape compares the next push with a scrape of the
// same, idle state: names, help, attributes renamed back to labels,
// values and histogram buckets are equal.
func requirePushEqualsScrape(t *testing.T, a *testutil.Agent, r *otlptest.Receiver) (otlptest.Request, map[string]*dto.MetricFamily) {
	t.Helper()
	req := nextPush(t, r)
	scrape, err := a.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	pushed, err := otlptest.Families(req.Body)
	if err != nil {
		t.Fatal(err)
	}
	if d := otlptest.Diff(otlpPushable(scrape), pushed); d != "" {
		t.Fatalf("OTLP push differs from /metrics:\n%s", d)
	}
	return req, pushed
}

// pointTimes maps each cumulative series of an export to its start time,
// and returns the export's point time.
func pointTimes(t *testing.T, req otlptest.Request) (map[string]uint64, uint64) {
	t.Helper()
	starts := map[string]uint64{}
	var at uint64
	for _, rm := range req.Body.GetResourceMetrics() {
		for _, sm := range rm.GetScopeMetrics() {
			for _, m := range sm.GetMetrics() {
				add := func(attrs []*commonpb.KeyValue, start, now uint64) {
					starts[m.GetName()+attrKey(attrs)] = start
					if at != 0 && now != at {
						t.Errorf("%s: point time %d, others %d", m.GetName(), now, at)
					}
					at = now
				}
				for _, p := range m.GetSum().GetDataPoints() {
					add(p.GetAttributes(), p.GetStartTimeUnixNano(), p.GetTimeUnixNano())
				}
				for _, p := range m.GetHistogram().GetDataPoints() {
					add(p.GetAttributes(), p.GetStartTimeUnixNano(), p.GetTimeUnixNano())
				}
			}
		}
	}
	return starts, at
}

// attrKey renders a point's attributes (sent in a stable order).
func attrKey(attrs []*commonpb.KeyValue) string {
	var b strings.Builder
	for _, kv := range attrs {
		fmt.Fprintf(&b, "{%s=%s}", kv.GetKey(), kv.GetValue().GetStringValue())
	}
	return b.String()
}

// The real agent pushing to an in-process OTLP receiver, over gRPC and
// HTTP: every push equals a scrape of the same state (names, attributes,
// values, histogram buckets), the calls equal the workload's ground truth,
// start times are when each series appeared and stay put, and the series
// of an exited process leave the push as they leave /metrics.
func TestOTLPPush(t *testing.T) {
	for _, proto := range []string{"grpc", "http/protobuf"} {
		t.Run(strings.ReplaceAll(proto, "/", "-"), func(t *testing.T) {
			testutil.RequireBPF(t)
			r := otlptest.StartGRPC(t, nil)
			if proto != "grpc" {
				r = otlptest.StartHTTP(t, nil)
			}
			started := uint64(time.Now().UnixNano())
			a := startAgent(t, "--otlp-endpoint", r.URL, "--otlp-protocol", proto, "--otlp-interval-secs", "1",
				"--otlp-resource-attrs", "deployment.environment=e2e", "--otlp-headers", "x-scope=profi-e2e")
			w := startWorkload(t, fixtures.Workload, defaultArgs)
			waitAttached(t, a, w.PID)
			gt := runPhase(t, w)
			requireExact(t, a, expected([]*testutil.GroundTruth{gt}), w.PID)

			req, pushed := requirePushEqualsScrape(t, a, r)

			// The calls in the push equal the ground truth. The counter-made
			// histogram families are not pushed: their keys are dropped.
			want := expected([]*testutil.GroundTruth{gt})
			for k := range want {
				if strings.HasPrefix(k, "profi_cuda_duration_count_total") || strings.HasPrefix(k, "profi_cuda_duration_bucket_total") {
					delete(want, k)
				}
			}
			if d := diff(want, observed(pushed, w.PID)); d != "" {
				t.Fatalf("OTLP push differs from the ground truth:\n%s", d)
			}

			if got := req.Header.Get("x-scope"); got != "profi-e2e" {
				t.Errorf("header x-scope = %q", got)
			}
			host := os.Getenv("HOSTNAME")
			if host == "" {
				host, _ = os.Hostname()
			}
			res := otlptest.Attributes(req.Body.GetResourceMetrics()[0].GetResource().GetAttributes())
			wantRes := map[string]string{"service.name": "profi", "service.version": "dev", "service.instance.id": host,
				"host.name": host, "deployment.environment": "e2e"}
			if fmt.Sprint(res) != fmt.Sprint(wantRes) {
				t.Errorf("resource %v, want %v", res, wantRes)
			}

			// Start times: after the agent started, not after the point, and
			// the same in every push while the series lives. The workload's
			// series appeared after the export before the first one that
			// carries them: that export's time is their start time.
			starts, at := pointTimes(t, req)
			reqs := r.Requests()
			firstWith := map[string]int{}
			for i, q := range reqs {
				s, _ := pointTimes(t, q)
				for k := range s {
					if _, ok := firstWith[k]; !ok {
						firstWith[k] = i
					}
				}
			}
			pid := "process.pid=" + strconv.Itoa(w.PID)
			checked := 0
			for k, st := range starts {
				if st < started || st > at {
					t.Errorf("%s: start %d outside [agent start %d, point time %d]", k, st, started, at)
				}
				if i := firstWith[k]; i > 0 && strings.Contains(k, pid) {
					_, prevAt := pointTimes(t, reqs[i-1])
					if prevAt != 0 && st != prevAt {
						t.Errorf("%s: start %d, want %d (the export before it first appeared)", k, st, prevAt)
					}
					checked++
				}
			}
			if checked == 0 {
				t.Logf("the workload's series were in the first export: only the agent-start bound was checked")
			}
			later := nextPush(t, r)
			again, _ := pointTimes(t, later)
			for k, st := range starts {
				if again[k] != st {
					t.Errorf("%s: start time moved from %d to %d", k, st, again[k])
				}
			}

			// The process exits: its counters stay, with their final values,
			// in /metrics and the push alike (for --gc-interval, then folded:
			// TestProcessExit); its active-memory gauge goes; the latency
			// histograms (no pid) stay, exactly.
			if err := w.Stop(); err != nil {
				t.Fatal(err)
			}
			final := expected([]*testutil.GroundTruth{gt})
			delete(final, key("profi_cuda_active_memory_bytes", "pid="+strconv.Itoa(w.PID)))
			requireExact(t, a, final, w.PID)
			_, pushed = requirePushEqualsScrape(t, a, r)
			calls := 0.0
			for _, s := range testutil.Samples(pushed["profi_cuda_calls_total"]) {
				if s.Labels["pid"] == strconv.Itoa(w.PID) {
					calls += s.Value
				}
			}
			wantCalls := 0.0
			for k, v := range final {
				if strings.HasPrefix(k, "profi_cuda_calls_total{") && strings.Contains(k, "pid="+strconv.Itoa(w.PID)) {
					wantCalls += v
				}
			}
			if calls != wantCalls {
				t.Errorf("after the exit the push has %v calls of pid %d, want its %v", calls, w.PID, wantCalls)
			}
			for _, s := range testutil.Samples(pushed["profi_cuda_active_memory_bytes"]) {
				if s.Labels["pid"] == strconv.Itoa(w.PID) {
					t.Errorf("the active memory of exited pid %d is still pushed", w.PID)
				}
			}
			if _, ok := pushed["profi_cuda_duration_seconds"]; !ok {
				t.Error("profi_cuda_duration_seconds not pushed after the process exited")
			}
		})
	}
}
