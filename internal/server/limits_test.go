package server

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"

	"github.com/profi-dev/profi/internal/collector"
	"github.com/profi-dev/profi/internal/config"
	"github.com/profi-dev/profi/internal/testutil/certtest"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// limitServer serves a registry of one counter (profi_test_events_total 3)
// under lim, with the limits' metrics.
func limitServer(t *testing.T, lim Limits, opts Options) (*Server, *collector.HTTP) {
	t.Helper()
	h := collector.NewHTTP()
	opts.Limits = lim
	opts.LimitMetrics = LimitMetrics{Refused: h.Refused, Connections: h.Connections}
	s := listen(t, opts)
	serve(t, s)
	return s, h
}

func refused(h *collector.HTTP, reason string) float64 {
	return promtest.ToFloat64(h.Refused.WithLabelValues(reason))
}

// keepAlive opens a connection, completes one /health request on it and
// leaves it open (an idle keep-alive connection).
func keepAlive(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(c, "GET /health HTTP/1.1\r\nHost: profi\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/health: HTTP %d", resp.StatusCode)
	}
	return c
}

// slowHeader opens a connection and sends a request header that never ends.
func slowHeader(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(c, "GET /metrics HTTP/1.1\r\nHost: profi\r\nX-Slow: "); err != nil {
		t.Fatal(err)
	}
	return c
}

// closedByServer reports whether the server has closed c: a read returns
// end of file or a reset (after whatever the server wrote). The deadline
// only keeps a broken server from hanging the test.
func closedByServer(c net.Conn) error {
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	_, err := io.Copy(io.Discard, c)
	if err == nil || errors.Is(err, syscall.ECONNRESET) {
		return nil
	}
	return err
}

// heapAndStacks is the agent-side memory a connection costs: heap objects
// (buffers, connection state) and goroutine stacks.
func heapAndStacks() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse + m.StackInuse
}

// scrape GETs /metrics on a new connection and checks the exposition.
func scrape(t *testing.T, url string) {
	t.Helper()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get(url + "/metrics")
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "profi_test_events_total 3\n") {
		t.Fatalf("scrape: HTTP %d, body %q", resp.StatusCode, body)
	}
}

