package server

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/profi-dev/profi/internal/status"
)

// testGatherer is a private registry with one counter of value 3.
func testGatherer(t *testing.T) *prometheus.Registry {
	t.Helper()
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "profi_test_events_total", Help: "Test counter."})
	c.Add(3)
	reg.MustRegister(c)
	return reg
}

func listen(t *testing.T, opts Options) *Server {
	t.Helper()
	if opts.Listen == "" {
		opts.Listen = "127.0.0.1:0"
	}
	if opts.Gatherer == nil {
		opts.Gatherer = testGatherer(t)
	}
	if opts.Status == nil {
		opts.Status = func() status.Doc { return status.Doc{TrackedPIDs: []int{}} }
	}
	s, err := Listen(opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// get runs one request against the handler without a network.
func get(t *testing.T, h http.Handler, method, path string, header http.Header) (int, http.Header, string) {
	t.Helper()
	req := httptest.NewRequest(method, path, nil)
	for k, v := range header {
		req.Header[k] = v
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code, rec.Header(), rec.Body.String()
}

// serve runs s until the test ends and waits until it serves.
func serve(t *testing.T, s *Server) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	for !s.Serving() {
		select {
		case err := <-done:
			t.Fatalf("Run returned early: %v", err)
		case <-time.After(time.Millisecond):
		}
	}
}

func TestHealth(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		heartbeat func() time.Time
		code      int
		body      string
	}{
		{"fresh heartbeat", time.Now, http.StatusOK, "ok\n"},
		{"no heartbeat source", nil, http.StatusOK, "ok\n"},
		{"stale heartbeat", func() time.Time { return time.Now().Add(-time.Hour) }, http.StatusServiceUnavailable, "event loop stale\n"},
		{"never beaten", func() time.Time { return time.Time{} }, http.StatusServiceUnavailable, "event loop stale\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := listen(t, Options{Heartbeat: tc.heartbeat})
			defer s.ln.Close()
			code, _, body := get(t, s.Handler(), http.MethodGet, "/health", nil)
			if code != tc.code || body != tc.body {
				t.Errorf("/health = %d %q, want %d %q", code, body, tc.code, tc.body)
			}
		})
	}
}

func TestReady(t *testing.T) {
	t.Parallel()
	var ready atomic.Bool
	s := listen(t, Options{Ready: ready.Load})
	h := s.Handler()
	check := func(step string, code int, body string) {
		t.Helper()
		if c, _, b := get(t, h, http.MethodGet, "/ready", nil); c != code || b != body {
			t.Errorf("%s: /ready = %d %q, want %d %q", step, c, b, code, body)
		}
	}
	ready.Store(true)
	check("before Run", http.StatusServiceUnavailable, "not ready\n")

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	for !s.Serving() {
		time.Sleep(time.Millisecond)
	}
	check("serving", http.StatusOK, "ready\n")
	// Over the network too.
	resp, err := http.Get("http://" + s.Addr() + "/ready")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(b) != "ready\n" {
		t.Errorf("GET /ready = %d %q", resp.StatusCode, b)
	}

	ready.Store(false)
	check("serving, not ready", http.StatusServiceUnavailable, "not ready\n")
	ready.Store(true)

	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	check("after shutdown", http.StatusServiceUnavailable, "not ready\n")
	if _, err := http.Get("http://" + s.Addr() + "/ready"); err == nil {
		t.Error("server still answers after Run returned")
	}
}

func TestReadyWithoutReadyFunc(t *testing.T) {
	t.Parallel()
	s := listen(t, Options{})
	serve(t, s)
	if code, _, body := get(t, s.Handler(), http.MethodGet, "/ready", nil); code != http.StatusOK || body != "ready\n" {
		t.Errorf("/ready = %d %q, want 200 \"ready\\n\"", code, body)
	}
}

func TestStatus(t *testing.T) {
	t.Parallel()
	want := status.Doc{
		AttachedLibraries: []status.LibraryView{{LibraryStatus: status.LibraryStatus{Library: "libcudart.so"}, Pods: []string{}}},
		TrackedPIDs:       []int{1, 2}, EventsProcessed: 7, UptimeSeconds: 1.5, KernelMode: "anonymous",
	}
	var calls atomic.Int32
	s := listen(t, Options{Status: func() status.Doc { calls.Add(1); return want }})
	defer s.ln.Close()
	code, header, body := get(t, s.Handler(), http.MethodGet, "/status", nil)
	if code != http.StatusOK || header.Get("Content-Type") != "application/json" {
		t.Fatalf("/status = %d, Content-Type %q", code, header.Get("Content-Type"))
	}
	var got status.Doc
	dec := json.NewDecoder(strings.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("decode %q: %v", body, err)
	}
	if got.KernelMode != want.KernelMode || got.EventsProcessed != want.EventsProcessed || got.UptimeSeconds != want.UptimeSeconds ||
		len(got.AttachedLibraries) != 1 || got.AttachedLibraries[0].Library != "libcudart.so" || len(got.TrackedPIDs) != 2 {
		t.Errorf("/status = %+v, want %+v", got, want)
	}
	if calls.Load() != 1 {
		t.Errorf("Status called %d times, want 1", calls.Load())
	}
}

