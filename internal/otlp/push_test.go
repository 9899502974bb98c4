package otlp_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	colmetricpb "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	"google.golang.org/protobuf/proto"

	"github.com/profi-dev/profi/internal/config"
	"github.com/profi-dev/profi/internal/otlp"
	"github.com/profi-dev/profi/internal/otlp/otlptest"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// registry holds what a real agent registers: OTLP-pushed families (a
// counter, a gauge, a native latency histogram) and the families that stay
// Prometheus-only (the counter-made histogram, profi_system_*, go_*).
func registry(t *testing.T) *prometheus.Registry {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	calls := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "profi_cuda_calls_total", Help: "Calls."},
		[]string{"operation", "pid", "comm", "namespace", "pod", "container", "gpu", "gpu_uuid", "stream"})
	calls.WithLabelValues("cudaMemcpy", "42", "train", "ns", "pod-a", "c", "0", "GPU-1", "default").Add(17)
	calls.WithLabelValues("cudaLaunchKernel", "42", "train", "ns", "pod-a", "c", "0", "GPU-1", "0x7f00").Add(3)
	mem := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "profi_cuda_active_memory_bytes", Help: "Active."}, []string{"pid"})
	mem.WithLabelValues("42").Set(1 << 20)
	hist := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "profi_cuda_duration_seconds", Help: "Latency.",
		Buckets: []float64{1e-6, 5e-6, 1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.5, 1},
	}, []string{"operation", "namespace", "pod", "gpu"})
	for _, v := range []float64{1e-6, 2e-6, 3e-5, 3e-5, 0.2, 7} {
		hist.WithLabelValues("cudaMemcpy", "ns", "pod-a", "0").Observe(v)
	}
	buckets := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "profi_cuda_duration_bucket_total", Help: "B."},
		[]string{"operation", "namespace", "pod", "gpu", "le"})
	buckets.WithLabelValues("cudaMemcpy", "ns", "pod-a", "0", "+Inf").Add(6)
	count := prometheus.NewCounter(prometheus.CounterOpts{Name: "profi_cuda_duration_count_total", Help: "C."})
	count.Add(6)
	uptime := prometheus.NewGauge(prometheus.GaugeOpts{Name: "profi_system_uptime_seconds", Help: "U."})
	goroutines := prometheus.NewGauge(prometheus.GaugeOpts{Name: "go_goroutines", Help: "G."})
	reg.MustRegister(calls, mem, hist, buckets, count, uptime, goroutines)
	return reg
}

// pushable is the part of a scrape that docs/INTERFACE.md §6 says is pushed,
// stated independently of the converter: profi_ families, without
// profi_system_ ones and the counter-made histogram families.
func pushable(t *testing.T, g prometheus.Gatherer) map[string]*dto.MetricFamily {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		n := mf.GetName()
		switch {
		case !strings.HasPrefix(n, "profi_"), strings.HasPrefix(n, "profi_system_"),
			n == "profi_cuda_duration_bucket_total", n == "profi_cuda_duration_count_total":
			continue
		}
		out[n] = mf
	}
	return out
}

// parse builds the OTLP configuration through the real flag and env
// parsing, as the agent does.
func parse(t *testing.T, env map[string]string, args ...string) config.OTLPConfig {
	t.Helper()
	cfg, _, err := config.Parse(args, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	return cfg.OTLP
}

type pushEnv struct {
	reg     *prometheus.Registry
	conv    *otlp.Converter
	metrics *otlp.Metrics
	pusher  *otlp.Pusher
}

func newPush(t *testing.T, cfg config.OTLPConfig, reg *prometheus.Registry) *pushEnv {
	t.Helper()
	exp, err := otlp.NewExporter(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = exp.Shutdown(context.Background()) })
	res := otlp.Resource(cfg, "v9", "node-7", func(k string) string { return map[string]string{"HOSTNAME": "host-3"}[k] })
	e := &pushEnv{reg: reg, metrics: otlp.NewMetrics()}
	e.conv = otlp.NewConverter(reg, res, "v9", time.Now())
	e.pusher = otlp.NewPusher(e.conv, exp, time.Minute, cfg.Timeout, e.metrics, quiet)
	return e
}