// The connection limit under a flood of 1000 idle keep-alive and 1000
// slow-header connections (issue 17: 300 keep-alive connections were all
// kept open with no timeouts): the server holds exactly MaxConns, each
// connection beyond it closes the longest-idle one (counted exactly), the
// memory held stays under a stated bound, and a real scrape is answered.
func TestConnectionFlood(t *testing.T) {
	const maxConns, idle, slow = 64, 1000, 1000
	// Bound on the agent-side memory the whole flood may hold: the 64
	// server connections plus the test's own 2000 client sockets. Without
	// the limit the same flood held 36 MiB (PROFI_TEST_NO_CONN_LIMIT=1).
	const memBound = 8 << 20
	// Timeouts far beyond the test: only the limit closes connections.
	lim := Limits{MaxConns: maxConns, ReadHeaderTimeout: time.Hour, IdleTimeout: time.Hour, ReadTimeout: time.Hour}
	if os.Getenv("PROFI_TEST_NO_CONN_LIMIT") != "" { // the "before" figure of docs/SECURITY.md
		lim.MaxConns = 1 << 20
	}
	s, h := limitServer(t, lim, Options{})
	before := heapAndStacks()
	var clients []net.Conn
	t.Cleanup(func() {
		for _, c := range clients {
			_ = c.Close()
		}
	})
	for range idle {
		clients = append(clients, keepAlive(t, s.Addr()))
	}
	for range slow {
		clients = append(clients, slowHeader(t, s.Addr()))
	}
	wantEvicted := float64(idle + slow - maxConns)
	if lim.MaxConns != maxConns {
		wantEvicted = 0
	}
	// Accepting runs behind the clients' connects (the kernel's backlog).
	if err := testenv.Eventually(30*time.Second, func() error {
		if got := refused(h, RefusedConnEvicted); got != wantEvicted {
			return fmt.Errorf("conn_evicted = %v, want %v", got, wantEvicted)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	held := heapAndStacks() - before
	t.Logf("%d connections opened, %v open on the server, %v evicted; memory held %.1f MiB (bound %d MiB)",
		len(clients), promtest.ToFloat64(h.Connections), refused(h, RefusedConnEvicted), float64(held)/(1<<20), memBound>>20)
	if got := promtest.ToFloat64(h.Connections); got != float64(min(lim.MaxConns, idle+slow)) {
		t.Errorf("open connections = %v, want %d", got, min(lim.MaxConns, idle+slow))
	}
	if held > memBound {
		t.Errorf("the flood holds %d bytes of heap and stacks, bound %d", held, memBound)
	}

	// A scraper still gets in: its connection evicts the oldest idle one.
	scrape(t, "http://"+s.Addr())
	if lim.MaxConns != maxConns {
		return
	}
	if got, want := refused(h, RefusedConnEvicted), wantEvicted+1; got != want {
		t.Errorf("conn_evicted after the scrape = %v, want %v", got, want)
	}
	if got := refused(h, RefusedConnLimit); got != 0 {
		t.Errorf("conn_limit = %v, want 0 (no connection was busy)", got)
	}
	// The evicted ones are the oldest: every client but the newest
	// maxConns-1 (the scrape took one slot) sees its connection closed.
	evicted := len(clients) - (maxConns - 1)
	for i, c := range clients[:evicted] {
		if err := closedByServer(c); err != nil {
			t.Fatalf("client %d of %d evicted: %v", i, evicted, err)
		}
	}
}

// Idle keep-alive connections are closed after IdleTimeout and
// connections that never finish their header after ReadHeaderTimeout;
// none is refused and none stays open.
func TestConnectionTimeouts(t *testing.T) {
	const n = 200
	s, h := limitServer(t, Limits{MaxConns: 4 * n, IdleTimeout: 200 * time.Millisecond, ReadHeaderTimeout: 200 * time.Millisecond}, Options{})
	var clients []net.Conn
	for range n {
		clients = append(clients, keepAlive(t, s.Addr()), slowHeader(t, s.Addr()))
	}
	for i, c := range clients {
		if err := closedByServer(c); err != nil {
			t.Errorf("client %d (%s): %v", i, map[bool]string{true: "keep-alive", false: "slow header"}[i%2 == 0], err)
		}
		_ = c.Close()
	}
	if err := testenv.Eventually(10*time.Second, func() error {
		if got := promtest.ToFloat64(h.Connections); got != 0 {
			return fmt.Errorf("open connections = %v, want 0", got)
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
	for _, r := range RefusalReasons {
		if got := refused(h, r); got != 0 {
			t.Errorf("%s = %v, want 0", r, got)
		}
	}
	scrape(t, "http://"+s.Addr())
}

// blockingMetrics holds every /metrics render until released.
type blockingMetrics struct {
	entered chan struct{}
	release chan struct{}
}

func (m blockingMetrics) Encode(w io.Writer, _ expfmt.Format, _ func(string) bool) error {
	m.entered <- struct{}{}
	<-m.release
	_, err := io.WriteString(w, "profi_test_events_total 3\n")
	return err
}

// At most MaxRequests /metrics and /status requests run at once; beyond
// that 503 with Retry-After, counted, while /health and /ready still answer.
func TestRequestLimit(t *testing.T) {
	const max = 2
	m := blockingMetrics{entered: make(chan struct{}), release: make(chan struct{})}
	s, h := limitServer(t, Limits{MaxRequests: max}, Options{Metrics: m})
	url := "http://" + s.Addr()
	var wg sync.WaitGroup
	codes := make(chan int, max)
	for range max {
		wg.Go(func() {
			resp, err := http.Get(url + "/metrics")
			if err != nil {
				t.Error(err)
				codes <- 0
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			codes <- resp.StatusCode
		})
	}
	for range max {
		<-m.entered
	}
	for _, path := range []string{"/metrics", "/status", "/health", "/ready"} {
		resp, err := http.Get(url + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		want, retry := http.StatusServiceUnavailable, "1"
		if path == "/health" || path == "/ready" {
			want, retry = http.StatusOK, ""
		}
		if resp.StatusCode != want || resp.Header.Get("Retry-After") != retry {
			t.Errorf("%s while %d renders run: HTTP %d Retry-After %q, want %d %q", path, max, resp.StatusCode, resp.Header.Get("Retry-After"), want, retry)
		}
	}
	close(m.release)
	wg.Wait()
	close(codes)
	for c := range codes {
		if c != http.StatusOK {
			t.Errorf("a render in progress: HTTP %d", c)
		}
	}
	if got := refused(h, RefusedRequestLimit); got != 2 {
		t.Errorf("request_limit = %v, want 2", got)
	}
	go func() { <-m.entered }()
	scrape(t, url)
}

// At most MaxHandshakes TLS handshakes run at once: clients that connect
// and never send a ClientHello lose their oldest handshakes to newcomers,
// counted exactly, and a real client's handshake completes.
func TestHandshakeLimit(t *testing.T) {
	const maxHS, stalled = 4, 10
	p := newPKI(t)
	h := collector.NewHTTP()
	opts := Options{TLS: &TLSOptions{CertFile: p.vol.Path("tls.crt"), KeyFile: p.vol.Path("tls.key"), Handshakes: h.TLSHandshakes},
		Limits: Limits{MaxHandshakes: maxHS}, LimitMetrics: LimitMetrics{Refused: h.Refused, Connections: h.Connections}}
	s := listen(t, opts)
	serve(t, s)
	var raw []net.Conn
	for range stalled {
		c, err := net.Dial("tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		raw = append(raw, c)
	}
	if err := testenv.Eventually(30*time.Second, func() error {
		if got := refused(h, RefusedHandshakeEvicted); got != stalled-maxHS {
			return fmt.Errorf("handshake_evicted = %v, want %d", got, stalled-maxHS)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if r := do(p.httpClient(t, nil, true), "https://"+s.Addr()+"/metrics", ""); r.code != http.StatusOK {
		t.Fatalf("real client: %+v", r)
	}
	if got := refused(h, RefusedHandshakeEvicted); got != stalled-maxHS+1 {
		t.Errorf("handshake_evicted after the real client = %v, want %d", got, stalled-maxHS+1)
	}
	for i, c := range raw[:stalled-maxHS+1] {
		if err := closedByServer(c); err != nil {
			t.Errorf("stalled handshake %d: %v", i, err)
		}
	}
	// Evicted handshakes fail as errors; the real one is ok.
	if ok := promtest.ToFloat64(h.TLSHandshakes.WithLabelValues(HandshakeOK)); ok != 1 {
		t.Errorf("handshakes ok = %v, want 1", ok)
	}
}

// The serving certificate (server auth usage only) is refused as a client
// certificate in mtls: client certificates must carry client auth.
func TestServingCertIsNoClientCert(t *testing.T) {
	p := newPKI(t)
	server := p.clientCA.Issue(t, certtest.CertOptions{CommonName: "profi", DNSNames: []string{"localhost"}})
	s, reg, _ := secureServer(t, p, config.TLSModeMTLS, config.AuthModeOff)
	if r := do(p.httpClient(t, server, true), "https://"+s.Addr()+"/metrics", ""); r.code != 0 {
		t.Errorf("a server-auth certificate of the client CA as client certificate: %+v, want a failed handshake", r)
	}
	requireCounts(t, reg, map[string]float64{hsBadCert: 1})
}
