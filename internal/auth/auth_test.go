package auth

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	authenticationv1 "k8s.io/api/authentication/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	authenticationclient "k8s.io/client-go/kubernetes/typed/authentication/v1"

	"github.com/profi-dev/profi/internal/config"
	"github.com/profi-dev/profi/internal/testutil/kubetest"
)

// metrics is a fresh set of the counters an Authenticator updates.
func metrics() (Metrics, func(vec *prometheus.CounterVec, label string) float64) {
	m := Metrics{
		Success:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "s"}, []string{"method"}),
		Failures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "f"}, []string{"reason"}),
		Cache:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c"}, []string{"result"}),
		Latency:  prometheus.NewHistogram(prometheus.HistogramOpts{Name: "l"}),
	}
	return m, func(vec *prometheus.CounterVec, label string) float64 {
		return testutil.ToFloat64(vec.WithLabelValues(label))
	}
}

// request runs one GET of path with token through a guarded handler.
func request(a *Authenticator, path, token string) *httptest.ResponseRecorder {
	h := a.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }))
	req := httptest.NewRequest(http.MethodGet, path, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// clock is a manual clock for the caches and the rate limiter.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// scripted answers TokenReviews from a table: token → status, or err.
type scripted struct {
	authenticationclient.TokenReviewInterface
	status map[string]authenticationv1.TokenReviewStatus
	err    error
	calls  atomic.Int64
}

func (s *scripted) Create(_ context.Context, tr *authenticationv1.TokenReview, _ metav1.CreateOptions) (*authenticationv1.TokenReview, error) {
	s.calls.Add(1)
	if s.err != nil {
		return nil, s.err
	}
	out := tr.DeepCopy()
	out.Status = s.status[tr.Spec.Token]
	return out, nil
}

// The cache and error paths that the real API server cannot be made to
// take on demand: an authenticator that ignores the audience, an API
// error, renewal ahead of expiry (the last quarter of the TTL), a TTL of 0
// and LRU eviction.
func TestCacheAndErrors(t *testing.T) {
	user := authenticationv1.UserInfo{Username: "u"}
	rv := &scripted{status: map[string]authenticationv1.TokenReviewStatus{
		"ok":    {Authenticated: true, User: user, Audiences: []string{"profi"}},
		"ok2":   {Authenticated: true, User: user, Audiences: []string{"profi"}},
		"noaud": {Authenticated: true, User: user, Audiences: []string{"kubernetes"}},
	}}
	m, get := metrics()
	clk := &clock{now: time.Unix(1000, 0)}
	a, err := New(Options{Mode: config.AuthModeBearer, Reviews: rv, Audience: "profi", CacheTTL: time.Minute,
		CacheSize: 1, NegativeTTL: 10 * time.Second, Rate: 1000, Burst: 1000, ClientRate: 1000, ClientBurst: 1000,
		Metrics: m, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name, token string
		advance     time.Duration
		code        int
		calls       int64 // total TokenReview calls after the step
	}{
		{"valid", "ok", 0, 200, 1},
		{"valid, cached", "ok", 44 * time.Second, 200, 1},
		{"valid, renewed in the last quarter of its TTL", "ok", time.Second, 200, 2},
		{"valid, renewed: cached again", "ok", 44 * time.Second, 200, 2},
		{"valid, TTL passed: renewed", "ok", 16 * time.Second, 200, 3},
		{"other valid evicts it (size 1)", "ok2", 0, 200, 4},
		{"first valid again: evicted", "ok", 0, 200, 5},
		{"audience not in the review", "noaud", 0, 401, 6},
		{"audience mismatch, negative cache", "noaud", 9 * time.Second, 401, 6},
		{"negative cache expired", "noaud", time.Second, 401, 7},
	}
	for _, st := range steps {
		clk.Add(st.advance)
		rec := request(a, "/metrics", st.token)
		if rec.Code != st.code || rv.calls.Load() != st.calls {
			t.Errorf("%s: HTTP %d after %d calls, want %d after %d", st.name, rec.Code, rv.calls.Load(), st.code, st.calls)
		}
	}
	if got := get(m.Failures, string(AudienceMismatch)); got != 3 {
		t.Errorf("audience_mismatch = %v, want 3", got)
	}
	if hit, miss := get(m.Cache, "hit"), get(m.Cache, "miss"); hit != 3 || miss != 7 {
		t.Errorf("cache hit %v miss %v, want 3 and 7", hit, miss)
	}

	// An API error is a 503, never cached: each request asks again.
	down := &scripted{err: errors.New("connection refused")}
	m, get = metrics()
	a, err = New(Options{Mode: config.AuthModeBearer, Reviews: down, CacheTTL: 0, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if rec := request(a, "/metrics", "ok"); rec.Code != http.StatusServiceUnavailable {
			t.Errorf("API error: HTTP %d, want 503", rec.Code)
		}
	}
	if down.calls.Load() != 3 || get(m.Failures, string(TokenReviewError)) != 3 {
		t.Errorf("%d calls, %v tokenreview_error; want 3 and 3", down.calls.Load(), get(m.Failures, string(TokenReviewError)))
	}

	// TTL 0: no positive cache.
	rv.calls.Store(0)
	a, err = New(Options{Mode: config.AuthModeBearer, Reviews: rv, CacheTTL: 0})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		request(a, "/metrics", "ok")
	}
	if rv.calls.Load() != 3 {
		t.Errorf("TTL 0: %d calls for 3 requests, want 3", rv.calls.Load())
	}
}

// Requests without credentials, and the modes' preconditions.
func TestNoCredentialsAndOptions(t *testing.T) {
	m, get := metrics()
	a, err := New(Options{Mode: config.AuthModeBearer, Reviews: &scripted{}, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	h := a.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	for _, hdr := range []string{"", "Basic dXNlcjpwdw==", "Bearer ", "Bearer"} {
		req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
		req.Header.Set("Authorization", hdr)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != 401 || rec.Header().Get("WWW-Authenticate") != `Bearer realm="profi"` {
			t.Errorf("Authorization %q: HTTP %d, WWW-Authenticate %q", hdr, rec.Code, rec.Header().Get("WWW-Authenticate"))
		}
	}
	if got := get(m.Failures, string(NoAuth)); got != 4 {
		t.Errorf("no_auth = %v, want 4", got)
	}
	for name, o := range map[string]Options{
		"bearer without client":         {Mode: config.AuthModeBearer},
		"mtls-or-bearer without mtls":   {Mode: config.AuthModeMTLSOrBearer, Reviews: &scripted{}},
		"authorize without access":      {Mode: config.AuthModeBearer, Reviews: &scripted{}, Authorize: true},
		"unknown mode":                  {Mode: "basic"},
		"mtls-or-bearer without client": {Mode: config.AuthModeMTLSOrBearer, ClientCerts: true},
	} {
		if _, err := New(o); err == nil {
			t.Errorf("%s: New succeeded", name)
		}
	}
}

// countingTransport counts the review calls a client makes.
type countingTransport struct {
	next                http.RoundTripper
	reviews, accessRevs *atomic.Int64
}

func (c countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	switch {
	case strings.HasSuffix(r.URL.Path, "/tokenreviews"):
		c.reviews.Add(1)
	case strings.HasSuffix(r.URL.Path, "/subjectaccessreviews"):
		c.accessRevs.Add(1)
	}
	return c.next.RoundTrip(r)
}

// apiserverClient is the agent's own client: a ServiceAccount bound to
// system:auth-delegator (TokenReview and SubjectAccessReview rights),
// counting its review calls.
func apiserverClient(t *testing.T, s *kubetest.APIServer) (kubernetes.Interface, *atomic.Int64, *atomic.Int64) {
	t.Helper()
	s.BindClusterRole(t, "profi-auth-delegator", "system:auth-delegator",
		rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: "profi", Namespace: "default"})
	cfg := s.ServiceAccountConfig(t, "default", "profi")
	var reviews, access atomic.Int64
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return countingTransport{rt, &reviews, &access} })
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c, &reviews, &access
}

// TokenReview and SubjectAccessReview against the real kube-apiserver:
// static tokens, ServiceAccount tokens from the TokenRequest API with and
// without an audience, a wrong audience, RBAC allow and deny. Each case
// starts with empty caches and costs exactly one TokenReview (plus one
// SubjectAccessReview when authenticated).
func TestAPIServer(t *testing.T) {
	s := kubetest.StartAPIServer(t)
	client, reviews, access := apiserverClient(t, s)
	t.Run("reviews", func(t *testing.T) { testReviews(t, s, client, reviews, access) })
	t.Run("burst", func(t *testing.T) { testBurstOfBadTokens(t, s, client, reviews) })
}

func testReviews(t *testing.T, s *kubetest.APIServer, client kubernetes.Interface, reviews, access *atomic.Int64) {
	// Who may scrape: the static reader group and the prometheus
	// ServiceAccount, /metrics only.
	s.GrantClusterRole(t, "profi-metrics-reader",
		[]rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}},
		rbacv1.Subject{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: kubetest.APIServerReaderGroup},
		rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: "prometheus", Namespace: "default"})
	prom := s.ServiceAccountToken(t, "default", "prometheus")
	promProfi := s.ServiceAccountToken(t, "default", "prometheus", "profi")
	promOther := s.ServiceAccountToken(t, "default", "prometheus", "someone-else")
	stranger := s.ServiceAccountToken(t, "default", "stranger")

	cases := []struct {
		name, audience, token, path string
		code                        int
		reason                      Reason // "" = success
	}{
		{"static token, RBAC allows", "", s.ReaderToken, "/metrics", 200, ""},
		{"static token, RBAC denies the path", "", s.ReaderToken, "/status", 403, Forbidden},
		{"static token without rights", "", s.NobodyToken, "/metrics", 403, Forbidden},
		{"ServiceAccount token, RBAC allows", "", prom, "/metrics", 200, ""},
		{"ServiceAccount token without rights", "", stranger, "/metrics", 403, Forbidden},
		{"ServiceAccount token for another audience, none asked", "", promProfi, "/metrics", 401, TokenReviewDeny},
		{"ServiceAccount token with our audience", "profi", promProfi, "/metrics", 200, ""},
		{"ServiceAccount token with a wrong audience", "profi", promOther, "/metrics", 401, TokenReviewDeny},
		{"ServiceAccount token of the API server's audience", "profi", prom, "/metrics", 401, TokenReviewDeny},
		{"static token when an audience is required", "profi", s.ReaderToken, "/metrics", 401, TokenReviewDeny},
		{"garbage token", "", "not-a-token", "/metrics", 401, TokenReviewDeny},
	}
	for _, tc := range cases {
		m, get := metrics()
		a, err := New(Options{Mode: config.AuthModeBearer, Reviews: client.AuthenticationV1().TokenReviews(),
			Access: client.AuthorizationV1().SubjectAccessReviews(), Authorize: true,
			Audience: tc.audience, CacheTTL: time.Minute, Metrics: m})
		if err != nil {
			t.Fatal(err)
		}
		r0, a0 := reviews.Load(), access.Load()
		for range 3 { // the second and third are answered from the caches
			if rec := request(a, tc.path, tc.token); rec.Code != tc.code {
				t.Errorf("%s: HTTP %d, want %d", tc.name, rec.Code, tc.code)
			}
		}
		wantSAR := int64(0)
		if tc.reason == "" || tc.reason == Forbidden {
			wantSAR = 1
		}
		if r, ac := reviews.Load()-r0, access.Load()-a0; r != 1 || ac != wantSAR {
			t.Errorf("%s: %d TokenReviews and %d SubjectAccessReviews, want 1 and %d", tc.name, r, ac, wantSAR)
		}
		if tc.reason == "" {
			if got := get(m.Success, MethodBearer); got != 3 {
				t.Errorf("%s: success = %v, want 3", tc.name, got)
			}
		} else if got := get(m.Failures, string(tc.reason)); got != 3 {
			t.Errorf("%s: %s = %v, want 3", tc.name, tc.reason, got)
		}
		if hit, miss := get(m.Cache, "hit"), get(m.Cache, "miss"); hit != 2 || miss != 1 {
			t.Errorf("%s: cache hit %v miss %v, want 2 and 1", tc.name, hit, miss)
		}
	}
}