// TestHeartbeat checks the beat /health reads: the older of the last
// drain and the due time of the next discovery pass, so a long
// --refresh-interval is not stale between passes and a stuck pass is.
func TestHeartbeat(t *testing.T) {
	t.Parallel()
	now := time.Now()
	tests := []struct {
		name            string
		drained, passed time.Time
		interval        time.Duration
		want            time.Time
		healthy         bool
	}{
		{"both fresh", now, now.Add(-time.Second), 5 * time.Second, now, true},
		{"long interval between passes", now, now.Add(-10 * time.Minute), 15 * time.Minute, now, true},
		{"drain stale", now.Add(-time.Minute), now, 5 * time.Second, now.Add(-time.Minute), false},
		{"pass overdue", now, now.Add(-time.Minute), 5 * time.Second, now.Add(-55 * time.Second), false},
		{"no drain yet", time.Time{}, now, 5 * time.Second, time.Time{}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			beat := Heartbeat(func() time.Time { return tc.drained }, func() time.Time { return tc.passed }, tc.interval)
			got := beat()
			if !got.Equal(tc.want) {
				t.Errorf("Heartbeat = %v, want %v", got, tc.want)
			}
			s := listen(t, Options{Heartbeat: beat})
			defer s.ln.Close()
			code, _, _ := get(t, s.Handler(), http.MethodGet, "/health", nil)
			if healthy := code == http.StatusOK; healthy != tc.healthy {
				t.Errorf("/health = %d, want healthy %v", code, tc.healthy)
			}
		})
	}
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	var renders atomic.Int32
	s := listen(t, Options{Encode: func(time.Duration) { renders.Add(1) }})
	defer s.ln.Close()
	h := s.Handler()

	const sample = "# HELP profi_test_events_total Test counter.\n# TYPE profi_test_events_total counter\nprofi_test_events_total 3\n"
	code, header, body := get(t, h, http.MethodGet, "/metrics", nil)
	if code != http.StatusOK || body != sample {
		t.Errorf("/metrics = %d %q, want 200 %q", code, body, sample)
	}
	if ct := header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
		t.Errorf("Content-Type = %q, want the text format 0.0.4", ct)
	}

	// OpenMetrics when the scraper asks for it.
	code, header, body = get(t, h, http.MethodGet, "/metrics", http.Header{"Accept": {"application/openmetrics-text; version=1.0.0"}})
	if ct := header.Get("Content-Type"); code != http.StatusOK || !strings.HasPrefix(ct, "application/openmetrics-text") {
		t.Errorf("OpenMetrics scrape = %d, Content-Type %q", code, ct)
	}
	const om = "# HELP profi_test_events Test counter.\n# TYPE profi_test_events counter\nprofi_test_events_total 3.0\n# EOF\n"
	if body != om {
		t.Errorf("OpenMetrics body = %q, want %q", body, om)
	}
	if renders.Load() != 2 {
		t.Errorf("Encode observed %d renders, want 2", renders.Load())
	}
}

func TestMetricsGathererErrorStillServes(t *testing.T) {
	t.Parallel()
	reg := testGatherer(t)
	gatherers := prometheus.Gatherers{reg, prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		return nil, errors.New("gather failed")
	})}
	s := listen(t, Options{Gatherer: gatherers})
	defer s.ln.Close()
	code, _, body := get(t, s.Handler(), http.MethodGet, "/metrics", nil)
	// ContinueOnError: what could be gathered is served.
	if code != http.StatusOK || !strings.Contains(body, "profi_test_events_total 3\n") {
		t.Errorf("/metrics = %d %q", code, body)
	}
}

func TestMethods(t *testing.T) {
	t.Parallel()
	s := listen(t, Options{Heartbeat: time.Now})
	defer s.ln.Close()
	h := s.Handler()
	for _, path := range []string{"/metrics", "/health", "/ready", "/status"} {
		if code, _, _ := get(t, h, http.MethodPost, path, nil); code != http.StatusMethodNotAllowed {
			t.Errorf("POST %s = %d, want 405", path, code)
		}
	}
	if code, _, _ := get(t, h, http.MethodGet, "/nope", nil); code != http.StatusNotFound {
		t.Errorf("GET /nope = %d, want 404", code)
	}
	// HEAD works where GET does (kubelet and load balancers use it).
	if code, _, _ := get(t, h, http.MethodHead, "/health", nil); code != http.StatusOK {
		t.Errorf("HEAD /health = %d, want 200", code)
	}
}

func TestListenError(t *testing.T) {
	t.Parallel()
	s := listen(t, Options{})
	defer s.ln.Close()
	// The port is taken.
	_, err := Listen(Options{Listen: s.Addr()})
	if err == nil || !strings.Contains(err.Error(), s.Addr()) {
		t.Errorf("Listen on a used address = %v, want an error naming it", err)
	}
	if _, err := Listen(Options{Listen: "not an address"}); err == nil {
		t.Error("Listen on a malformed address succeeded")
	}
}

func TestServeOverNetwork(t *testing.T) {
	t.Parallel()
	s := listen(t, Options{Heartbeat: time.Now})
	if !strings.HasPrefix(s.Addr(), "127.0.0.1:") || strings.HasSuffix(s.Addr(), ":0") {
		t.Errorf("Addr = %q, want the bound port", s.Addr())
	}
	serve(t, s)
	for path, want := range map[string]string{
		"/health":  "ok\n",
		"/metrics": "profi_test_events_total 3\n",
		"/status":  `"tracked_pids": []`,
	} {
		resp, err := http.Get("http://" + s.Addr() + path)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), want) {
			t.Errorf("GET %s = %d %q, want 200 with %q", path, resp.StatusCode, b, want)
		}
	}
}