func (e *pushEnv) results(t *testing.T) (ok, failed float64) {
	t.Helper()
	return testutil.ToFloat64(e.metrics.Exports.WithLabelValues(otlp.ResultSuccess)),
		testutil.ToFloat64(e.metrics.Exports.WithLabelValues(otlp.ResultFailure))
}

func waitReq(t *testing.T, r *otlptest.Receiver, n int) otlptest.Request {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := r.Wait(ctx, n)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// requireSameAsScrape checks that an export carries exactly the pushable
// part of the registry: names, help, attributes (renamed back), values,
// histogram bucket counts.
func requireSameAsScrape(t *testing.T, req otlptest.Request, g prometheus.Gatherer) {
	t.Helper()
	got, err := otlptest.Families(req.Body)
	if err != nil {
		t.Fatal(err)
	}
	if d := otlptest.Diff(pushable(t, g), got); d != "" {
		t.Fatalf("pushed data differs from the Prometheus view:\n%s", d)
	}
}

// The real SDK exporters, both transports, plain, TLS and mTLS, talking to
// the in-process receiver: the data equals the Prometheus view; headers,
// resource attributes, the HTTP path and the client certificate arrive.
func TestPushTransports(t *testing.T) {
	certs := otlptest.NewCerts(t)
	for _, tc := range []struct {
		name  string
		proto string
		tls   string // "", "tls", "mtls"
	}{
		{"grpc", "grpc", ""},
		{"http", "http/protobuf", ""},
		{"grpc-tls", "grpc", "tls"},
		{"http-tls", "http/protobuf", "tls"},
		{"grpc-mtls", "grpc/protobuf", "mtls"},
		{"http-mtls", "http", "mtls"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := otlptest.StartGRPC
			if strings.HasPrefix(tc.proto, "http") {
				start = otlptest.StartHTTP
			}
			var r *otlptest.Receiver
			args := []string{"--otlp-protocol", tc.proto, "--otlp-headers", "authorization=Bearer abc, x-tenant = t1"}
			switch tc.tls {
			case "":
				r = start(t, nil)
			case "tls":
				r = start(t, certs.ServerTLS(false))
				args = append(args, "--otlp-ca-cert", certs.CA)
			case "mtls":
				r = start(t, certs.ServerTLS(true))
				args = append(args, "--otlp-ca-cert", certs.CA, "--otlp-client-cert", certs.ClientCert, "--otlp-client-key", certs.ClientKey)
			}
			// A base URL: HTTP must add /v1/metrics itself.
			args = append(args, "--otlp-endpoint", r.URL, "--otlp-resource-attrs", "deployment.environment=prod,host.name=override")
			cfg := parse(t, nil, args...)
			e := newPush(t, cfg, registry(t))
			if err := e.pusher.Push(context.Background()); err != nil {
				t.Fatal(err)
			}
			req := waitReq(t, r, 1)
			requireSameAsScrape(t, req, e.reg)
			if got := req.Header.Get("authorization"); got != "Bearer abc" {
				t.Errorf("authorization header %q", got)
			}
			if got := req.Header.Get("x-tenant"); got != "t1" {
				t.Errorf("x-tenant header %q", got)
			}
			if strings.HasPrefix(tc.proto, "http") && req.Path != "/v1/metrics" {
				t.Errorf("HTTP path %q, want /v1/metrics", req.Path)
			}
			if want := map[string]string{"mtls": certs.ClientCN}[tc.tls]; req.ClientCN != want {
				t.Errorf("client certificate CN %q, want %q", req.ClientCN, want)
			}
			rms := req.Body.GetResourceMetrics()
			if len(rms) != 1 {
				t.Fatalf("%d resource metrics", len(rms))
			}
			wantRes := map[string]string{
				"service.name": "profi", "service.version": "v9", "service.instance.id": "host-3",
				"host.name": "override", "k8s.node.name": "node-7", "deployment.environment": "prod",
			}
			if got := otlptest.Attributes(rms[0].GetResource().GetAttributes()); fmt.Sprint(got) != fmt.Sprint(wantRes) {
				t.Errorf("resource %v, want %v", got, wantRes)
			}
			if sm := rms[0].GetScopeMetrics(); len(sm) != 1 || sm[0].GetScope().GetName() != otlp.ScopeName || sm[0].GetScope().GetVersion() != "v9" {
				t.Errorf("scope %v", sm)
			}
			if ok, failed := e.results(t); ok != 1 || failed != 0 {
				t.Errorf("exports: %v ok, %v failed; want 1, 0", ok, failed)
			}
		})
	}
}

