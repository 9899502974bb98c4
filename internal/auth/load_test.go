package auth

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"

	"github.com/profi-dev/profi/internal/config"
	"github.com/profi-dev/profi/internal/testutil/certtest"
	"github.com/profi-dev/profi/internal/testutil/kubetest"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// from runs one GET of /metrics with token from the client address addr.
func from(a *Authenticator, addr, token string) int {
	h := a.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }))
	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	req.RemoteAddr = addr
	req.Header.Set("Authorization", "Bearer "+token)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code
}

// Unknown tokens are budgeted per client address, known-good tokens are
// renewed from a budget of their own and their last answer is served while
// the API server is down or that budget is exhausted, up to StaleGrace past
// the TTL; a "no" from the API server ends it at once.
func TestKnownTokensThroughFloodAndOutage(t *testing.T) {
	user := authenticationv1.UserInfo{Username: "prometheus"}
	rv := &scripted{status: map[string]authenticationv1.TokenReviewStatus{
		"prom": {Authenticated: true, User: user},
		"new":  {Authenticated: true, User: user},
	}}
	m, get := metrics()
	clk := &clock{now: time.Unix(1000, 0)}
	const ttl = time.Minute
	a, err := New(Options{Mode: config.AuthModeBearer, Reviews: rv, CacheTTL: ttl, NegativeTTL: 10 * time.Second,
		Rate: 5, Burst: 30, ClientRate: 1, ClientBurst: 5, KnownRate: 1, KnownBurst: 2, Metrics: m, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	const prom, attacker, newcomer = "10.0.0.1:40000", "10.0.0.2:40000", "[fd00::1:2]:40000"
	if code := from(a, prom, "prom"); code != 200 {
		t.Fatalf("prometheus: HTTP %d", code)
	}
	// 200 random tokens from one address (the clock stands still: no
	// refill): that address's burst of 5 reviews, then 429.
	codes := map[int]int{}
	for i := range 200 {
		codes[from(a, attacker, fmt.Sprintf("random-%d", i))]++
	}
	if codes[401] != 5 || codes[429] != 195 || rv.calls.Load() != 1+5 {
		t.Errorf("flood: %v after %d calls, want 5 × 401, 195 × 429 after 6", codes, rv.calls.Load())
	}
	// Another address, another budget: a new valid token is reviewed.
	if code := from(a, newcomer, "new"); code != 200 || rv.calls.Load() != 7 {
		t.Errorf("new scraper during the flood: HTTP %d after %d calls, want 200 after 7", code, rv.calls.Load())
	}
	// An IPv6 client's budget is its /64: another address in it is refused.
	rv.calls.Store(0)
	for i := range 5 {
		from(a, newcomer, fmt.Sprintf("v6-%d", i)) // the rest of fd00::/64's burst (4) and one 429
	}
	if code := from(a, "[fd00::ffff]:1", "v6-x"); code != 429 || rv.calls.Load() != 4 {
		t.Errorf("same /64: HTTP %d after %d calls, want 429 after 4", code, rv.calls.Load())
	}

	// The known token through an API-server outage: renewal fails, the
	// last answer is served, from the renewal window to StaleGrace past
	// the TTL; renewals are attempted within the known budget only.
	rv.calls.Store(0)
	rv.err = errors.New("connection refused")
	clk.Add(ttl - ttl/4) // the last quarter of the TTL: renewal due
	for range 5 {
		if code := from(a, prom, "prom"); code != 200 {
			t.Errorf("known token, API server down: HTTP %d", code)
		}
	}
	if rv.calls.Load() != 2 { // KnownBurst; then the budget is exhausted: no call
		t.Errorf("renewal attempts = %d, want 2 (the known burst)", rv.calls.Load())
	}
	clk.Add(ttl/4 + StaleGrace - time.Second) // a second before the grace ends
	if code := from(a, prom, "prom"); code != 200 {
		t.Errorf("known token at the end of the grace: HTTP %d", code)
	}
	clk.Add(2 * time.Second)
	if code := from(a, prom, "prom"); code != 503 {
		t.Errorf("known token past the grace, API server down: HTTP %d, want 503", code)
	}
	if got := get(m.Failures, string(TokenReviewError)); got != 1 {
		t.Errorf("tokenreview_error = %v, want 1 (stale answers served are no failures)", got)
	}

	// The API server back: renewed; then revoked: the next renewal's "no"
	// wins over the last answer.
	rv.err = nil
	if code := from(a, prom, "prom"); code != 200 {
		t.Errorf("API server back: HTTP %d", code)
	}
	rv.status["prom"] = authenticationv1.TokenReviewStatus{}
	clk.Add(ttl - ttl/4)
	if code := from(a, prom, "prom"); code != 401 {
		t.Errorf("revoked token at renewal: HTTP %d, want 401", code)
	}
	rv.err = errors.New("connection refused")
	clk.Add(11 * time.Second) // negative entry gone, API server down: no stale "yes" left
	if code := from(a, prom, "prom"); code != 503 {
		t.Errorf("revoked token, API server down: HTTP %d, want 503", code)
	}
}

// issue 17: 50 random bearer tokens per second got 36 of 40 real scrapes
// answered 429. Here a flood of random tokens from 127.0.0.2, as fast as
// eight connections go, runs against a real HTTP server and the real
// kube-apiserver's TokenReview while a scraper on 127.0.0.1 scrapes with
// a valid token whose cache entry (TTL 2 s) is renewed many times during
// the flood: every scrape is answered 200, and every TokenReview the flood
// caused is one 401 (the others were refused by its address's budget).
func TestRandomTokenFloodWhileScraping(t *testing.T) {
	s := kubetest.StartAPIServer(t)
	client, reviews, _ := apiserverClient(t, s)
	m, get := metrics()
	a, err := New(Options{Mode: config.AuthModeBearer, Reviews: client.AuthenticationV1().TokenReviews(),
		CacheTTL: 2 * time.Second, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "profi_test_events_total 3\n")
	})))
	defer srv.Close()
	// The flood's connections come from 127.0.0.2 (all of 127/8 is local).
	flooder := &http.Client{Transport: &http.Transport{
		DialContext:         (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}).DialContext,
		MaxIdleConnsPerHost: 8,
	}}
	get1 := func(c *http.Client, token string) (int, error) {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/metrics", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := c.Do(req)
		if err != nil {
			return 0, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	ctx, stop := context.WithCancel(context.Background())
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		flood  = map[int]int{}
		serial atomic.Int64
	)
	for range 8 {
		wg.Go(func() {
			for ctx.Err() == nil {
				code, err := get1(flooder, fmt.Sprintf("random-%d", serial.Add(1)))
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				flood[code]++
				mu.Unlock()
			}
		})
	}
	// The scraper starts once the flood is under way.
	if err := testenv.Eventually(30*time.Second, func() error {
		if get(m.Failures, string(RateLimited)) < 100 {
			return errors.New("flood not under way")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	const scrapes = 40
	scraper := &http.Client{Transport: &http.Transport{}}
	ok := 0
	for range scrapes {
		code, err := get1(scraper, s.ReaderToken)
		if err != nil {
			t.Fatal(err)
		}
		if code == 200 {
			ok++
		}
		time.Sleep(100 * time.Millisecond) // 4 s of scrapes: the 2 s entry is renewed during the flood
	}
	stop()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	total := flood[401] + flood[429]
	t.Logf("%d of %d scrapes answered 200 during a flood of %d random tokens (%d × 401, %d × 429); %d TokenReviews in all",
		ok, scrapes, total, flood[401], flood[429], reviews.Load())
	if ok != scrapes {
		t.Errorf("%d of %d scrapes answered 200, want all", ok, scrapes)
	}
	if len(flood) != 2 || flood[401] == 0 || flood[429] == 0 {
		t.Errorf("flood responses %v, want only 401 and 429", flood)
	}
	// Every TokenReview is one of the flood's 401s or one of the
	// scraper's (its first review and its renewals).
	scraperReviews := reviews.Load() - int64(flood[401])
	if renewals := get(m.Cache, "miss") - float64(total) - 1; scraperReviews != int64(renewals)+1 {
		t.Errorf("%d TokenReviews for the scraper, want %v (one, plus a renewal per cache miss)", scraperReviews, renewals+1)
	}
	if got := get(m.Success, MethodBearer); got != scrapes {
		t.Errorf("bearer successes = %v, want %d", got, scrapes)
	}
}

// --metrics-tls-allowed-client-sans: a verified certificate without an
// allowed SAN is no credential (403 in mtls, a bearer token may still do
// in mtls-or-bearer); with an allowed DNS name, URI or IP it is.
func TestAllowedSANs(t *testing.T) {
	ca := certtest.NewCA(t, "clients")
	leaf := func(o certtest.CertOptions) *x509.Certificate { o.Client = true; return ca.Issue(t, o).Cert }
	spiffe, _ := url.Parse("spiffe://cluster.local/ns/monitoring/sa/prometheus")
	withURI := leaf(certtest.CertOptions{CommonName: "p"})
	withURI.URIs = []*url.URL{spiffe} // the verified chain as the request carries it
	certs := map[string]*x509.Certificate{
		"dns allowed":   leaf(certtest.CertOptions{CommonName: "p", DNSNames: []string{"prometheus.monitoring.svc"}}),
		"ip allowed":    leaf(certtest.CertOptions{CommonName: "p", IPs: []net.IP{net.IPv4(10, 1, 2, 3)}}),
		"uri allowed":   withURI,
		"other dns":     leaf(certtest.CertOptions{CommonName: "prometheus.monitoring.svc", DNSNames: []string{"intruder.default.svc"}}),
		"no san at all": leaf(certtest.CertOptions{CommonName: "prometheus.monitoring.svc"}),
	}
	allowed := []string{"prometheus.monitoring.svc", "10.1.2.3", spiffe.String()}
	rv := &scripted{status: map[string]authenticationv1.TokenReviewStatus{"ok": {Authenticated: true}}}
	for _, mode := range []string{config.AuthModeOff, config.AuthModeMTLSOrBearer} {
		m, get := metrics()
		a, err := New(Options{Mode: mode, ClientCerts: true, Reviews: rv, AllowedSANs: allowed, CacheTTL: time.Minute, Metrics: m})
		if err != nil {
			t.Fatal(err)
		}
		h := a.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
		for name, cert := range certs {
			for _, token := range []string{"", "ok"} {
				req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
				req.TLS = &tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{cert, ca.Cert}}}
				if token != "" {
					req.Header.Set("Authorization", "Bearer "+token)
				}
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				want := 200
				switch name {
				case "other dns", "no san at all":
					want = map[bool]int{true: 403, false: 401}[mode == config.AuthModeOff]
					if token != "" && mode != config.AuthModeOff {
						want = 200
					}
				}
				if rec.Code != want {
					t.Errorf("%s, %s, token %q: HTTP %d, want %d", mode, name, token, rec.Code, want)
				}
			}
		}
		wantMTLS, wantBearer, wantRefused := 6.0, 0.0, 4.0
		if mode != config.AuthModeOff {
			wantBearer, wantRefused = 2, 2
		}
		if got := get(m.Success, MethodMTLS); got != wantMTLS {
			t.Errorf("%s: mtls successes = %v, want %v", mode, got, wantMTLS)
		}
		if got := get(m.Success, MethodBearer); got != wantBearer {
			t.Errorf("%s: bearer successes = %v, want %v", mode, got, wantBearer)
		}
		if got := get(m.Failures, string(CertNotAllowed)); got != wantRefused {
			t.Errorf("%s: cert_not_allowed = %v, want %v", mode, got, wantRefused)
		}
	}
}

// Five client addresses flooding random tokens at their own rate (1/s
// each) used the whole agent-wide budget (5/s), so a sixth client's new,
// valid token was refused (issue 30 item 7). Clients that used their own
// budget lately may only take the agent-wide budget down to a reserve
// (half its burst) that clients quiet for a while draw on: every new
// scraper is reviewed, and the flood still gets at most the agent's rate.
func TestClientsCannotStarveOthers(t *testing.T) {
	user := authenticationv1.UserInfo{Username: "prometheus"}
	rv := &scripted{status: map[string]authenticationv1.TokenReviewStatus{}}
	clk := &clock{now: time.Unix(1000, 0)}
	a, err := New(Options{Mode: config.AuthModeBearer, Reviews: rv, CacheTTL: time.Minute, NegativeTTL: 10 * time.Second, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	const seconds, steps = 60, 10 // 100 ms steps
	ok, newcomers := 0, 0
	attackerCalls := int64(0)
	for i := range seconds * steps {
		for c := range 5 {
			before := rv.calls.Load()
			from(a, fmt.Sprintf("10.0.0.%d:1", c+1), fmt.Sprintf("random-%d-%d", c, i))
			attackerCalls += rv.calls.Load() - before
		}
		if i%(2*steps) == steps { // a new scraper every 2 s, each from its own address
			tok := fmt.Sprintf("scraper-%d", i)
			rv.status[tok] = authenticationv1.TokenReviewStatus{Authenticated: true, User: user} // one goroutine
			newcomers++
			if code := from(a, fmt.Sprintf("10.1.0.%d:1", i/steps), tok); code == 200 {
				ok++
			}
		}
		clk.Add(time.Second / steps)
	}
	t.Logf("new scrapers reviewed: %d of %d; the flood's reviews: %d in %d s", ok, newcomers, attackerCalls, seconds)
	if ok != newcomers {
		t.Errorf("new scrapers reviewed: %d of %d, want all", ok, newcomers)
	}
	// The agent-wide budget bounds the flood: its burst and 5/s.
	if max := int64(DefaultBurst + seconds*5); attackerCalls > max {
		t.Errorf("the flood got %d reviews, want at most %d", attackerCalls, max)
	}
}
