package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptrace"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	authenticationclient "k8s.io/client-go/kubernetes/typed/authentication/v1"

	"github.com/profi-dev/profi/internal/auth"
	"github.com/profi-dev/profi/internal/collector"
	"github.com/profi-dev/profi/internal/config"
	"github.com/profi-dev/profi/internal/status"
	"github.com/profi-dev/profi/internal/testutil/certtest"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// goodToken is the one token fakeReviews authenticates. The real
// TokenReview API is exercised in internal/auth; here the HTTP and TLS
// layers around it are.
const goodToken = "good-token"

type fakeReviews struct {
	authenticationclient.TokenReviewInterface
	calls atomic.Int64
}

func (f *fakeReviews) Create(_ context.Context, tr *authenticationv1.TokenReview, _ metav1.CreateOptions) (*authenticationv1.TokenReview, error) {
	f.calls.Add(1)
	out := tr.DeepCopy()
	if tr.Spec.Token == goodToken {
		out.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: authenticationv1.UserInfo{Username: "scraper"}}
	}
	return out, nil
}

// pki is a server CA and certificate, a client CA with a good and an
// expired client certificate, and a foreign CA's client certificate.
type pki struct {
	serverCA, clientCA, otherCA            *certtest.CA
	server, client, expired, foreignClient *certtest.KeyPair
	vol                                    *certtest.SecretVolume
}

func newPKI(t *testing.T) *pki {
	p := &pki{serverCA: certtest.NewCA(t, "server-ca"), clientCA: certtest.NewCA(t, "client-ca"), otherCA: certtest.NewCA(t, "other-ca")}
	p.server = p.serverCA.Server(t)
	p.client = p.clientCA.Client(t, "prometheus")
	p.expired = p.clientCA.Issue(t, certtest.CertOptions{CommonName: "old", Client: true,
		NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-24 * time.Hour)})
	p.foreignClient = p.otherCA.Client(t, "intruder")
	p.vol = certtest.NewSecretVolume(t, map[string][]byte{
		"tls.crt": p.server.CertPEM, "tls.key": p.server.KeyPEM, "ca.crt": p.clientCA.PEM,
	})
	return p
}

// secureServer starts a server in the given TLS and auth modes and returns
// it with its HTTP self-metrics and the fake TokenReview API.
func secureServer(t *testing.T, p *pki, tlsMode, authMode string) (*Server, *prometheus.Registry, *fakeReviews) {
	t.Helper()
	h := collector.NewHTTP()
	reg := prometheus.NewRegistry()
	reg.MustRegister(h.Collectors()...)
	opts := Options{Listen: "127.0.0.1:0", Gatherer: reg, Status: func() status.Doc { return status.Doc{TrackedPIDs: []int{}} }}
	if tlsMode != config.TLSModeOff {
		opts.TLS = &TLSOptions{CertFile: p.vol.Path("tls.crt"), KeyFile: p.vol.Path("tls.key"),
			Handshakes: h.TLSHandshakes, ReloadFailures: h.TLSReloadFailures}
		if tlsMode == config.TLSModeMTLS {
			opts.TLS.ClientCAFile = p.vol.Path("ca.crt")
		}
	}
	reviews := &fakeReviews{}
	a, err := auth.New(auth.Options{
		Mode: authMode, ClientCerts: tlsMode == config.TLSModeMTLS, Reviews: reviews, CacheTTL: time.Minute,
		Metrics: auth.Metrics{Success: h.AuthSuccess, Failures: h.AuthFailures, Cache: h.TokenReviewCache, Latency: h.TokenReviewLatency},
	})
	if err != nil {
		t.Fatal(err)
	}
	opts.Protect = a.Wrap
	s := listen(t, opts)
	serve(t, s)
	return s, reg, reviews
}

// client is an HTTPS (or HTTP) client trusting the server CA, presenting
// cert when not nil. Each client has its own connections.
func (p *pki) httpClient(t *testing.T, cert *certtest.KeyPair, trustServer bool) *http.Client {
	t.Helper()
	cfg := &tls.Config{RootCAs: p.serverCA.Pool()}
	if !trustServer {
		cfg.RootCAs = x509.NewCertPool()
	}
	if cert != nil {
		// Presented whatever CAs the server names: Go's client would
		// otherwise keep quiet about a certificate of a foreign CA.
		c := cert.TLSCertificate(t)
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &c, nil }
	}
	tr := &http.Transport{TLSClientConfig: cfg}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