// The histogram is a real OTLP explicit-bucket histogram: bounds in
// seconds, per-bucket counts, sum and count, cumulative.
func TestPushHistogramShape(t *testing.T) {
	r := otlptest.StartGRPC(t, nil)
	e := newPush(t, parse(t, nil, "--otlp-endpoint", r.URL), registry(t))
	if err := e.pusher.Push(context.Background()); err != nil {
		t.Fatal(err)
	}
	req := waitReq(t, r, 1)
	for _, m := range req.Body.GetResourceMetrics()[0].GetScopeMetrics()[0].GetMetrics() {
		if m.GetName() != "profi_cuda_duration_seconds" {
			continue
		}
		h := m.GetHistogram()
		if h == nil || len(h.GetDataPoints()) != 1 || m.GetUnit() != "s" {
			t.Fatalf("not one histogram point in seconds: %v", m)
		}
		p := h.GetDataPoints()[0]
		wantBounds := []float64{1e-6, 5e-6, 1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.5, 1}
		// Observed 1e-6 (inclusive bound), 2e-6, 3e-5 twice, 0.2, 7 (+Inf).
		wantCounts := []uint64{1, 1, 0, 2, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1}
		if fmt.Sprint(p.GetExplicitBounds()) != fmt.Sprint(wantBounds) || fmt.Sprint(p.GetBucketCounts()) != fmt.Sprint(wantCounts) ||
			p.GetCount() != 6 || p.GetSum() != 1e-6+2e-6+3e-5+3e-5+0.2+7 {
			t.Errorf("histogram point bounds %v counts %v count %d sum %v", p.GetExplicitBounds(), p.GetBucketCounts(), p.GetCount(), p.GetSum())
		}
		if p.GetStartTimeUnixNano() == 0 || p.GetStartTimeUnixNano() > p.GetTimeUnixNano() {
			t.Errorf("start %d, time %d", p.GetStartTimeUnixNano(), p.GetTimeUnixNano())
		}
		return
	}
	t.Fatal("profi_cuda_duration_seconds not pushed")
}

// The SDK reads OTEL_EXPORTER_OTLP_* from the process environment by
// itself; the agent's resolved settings must win over all of them, or a
// flag would not beat its env var.
func TestSDKEnvDoesNotLeak(t *testing.T) {
	for _, proto := range []string{"grpc", "http/protobuf"} {
		t.Run(strings.ReplaceAll(proto, "/", "-"), func(t *testing.T) {
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
			t.Setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://127.0.0.1:1/elsewhere")
			t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", "leak=1")
			t.Setenv("OTEL_EXPORTER_OTLP_METRICS_HEADERS", "leak2=1")
			t.Setenv("OTEL_EXPORTER_OTLP_INSECURE", "false")
			t.Setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")
			start := otlptest.StartGRPC
			if proto != "grpc" {
				start = otlptest.StartHTTP
			}
			certs := otlptest.NewCerts(t)
			t.Setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", certs.CA)
			t.Setenv("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", certs.ClientCert)
			t.Setenv("OTEL_EXPORTER_OTLP_CLIENT_KEY", certs.ClientKey)
			r := start(t, nil) // plain text
			// The configuration saw no env (flags only): what the SDK finds
			// in the process environment must change nothing.
			e := newPush(t, parse(t, nil, "--otlp-endpoint", r.URL, "--otlp-protocol", proto), registry(t))
			if err := e.pusher.Push(context.Background()); err != nil {
				t.Fatal(err)
			}
			req := waitReq(t, r, 1)
			if req.Header.Get("leak") != "" || req.Header.Get("leak2") != "" {
				t.Errorf("headers from the SDK's env reading leaked: %v", req.Header)
			}
			requireSameAsScrape(t, req, e.reg)
		})
	}
}