// A burst of random tokens costs the API server at most the rate limiter's
// burst of TokenReviews; repeats are answered by the negative cache; a
// cached valid token keeps working through the flood. All requests come
// from httptest's one address, which used its own budget for the valid
// token, so the flood may take the agent-wide budget only down to the
// reserve kept for quiet clients (issue 30 item 7; TestClientsCannotStarveOthers).
func testBurstOfBadTokens(t *testing.T, s *kubetest.APIServer, client kubernetes.Interface, reviews *atomic.Int64) {
	reviews.Store(0)
	m, get := metrics()
	clk := &clock{now: time.Unix(1000, 0)}
	const (
		burst, n = 5, 200
		reserve  = 2 // half the agent-wide burst, rounded down
		// The flood's reviews: the burst less the valid token's one
		// and the reserve.
		flood = burst - 1 - reserve
		// After the refill the client is quiet again: its first
		// review may draw on the reserve, the rest stop above it.
		refill = 1 + burst - 1 - reserve
	)
	// The per-client budget is set above the flood, so only the
	// agent-wide one (and its reserve) refuses.
	a, err := New(Options{Mode: config.AuthModeBearer, Reviews: client.AuthenticationV1().TokenReviews(),
		CacheTTL: time.Minute, NegativeTTL: 10 * time.Second, Rate: 1, Burst: burst, ClientRate: 1000, ClientBurst: 1000,
		Metrics: m, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	if rec := request(a, "/metrics", s.ReaderToken); rec.Code != 200 { // cached before the flood
		t.Fatalf("valid token: HTTP %d", rec.Code)
	}
	codes := map[int]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			code := request(a, "/metrics", fmt.Sprintf("random-%d", i)).Code
			mu.Lock()
			codes[code]++
			mu.Unlock()
		})
	}
	wg.Wait()
	// The clock stands still, so no token is refilled.
	if got := reviews.Load(); got != 1+flood {
		t.Errorf("%d TokenReview calls for the valid token and %d bad ones, want %d", got, n, 1+flood)
	}
	if codes[401] != flood || codes[429] != n-flood {
		t.Errorf("responses %v, want %d × 401 and %d × 429", codes, flood, n-flood)
	}
	if rec := request(a, "/metrics", s.ReaderToken); rec.Code != 200 {
		t.Errorf("valid cached token during the flood: HTTP %d", rec.Code)
	}
	// Tokens already denied are answered from the negative cache, without calls.
	before := reviews.Load()
	for i := range n {
		request(a, "/metrics", fmt.Sprintf("random-%d", i))
	}
	if got := reviews.Load() - before; got != 0 {
		t.Errorf("repeated tokens: %d more calls, want 0 (negative cache and rate limit)", got)
	}
	// After the negative TTL the limiter has refilled.
	clk.Add(11 * time.Second)
	before = reviews.Load()
	for i := range n {
		request(a, "/metrics", fmt.Sprintf("random-%d", i))
	}
	if got := reviews.Load() - before; got != refill {
		t.Errorf("after refill: %d calls, want %d", got, refill)
	}
	if got, want := get(m.Failures, string(RateLimited)), float64(n-flood+n-flood+n-refill); got != want {
		t.Errorf("rate_limited = %v, want %v", got, want)
	}
}