type reply struct {
	code    int
	auth    string // WWW-Authenticate
	serial  string // serial of the server certificate
	reused  bool   // the request went over a kept-alive connection
	failure string // transport error
}

func do(c *http.Client, url, token string) reply {
	var reused bool
	trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), http.MethodGet, url, nil)
	if err != nil {
		return reply{failure: err.Error()}
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return reply{failure: err.Error()}
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	r := reply{code: resp.StatusCode, auth: resp.Header.Get("WWW-Authenticate"), reused: reused}
	if resp.TLS != nil && len(resp.TLS.PeerCertificates) > 0 {
		r.serial = resp.TLS.PeerCertificates[0].SerialNumber.String()
	}
	return r
}

// httpCounts reads every profi_system_http_* counter as "name{value}" → count.
func httpCounts(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if m.GetCounter() == nil {
				continue
			}
			var lv []string
			for _, l := range m.GetLabel() {
				lv = append(lv, l.GetValue())
			}
			out[mf.GetName()+"{"+strings.Join(lv, ",")+"}"] = m.GetCounter().GetValue()
		}
	}
	return out
}

// requireCounts waits until every HTTP counter equals want (missing keys:
// 0). Handshake outcomes are counted by the server after the client has
// seen them, hence the wait; the values compared are exact.
func requireCounts(t *testing.T, reg *prometheus.Registry, want map[string]float64) {
	t.Helper()
	err := testenv.Eventually(5*time.Second, func() error {
		got := httpCounts(t, reg)
		var diff []string
		for _, k := range slices.Sorted(maps.Keys(got)) {
			if got[k] != want[k] {
				diff = append(diff, fmt.Sprintf("%s = %v, want %v", k, got[k], want[k]))
			}
		}
		for k := range want {
			if _, ok := got[k]; !ok {
				diff = append(diff, "missing "+k)
			}
		}
		if diff != nil {
			return fmt.Errorf("self-metrics:\n  %s", strings.Join(diff, "\n  "))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

const (
	hsOK      = "profi_system_http_tls_handshakes_total{ok}"
	hsBadCert = "profi_system_http_tls_handshakes_total{bad_cert}"
	hsError   = "profi_system_http_tls_handshakes_total{error}"
	okMTLS    = "profi_system_http_auth_success_total{mtls}"
	okBearer  = "profi_system_http_auth_success_total{bearer}"
	noAuth    = "profi_system_http_auth_failures_total{no_auth}"
	deny      = "profi_system_http_auth_failures_total{tokenreview_deny}"
	cacheHit  = "profi_system_http_tokenreview_cache_total{hit}"
	cacheMiss = "profi_system_http_tokenreview_cache_total{miss}"
	reloadBad = "profi_system_http_tls_reload_failures_total{}"
)

// One request of a matrix case: who asks what, and what comes back.
type step struct {
	name    string
	cert    string // "", "client", "expired", "foreign"
	plain   bool   // plain HTTP to the port
	untrust bool   // the client does not trust the server CA
	token   string
	path    string
	code    int    // 0: the connection fails
	fails   string // substring of the client's error when code is 0
}

// Every valid combination of --metrics-tls-mode and --metrics-auth-mode
// (docs/INTERFACE.md 2.5), with real handshakes: accepted and rejected
// requests, and the exact self-metrics they leave.
func TestTLSAuthMatrix(t *testing.T) {
	cases := []struct {
		tls, auth string
		steps     []step
		want      map[string]float64
	}{
		{config.TLSModeOff, config.AuthModeBearer, []step{
			{name: "token", token: goodToken, path: "/metrics", code: 200},
			{name: "token again (cached)", token: goodToken, path: "/status", code: 200},
			{name: "no token", path: "/metrics", code: 401},
			{name: "bad token", token: "bad", path: "/metrics", code: 401},
			{name: "bad token again (negative cache)", token: "bad", path: "/status", code: 401},
			{name: "health needs nothing", path: "/health", code: 200},
			{name: "ready needs nothing", path: "/ready", code: 200},
		}, map[string]float64{okBearer: 2, noAuth: 1, deny: 2, cacheHit: 2, cacheMiss: 2}},
		{config.TLSModeServer, config.AuthModeOff, []step{
			{name: "https", path: "/metrics", code: 200},
			{name: "status", path: "/status", code: 200},
			{name: "plain http refused", plain: true, path: "/metrics", code: 400},
			{name: "untrusted server", untrust: true, path: "/metrics", fails: "certificate signed by unknown authority"},
		}, map[string]float64{hsOK: 2, hsError: 2}},
		{config.TLSModeServer, config.AuthModeBearer, []step{
			{name: "token", token: goodToken, path: "/metrics", code: 200},
			{name: "no token", path: "/status", code: 401},
			{name: "bad token", token: "bad", path: "/metrics", code: 401},
			{name: "client cert is no credential", cert: "client", path: "/metrics", code: 401},
			{name: "health", path: "/health", code: 200},
		}, map[string]float64{hsOK: 5, okBearer: 1, noAuth: 2, deny: 1, cacheMiss: 2}},
		{config.TLSModeMTLS, config.AuthModeOff, []step{
			{name: "client cert", cert: "client", path: "/metrics", code: 200},
			{name: "client cert status", cert: "client", path: "/status", code: 200},
			{name: "no cert", path: "/metrics", code: 403},
			{name: "no cert, status", path: "/status", code: 403},
			{name: "no cert, health for kubelet probes", path: "/health", code: 200},
			{name: "no cert, ready for kubelet probes", path: "/ready", code: 200},
			{name: "foreign CA", cert: "foreign", path: "/metrics", fails: "unknown certificate authority"},
			{name: "expired", cert: "expired", path: "/metrics", fails: "expired certificate"},
			{name: "token is no credential", token: goodToken, path: "/metrics", code: 403},
		}, map[string]float64{hsOK: 7, hsBadCert: 2, okMTLS: 2, noAuth: 3}},
		{config.TLSModeMTLS, config.AuthModeMTLSOrBearer, []step{
			{name: "client cert", cert: "client", path: "/metrics", code: 200},
			{name: "token without cert", token: goodToken, path: "/metrics", code: 200},
			{name: "token without cert, status", token: goodToken, path: "/status", code: 200},
			{name: "neither", path: "/metrics", code: 401},
			{name: "bad token", token: "bad", path: "/status", code: 401},
			{name: "health without credentials", path: "/health", code: 200},
			{name: "foreign CA fails even with a token", cert: "foreign", token: goodToken, path: "/metrics", fails: "unknown certificate authority"},
			{name: "expired fails", cert: "expired", path: "/metrics", fails: "expired certificate"},
		}, map[string]float64{hsOK: 6, hsBadCert: 2, okMTLS: 1, okBearer: 2, noAuth: 1, deny: 1, cacheHit: 1, cacheMiss: 2}},
	}
	for _, tc := range cases {
		t.Run(tc.tls+"/"+tc.auth, func(t *testing.T) {
			t.Parallel()
			p := newPKI(t)
			s, reg, reviews := secureServer(t, p, tc.tls, tc.auth)
			certs := map[string]*certtest.KeyPair{"client": p.client, "expired": p.expired, "foreign": p.foreignClient}
			for _, st := range tc.steps {
				scheme := "https"
				if tc.tls == config.TLSModeOff || st.plain {
					scheme = "http"
				}
				r := do(p.httpClient(t, certs[st.cert], !st.untrust), scheme+"://"+s.Addr()+st.path, st.token)
				switch {
				case st.code == 0 && r.failure == "":
					// The alert's text may be lost to a connection reset;
					// the handshake counters say exactly why it failed.
					t.Errorf("%s: got %+v, want a failure (%s)", st.name, r, st.fails)
				case st.code != 0 && r.code != st.code:
					t.Errorf("%s: got %+v, want HTTP %d", st.name, r, st.code)
				case r.code == 401 && r.auth != `Bearer realm="profi"`:
					t.Errorf("%s: 401 with WWW-Authenticate %q", st.name, r.auth)
				}
			}
			requireCounts(t, reg, tc.want)
			if got := reviews.calls.Load(); float64(got) != tc.want[cacheMiss] {
				t.Errorf("%d TokenReview calls, want one per cache miss (%v)", got, tc.want[cacheMiss])
			}
		})
	}
}

// cert-manager rotates a Secret volume by swapping its ..data link: a new
// connection gets the new certificate at once, a kept-alive one goes on
// with the old; files that do not load keep the current material.
func TestCertificateRotation(t *testing.T) {
	p := newPKI(t)
	s, reg, _ := secureServer(t, p, config.TLSModeMTLS, config.AuthModeOff)
	url := "https://" + s.Addr() + "/metrics"
	old := p.httpClient(t, p.client, true)
	first := p.server.Cert.SerialNumber.String()
	if r := do(old, url, ""); r.code != 200 || r.serial != first {
		t.Fatalf("before rotation: %+v, want 200 with serial %s", r, first)
	}

	// New server certificate and a new client CA, as one atomic update.
	newClientCA := certtest.NewCA(t, "client-ca-2")
	next := p.serverCA.Server(t)
	p.vol.Update(t, map[string][]byte{"tls.crt": next.CertPEM, "tls.key": next.KeyPEM, "ca.crt": newClientCA.PEM})
	second := next.Cert.SerialNumber.String()
	newClient := newClientCA.Client(t, "prometheus")
	if r := do(p.httpClient(t, newClient, true), url, ""); r.code != 200 || r.serial != second {
		t.Errorf("new connection after rotation: %+v, want 200 with serial %s", r, second)
	}
	if r := do(old, url, ""); r.code != 200 || r.serial != first || !r.reused {
		t.Errorf("kept-alive connection after rotation: %+v, want 200 on the same connection with serial %s", r, first)
	}
	if r := do(p.httpClient(t, p.client, true), url, ""); r.failure == "" || !strings.Contains(r.failure, "unknown certificate authority") {
		t.Errorf("old client CA's certificate on a new connection: %+v, want rejected", r)
	}

	// A broken update (key of another certificate) is refused once; the
	// current certificate stays.
	p.vol.Update(t, map[string][]byte{"tls.crt": p.server.CertPEM, "tls.key": next.KeyPEM, "ca.crt": newClientCA.PEM})
	for range 2 {
		if r := do(p.httpClient(t, newClient, true), url, ""); r.code != 200 || r.serial != second {
			t.Errorf("after a broken update: %+v, want 200 with serial %s", r, second)
		}
	}
	requireCounts(t, reg, map[string]float64{hsOK: 4, hsBadCert: 1, okMTLS: 5, reloadBad: 1})
}

// A listener whose files are wrong at start-up is an error, not a server
// without TLS.
func TestTLSBadFilesAtStart(t *testing.T) {
	p := newPKI(t)
	cases := map[string]TLSOptions{
		"missing cert":   {CertFile: p.vol.Path("nope.crt"), KeyFile: p.vol.Path("tls.key")},
		"key mismatch":   {CertFile: p.vol.Path("ca.crt"), KeyFile: p.vol.Path("tls.key")},
		"client CA junk": {CertFile: p.vol.Path("tls.crt"), KeyFile: p.vol.Path("tls.key"), ClientCAFile: p.vol.Path("tls.key")},
	}
	for name, o := range cases {
		_, err := Listen(Options{Listen: "127.0.0.1:0", TLS: &o, Gatherer: prometheus.NewRegistry()})
		if err == nil {
			t.Errorf("%s: Listen succeeded", name)
		}
	}
}

// Only modern TLS: 1.0 and 1.1 and CBC suites are refused.
func TestTLSModernOnly(t *testing.T) {
	p := newPKI(t)
	s, reg, _ := secureServer(t, p, config.TLSModeServer, config.AuthModeOff)
	for name, cfg := range map[string]*tls.Config{
		"tls1.1":    {MaxVersion: tls.VersionTLS11, MinVersion: tls.VersionTLS10},
		"cbc suite": {MaxVersion: tls.VersionTLS12, CipherSuites: []uint16{tls.TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA, tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA}},
	} {
		cfg.RootCAs = p.serverCA.Pool()
		c, err := tls.Dial("tcp", s.Addr(), cfg)
		if err == nil {
			c.Close()
			t.Errorf("%s: handshake succeeded", name)
		}
	}
	requireCounts(t, reg, map[string]float64{hsError: 2})
}

// The reasons auth reports are exactly the label values the collector
// initialises at zero.
func TestAuthReasonsInitialised(t *testing.T) {
	var got []string
	for _, r := range auth.Reasons {
		got = append(got, string(r))
	}
	if !slices.Equal(got, collector.AuthFailureReasons) {
		t.Errorf("auth.Reasons = %v, collector.AuthFailureReasons = %v", got, collector.AuthFailureReasons)
	}
	if !slices.Equal([]string{auth.MethodMTLS, auth.MethodBearer}, collector.AuthMethods) {
		t.Errorf("collector.AuthMethods = %v", collector.AuthMethods)
	}
	if !slices.Equal(RefusalReasons, collector.HTTPRefusalReasons) {
		t.Errorf("RefusalReasons = %v, collector.HTTPRefusalReasons = %v", RefusalReasons, collector.HTTPRefusalReasons)
	}
}