// TLS failures are push failures: counted, and the next push still runs.
func TestPushTLSFailures(t *testing.T) {
	certs, other := otlptest.NewCerts(t), otlptest.NewCerts(t)
	for _, tc := range []struct {
		name, proto string
		server      *otlptestServer
		args        []string
	}{
		{"grpc-untrusted-server", "grpc", &otlptestServer{certs, false}, []string{"--otlp-ca-cert", other.CA}},
		{"http-untrusted-server", "http/protobuf", &otlptestServer{certs, false}, []string{"--otlp-ca-cert", other.CA}},
		{"grpc-no-client-cert", "grpc", &otlptestServer{certs, true}, []string{"--otlp-ca-cert", certs.CA}},
		{"http-no-client-cert", "http/protobuf", &otlptestServer{certs, true}, []string{"--otlp-ca-cert", certs.CA}},
		{"http-plain-to-tls", "http/protobuf", &otlptestServer{certs, false}, []string{"--otlp-insecure"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := otlptest.StartGRPC
			if tc.proto != "grpc" {
				start = otlptest.StartHTTP
			}
			r := start(t, tc.server.certs.ServerTLS(tc.server.mtls))
			cfg := parse(t, map[string]string{"OTEL_EXPORTER_OTLP_TIMEOUT": "2000"},
				append([]string{"--otlp-endpoint", r.URL, "--otlp-protocol", tc.proto}, tc.args...)...)
			e := newPush(t, cfg, registry(t))
			for range 2 {
				if err := e.pusher.Push(context.Background()); err == nil {
					t.Fatal("push succeeded")
				}
			}
			if ok, failed := e.results(t); ok != 0 || failed != 2 {
				t.Errorf("exports: %v ok, %v failed; want 0, 2", ok, failed)
			}
			if r.Len() != 0 {
				t.Errorf("receiver accepted %d exports", r.Len())
			}
		})
	}
}

type otlptestServer struct {
	certs *otlptest.Certs
	mtls  bool
}

// Bad TLS files are a startup error, not a silent plain-text fallback.
func TestExporterBadTLSFiles(t *testing.T) {
	certs := otlptest.NewCerts(t)
	for name, args := range map[string][]string{
		"missing CA":     {"--otlp-ca-cert", certs.Dir + "/nope.pem"},
		"CA not PEM":     {"--otlp-ca-cert", certs.ClientKey},
		"key mismatch":   {"--otlp-client-cert", certs.ClientCert, "--otlp-client-key", certs.ServerKey},
		"missing client": {"--otlp-client-cert", certs.Dir + "/c.pem", "--otlp-client-key", certs.ClientKey},
	} {
		for _, proto := range []string{"grpc", "http/protobuf"} {
			cfg := parse(t, nil, append([]string{"--otlp-endpoint", "https://127.0.0.1:4317", "--otlp-protocol", proto}, args...)...)
			if _, err := otlp.NewExporter(context.Background(), cfg); err == nil {
				t.Errorf("%s over %s: no error", name, proto)
			}
		}
	}
}

// A collector that hangs: each push ends at the timeout (from the env var,
// in milliseconds) and counts as a failure.
func TestPushTimeout(t *testing.T) {
	for _, proto := range []string{"grpc", "http/protobuf"} {
		t.Run(strings.ReplaceAll(proto, "/", "-"), func(t *testing.T) {
			start := otlptest.StartGRPC
			if proto != "grpc" {
				start = otlptest.StartHTTP
			}
			r := start(t, nil)
			r.Hold.Store(true)
			cfg := parse(t, map[string]string{"OTEL_EXPORTER_OTLP_METRICS_TIMEOUT": "300"}, "--otlp-endpoint", r.URL, "--otlp-protocol", proto)
			if cfg.Timeout != 300*time.Millisecond {
				t.Fatalf("timeout %v", cfg.Timeout)
			}
			e := newPush(t, cfg, registry(t))
			if err := e.pusher.Push(context.Background()); err == nil {
				t.Fatal("push to a hung collector succeeded")
			}
			if ok, failed := e.results(t); ok != 0 || failed != 1 {
				t.Errorf("exports: %v ok, %v failed; want 0, 1", ok, failed)
			}
			if r.Calls() < 1 {
				t.Error("the collector never saw the push")
			}
		})
	}
}

// big registers n counter series with long labels: a batch of a few MB.
func big(reg *prometheus.Registry, n int) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "profi_cuda_calls_total", Help: "Calls."},
		[]string{"operation", "pid", "comm", "namespace", "pod", "container", "gpu", "gpu_uuid", "stream"})
	for i := range n {
		c.WithLabelValues("cudaMemcpy", fmt.Sprint(i), "python3-train-worker", "team-inference-prod",
			fmt.Sprintf("llm-serving-deployment-7d9f8c6b5-%05d", i), "model-server", "3",
			"GPU-9f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b", fmt.Sprintf("0x7f%010x", i)).Add(float64(i))
	}
	reg.MustRegister(c)
}

func heap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// A collector that is down costs a counter per push and no memory: failed
// batches are dropped, not queued, so after many failures the heap has not
// grown by even one batch, and the first push after recovery carries the
// current values only (one export, not a backlog).
func TestCollectorDownBoundedMemory(t *testing.T) {
	for _, proto := range []string{"grpc", "http/protobuf"} {
		t.Run(strings.ReplaceAll(proto, "/", "-"), func(t *testing.T) {
			r := otlptest.StartGRPC(t, nil)
			if proto != "grpc" {
				r = otlptest.StartHTTP(t, nil)
			}
			r.Reject.Store(true)
			reg := prometheus.NewPedanticRegistry()
			const n = 6000 // three batches of MaxPointsPerExport, about 2 MB in all
			big(reg, n)
			cfg := parse(t, map[string]string{"OTEL_EXPORTER_OTLP_TIMEOUT": "1000"}, "--otlp-endpoint", r.URL, "--otlp-protocol", proto)
			e := newPush(t, cfg, reg)

			// One batch, as sent on the wire.
			rm, _, err := e.conv.Convert()
			if err != nil {
				t.Fatal(err)
			}
			batch := batchSize(t, rm)
			_ = e.pusher.Push(context.Background()) // warm up connections and pools
			before := heap()
			const pushes = 5
			for range pushes {
				if err := e.pusher.Push(context.Background()); err == nil {
					t.Fatal("push to a rejecting collector succeeded")
				}
			}
			after := heap()
			if after > before && after-before > uint64(batch) {
				t.Errorf("heap grew by %d bytes over %d failed pushes; one batch is %d bytes", after-before, pushes, batch)
			}
			if ok, failed := e.results(t); ok != 0 || failed != pushes+1 {
				t.Errorf("exports: %v ok, %v failed; want 0, %d", ok, failed, pushes+1)
			}
			if e.conv.Series() != n {
				t.Errorf("converter holds %d series, want %d", e.conv.Series(), n)
			}

			r.Reject.Store(false)
			if err := e.pusher.Push(context.Background()); err != nil {
				t.Fatal(err)
			}
			// One push: n points in batches of MaxPointsPerExport, nothing older.
			reqs := r.Requests()
			if want := (n + otlp.MaxPointsPerExport - 1) / otlp.MaxPointsPerExport; len(reqs) != want {
				t.Errorf("%d exports after recovery, want %d (one push)", len(reqs), want)
			}
			bodies := make([]*colmetricpb.ExportMetricsServiceRequest, len(reqs))
			for i, q := range reqs {
				bodies[i] = q.Body
			}
			got, err := otlptest.Families(bodies...)
			if err != nil {
				t.Fatal(err)
			}
			if d := otlptest.Diff(pushable(t, reg), got); d != "" {
				t.Fatalf("pushed data differs from the Prometheus view:\n%s", d)
			}
		})
	}
}

// batchSize is the protobuf size of one converted batch.
func batchSize(t *testing.T, rm *metricdata.ResourceMetrics) int {
	t.Helper()
	r := otlptest.StartGRPC(t, nil)
	exp, err := otlp.NewExporter(context.Background(), parse(t, nil, "--otlp-endpoint", r.URL))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = exp.Shutdown(context.Background()) }()
	size := 0
	for i, b := range otlp.Split(rm, otlp.MaxPointsPerExport) {
		if err := exp.Export(context.Background(), b); err != nil {
			t.Fatal(err)
		}
		size += proto.Size(waitReq(t, r, i+1).Body)
	}
	return size
}

// A connection refused (nothing listening) is a failure like any other.
func TestCollectorUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	for _, proto := range []string{"grpc", "http/protobuf"} {
		cfg := parse(t, map[string]string{"OTEL_EXPORTER_OTLP_TIMEOUT": "200"}, "--otlp-endpoint", "http://"+addr, "--otlp-protocol", proto)
		e := newPush(t, cfg, registry(t))
		if err := e.pusher.Push(context.Background()); err == nil {
			t.Fatalf("%s: push to a closed port succeeded", proto)
		}
		if ok, failed := e.results(t); ok != 0 || failed != 1 {
			t.Errorf("%s: exports: %v ok, %v failed; want 0, 1", proto, ok, failed)
		}
	}
}

type fakeExporter struct {
	mu       sync.Mutex
	calls    []time.Time
	shutdown bool
	got      chan struct{}
}

func (f *fakeExporter) Export(context.Context, *metricdata.ResourceMetrics) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, time.Now())
	if len(f.calls) == 2 {
		close(f.got)
	}
	return nil
}

func (f *fakeExporter) Shutdown(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.shutdown = true
	return nil
}

// Run: the first push comes one interval after start, not at once; the
// exporter is shut down when the context ends.
func TestRunSchedule(t *testing.T) {
	f := &fakeExporter{got: make(chan struct{})}
	const interval = 200 * time.Millisecond
	conv := otlp.NewConverter(registry(t), otlp.Resource(config.OTLPConfig{ServiceName: "profi"}, "v", "", func(string) string { return "" }), "v", time.Now())
	p := otlp.NewPusher(conv, f, interval, time.Second, otlp.NewMetrics(), quiet)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	start := time.Now()
	go func() { done <- p.Run(ctx) }()
	select {
	case <-f.got:
	case <-time.After(30 * time.Second):
		t.Fatal("no second push")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if first := f.calls[0].Sub(start); first < interval {
		t.Errorf("first push %v after start, want at least one interval (%v)", first, interval)
	}
	if gap := f.calls[1].Sub(f.calls[0]); gap <= 0 {
		t.Errorf("second push %v after the first", gap)
	}
	if !f.shutdown {
		t.Error("exporter not shut down")
	}
}

// Split keeps every point, in order, at most maxPoints per batch, and
// cuts a family across batches when it must.
func TestSplit(t *testing.T) {
	sum := func(name string, n int) metricdata.Metrics {
		s := metricdata.Sum[float64]{Temporality: metricdata.CumulativeTemporality, IsMonotonic: true}
		for i := range n {
			s.DataPoints = append(s.DataPoints, metricdata.DataPoint[float64]{Value: float64(i)})
		}
		return metricdata.Metrics{Name: name, Data: s}
	}
	rm := &metricdata.ResourceMetrics{ScopeMetrics: []metricdata.ScopeMetrics{{Metrics: []metricdata.Metrics{sum("a", 3), sum("b", 0), sum("c", 6)}}}}
	var got []string
	for _, b := range otlp.Split(rm, 4) {
		var parts []string
		for _, m := range b.ScopeMetrics[0].Metrics {
			var vals []string
			for _, dp := range m.Data.(metricdata.Sum[float64]).DataPoints {
				vals = append(vals, fmt.Sprint(dp.Value))
			}
			parts = append(parts, m.Name+"["+strings.Join(vals, " ")+"]")
		}
		got = append(got, strings.Join(parts, ","))
	}
	want := []string{"a[0 1 2],b[],c[0]", "c[1 2 3 4]", "c[5]"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("batches %q, want %q", got, want)
	}
	if n := len(otlp.Split(&metricdata.ResourceMetrics{}, 4)); n != 1 {
		t.Errorf("empty data: %d batches, want 1", n)
	}
}
