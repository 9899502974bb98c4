package auth

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/singleflight"
	"golang.org/x/time/rate"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/profi-dev/profi/internal/config"
)

// Methods (profi_system_http_auth_success_total{method}).
const (
	MethodMTLS   = "mtls"
	MethodBearer = "bearer"
)

// Reason is why a request was rejected (profi_system_http_auth_failures_total{reason}).
type Reason string

// Rejection reasons; the last three are Additions to docs/INTERFACE.md 5.7.
const (
	NoAuth             Reason = "no_auth"
	TokenReviewDeny    Reason = "tokenreview_deny"
	TokenReviewError   Reason = "tokenreview_error"
	AudienceMismatch   Reason = "audience_mismatch"
	RateLimited        Reason = "rate_limited"
	Forbidden          Reason = "forbidden"           // SubjectAccessReview denied (--metrics-auth-authorize)
	AuthorizationError Reason = "authorization_error" // SubjectAccessReview call failed
	// CertNotAllowed: a verified client certificate whose SANs are not in
	// --metrics-tls-allowed-client-sans, and no valid bearer token.
	CertNotAllowed Reason = "cert_not_allowed"
)

// Reasons lists every Reason, for initialising counters and tests.
var Reasons = []Reason{NoAuth, TokenReviewDeny, TokenReviewError, AudienceMismatch, RateLimited, Forbidden, AuthorizationError, CertNotAllowed}

// Defaults of Options left zero.
const (
	DefaultNegativeTTL = 10 * time.Second
	DefaultRate        = rate.Limit(5) // TokenReview calls per second for unknown tokens, whole agent
	DefaultBurst       = 10
	// Unknown tokens from one client address (an IPv4 address or an IPv6
	// /64) have a budget of their own within the agent's: one client
	// flooding random tokens exhausts its own budget, not the others'.
	DefaultClientRate  = rate.Limit(1)
	DefaultClientBurst = 5
	// Re-reviews of tokens already known to be good have a budget apart
	// from unknown tokens, so a flood cannot keep a known scraper from
	// being re-checked.
	DefaultKnownRate  = rate.Limit(5)
	DefaultKnownBurst = 10
	// ClientLimiters is how many client addresses have a budget of their
	// own (LRU); an address evicted starts again with a full burst, within
	// the agent-wide budget.
	ClientLimiters = 4096
	// StaleGrace: while a known-good answer cannot be renewed (the API
	// server fails or the known budget is exhausted), it is served for up
	// to this long past its TTL. A definite "no" from the API server ends
	// it at once (docs/SECURITY.md "Cache semantics").
	StaleGrace = 5 * time.Minute
	// CallTimeout bounds one TokenReview or SubjectAccessReview call.
	CallTimeout = 10 * time.Second
)

// Metrics are the counters the Authenticator updates; nil fields are not updated.
type Metrics struct {
	Success  *prometheus.CounterVec // method
	Failures *prometheus.CounterVec // reason
	Cache    *prometheus.CounterVec // result: hit, miss
	Latency  prometheus.Observer    // seconds per TokenReview call
}

// TokenReviews creates TokenReviews: k8s.Client's, or client-go's typed
// client (tests).
type TokenReviews interface {
	Create(ctx context.Context, tr *authenticationv1.TokenReview, opts metav1.CreateOptions) (*authenticationv1.TokenReview, error)
}

// AccessReviews creates SubjectAccessReviews, as TokenReviews.
type AccessReviews interface {
	Create(ctx context.Context, sar *authorizationv1.SubjectAccessReview, opts metav1.CreateOptions) (*authorizationv1.SubjectAccessReview, error)
}

// Options configure an Authenticator.
type Options struct {
	Mode string // config.AuthModeOff, AuthModeBearer or AuthModeMTLSOrBearer
	// ClientCerts says that the TLS listener verifies client certificates
	// against the client CA (--metrics-tls-mode=mtls): a request with a
	// verified chain is authenticated by it.
	ClientCerts bool
	Reviews     TokenReviews // needed for bearer modes
	// Access, with Authorize, checks each bearer-authenticated request with
	// a SubjectAccessReview (non-resource URL = request path, verb get).
	Access    AccessReviews
	Authorize bool
	Audience  string        // empty: no audience requested or checked
	CacheTTL  time.Duration // successful reviews; 0 disables that cache
	CacheSize int           // LRU capacity of each cache (default 1024)
	// NegativeTTL is how long a failed review (denied, audience mismatch)
	// or an authorization decision of "no" is cached.
	NegativeTTL time.Duration
	Rate        rate.Limit // TokenReview calls per second for unknown tokens, whole agent
	Burst       int
	ClientRate  rate.Limit // the same per client address (within Rate)
	ClientBurst int
	KnownRate   rate.Limit // re-reviews of known-good tokens
	KnownBurst  int
	// AllowedSANs, when not empty, restricts client certificates: one of
	// the verified leaf's SANs (DNS name, URI, e-mail or IP address) must
	// be listed (--metrics-tls-allowed-client-sans).
	AllowedSANs []string
	Metrics     Metrics
	Logger      *slog.Logger
	Now         func() time.Time // the rate limiter's and caches' clock (tests)
}

// Authenticator guards HTTP handlers.
type Authenticator struct {
	opts    Options
	log     *slog.Logger
	pos     *lru.Cache[[32]byte, review]
	neg     *lru.Cache[[32]byte, review]
	authz   *lru.Cache[authzKey, decision]
	limiter *rate.Limiter                     // unknown tokens, whole agent
	known   *rate.Limiter                     // re-reviews of known-good tokens
	clients *lru.Cache[string, *rate.Limiter] // unknown tokens, per client address
	flight  singleflight.Group
	access  singleflight.Group
}

type review struct {
	user    authenticationv1.UserInfo
	reason  Reason // "" = authenticated
	expires time.Time
}

type authzKey struct {
	token [32]byte
	path  string
}

type decision struct {
	allowed bool
	expires time.Time
}

// New validates opts and builds an Authenticator.
func New(opts Options) (*Authenticator, error) {
	switch opts.Mode {
	case config.AuthModeOff:
	case config.AuthModeBearer, config.AuthModeMTLSOrBearer:
		if opts.Reviews == nil {
			return nil, fmt.Errorf("auth: --metrics-auth-mode=%s needs a Kubernetes client (in-cluster credentials or KUBECONFIG)", opts.Mode)
		}
	default:
		return nil, fmt.Errorf("auth: unknown mode %q", opts.Mode)
	}
	if opts.Mode == config.AuthModeMTLSOrBearer && !opts.ClientCerts {
		return nil, errors.New("auth: mtls-or-bearer needs client certificate verification (--metrics-tls-mode=mtls)")
	}
	if opts.Authorize && opts.Mode != config.AuthModeOff && opts.Access == nil {
		return nil, errors.New("auth: --metrics-auth-authorize needs a Kubernetes client")
	}
	if opts.CacheSize <= 0 {
		opts.CacheSize = 1024
	}
	if opts.NegativeTTL <= 0 {
		opts.NegativeTTL = DefaultNegativeTTL
	}
	if opts.Rate <= 0 {
		opts.Rate = DefaultRate
	}
	if opts.Burst <= 0 {
		opts.Burst = DefaultBurst
	}
	if opts.ClientRate <= 0 {
		opts.ClientRate = DefaultClientRate
	}
	if opts.ClientBurst <= 0 {
		opts.ClientBurst = DefaultClientBurst
	}
	if opts.KnownRate <= 0 {
		opts.KnownRate = DefaultKnownRate
	}
	if opts.KnownBurst <= 0 {
		opts.KnownBurst = DefaultKnownBurst
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	a := &Authenticator{opts: opts, log: opts.Logger.With("component", "auth"),
		limiter: rate.NewLimiter(opts.Rate, opts.Burst), known: rate.NewLimiter(opts.KnownRate, opts.KnownBurst)}
	var err error
	if a.clients, err = lru.New[string, *rate.Limiter](ClientLimiters); err != nil {
		return nil, fmt.Errorf("auth: %w", err)
	}
	if a.pos, err = lru.New[[32]byte, review](opts.CacheSize); err != nil {
		return nil, fmt.Errorf("auth: %w", err)
	}
	if a.neg, err = lru.New[[32]byte, review](opts.CacheSize); err != nil {
		return nil, fmt.Errorf("auth: %w", err)
	}
	if a.authz, err = lru.New[authzKey, decision](opts.CacheSize); err != nil {
		return nil, fmt.Errorf("auth: %w", err)
	}
	return a, nil
}

// Enabled reports whether Wrap guards anything (auth on, or client
// certificates to count).
func (a *Authenticator) Enabled() bool {
	return a.opts.Mode != config.AuthModeOff || a.opts.ClientCerts
}

// Wrap returns next guarded by the configured mode. Rejections: 401 with
// WWW-Authenticate: Bearer (no or bad credentials), 403 (authorization
// denied), 429 (too many TokenReviews: retry), 503 (the API server failed).
func (a *Authenticator) Wrap(next http.Handler) http.Handler {
	if !a.Enabled() {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		missing := NoAuth
		if a.opts.ClientCerts && r.TLS != nil && len(r.TLS.VerifiedChains) > 0 {
			if a.sanAllowed(r.TLS.VerifiedChains[0][0]) {
				a.success(MethodMTLS)
				next.ServeHTTP(w, r)
				return
			}
			// Not one of the allowed clients: as if it had presented
			// no certificate (a bearer token may still do).
			missing = CertNotAllowed
		}
		if a.opts.Mode == config.AuthModeOff {
			// mtls without auth: the handshake let a client without a
			// certificate in (for kubelet probes); only /health and
			// /ready serve it. No bearer challenge: none would help.
			a.count(missing)
			http.Error(w, "a client certificate signed by the client CA is required", http.StatusForbidden)
			return
		}
		token, ok := bearer(r.Header.Get("Authorization"))
		if !ok {
			a.reject(w, missing)
			return
		}
		// The review outlives a client that hangs up: its result is
		// cached and shared with concurrent requests for the same token.
		ctx := context.WithoutCancel(r.Context())
		key := sha256.Sum256([]byte(token))
		rv := a.review(ctx, token, key, clientKey(r.RemoteAddr))
		if rv.reason != "" {
			a.reject(w, rv.reason)
			return
		}
		if a.opts.Authorize {
			if reason := a.authorize(ctx, key, rv.user, r.URL.Path); reason != "" {
				a.reject(w, reason)
				return
			}
		}
		a.success(MethodBearer)
		next.ServeHTTP(w, r)
	})
}

// sanAllowed reports whether the verified leaf may read: any certificate
// of the client CA when no SANs are configured, else one with a listed SAN.
func (a *Authenticator) sanAllowed(leaf *x509.Certificate) bool {
	if len(a.opts.AllowedSANs) == 0 {
		return true
	}
	var sans []string
	sans = append(sans, leaf.DNSNames...)
	sans = append(sans, leaf.EmailAddresses...)
	for _, u := range leaf.URIs {
		sans = append(sans, u.String())
	}
	for _, ip := range leaf.IPAddresses {
		sans = append(sans, ip.String())
	}
	for _, s := range sans {
		if slices.Contains(a.opts.AllowedSANs, s) {
			return true
		}
	}
	return false
}

// clientKey is the budget key of a request's remote address: the IPv4
// address, or the /64 of an IPv6 one (a host picks addresses within its
// /64 at will). An unparsable address shares one budget.
func clientKey(remote string) string {
	ap, err := netip.ParseAddrPort(remote)
	if err != nil {
		return ""
	}
	addr := ap.Addr().Unmap()
	if addr.Is6() {
		p, _ := addr.Prefix(64)
		return p.String()
	}
	return addr.String()
}

// bearer extracts the token of an "Authorization: Bearer <token>" header.
func bearer(h string) (string, bool) {
	scheme, token, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

func (a *Authenticator) success(method string) {
	if a.opts.Metrics.Success != nil {
		a.opts.Metrics.Success.WithLabelValues(method).Inc()
	}
}

func (a *Authenticator) count(reason Reason) {
	if a.opts.Metrics.Failures != nil {
		a.opts.Metrics.Failures.WithLabelValues(string(reason)).Inc()
	}
}

func (a *Authenticator) reject(w http.ResponseWriter, reason Reason) {
	a.count(reason)
	switch reason {
	case Forbidden:
		http.Error(w, "forbidden", http.StatusForbidden)
	case RateLimited:
		w.Header().Set("Retry-After", "1")
		http.Error(w, "too many token reviews, retry", http.StatusTooManyRequests)
	case TokenReviewError, AuthorizationError:
		http.Error(w, "authentication unavailable", http.StatusServiceUnavailable)
	default:
		w.Header().Set("WWW-Authenticate", `Bearer realm="profi"`)
		http.Error(w, "unauthorized", http.StatusUnauthorized)
	}
}

func (a *Authenticator) cache(result string) {
	if a.opts.Metrics.Cache != nil {
		a.opts.Metrics.Cache.WithLabelValues(result).Inc()
	}
}

// Result of a Review.
type Result struct {
	User   authenticationv1.UserInfo
	Reason Reason // "" when the token is valid
}

// Review checks a bearer token presented from the client address remote
// (host:port): from the caches, or with one TokenReview shared by
// concurrent callers of the same token, when the budgets allow a call.
func (a *Authenticator) Review(ctx context.Context, token, remote string) Result {
	rv := a.review(ctx, token, sha256.Sum256([]byte(token)), clientKey(remote))
	return Result{User: rv.user, Reason: rv.reason}
}

// refreshAhead is how long before its expiry a known-good answer is
// renewed: the last quarter of its TTL, so a scraper that comes every
// quarter TTL or more often never finds it expired.
func refreshAhead(ttl time.Duration) time.Duration { return ttl / 4 }

// unavailable reports whether a review failed for want of an answer (the
// API server or a budget), not because the token is bad.
func unavailable(r Reason) bool {
	return r == RateLimited || r == TokenReviewError || r == AuthorizationError
}

func (a *Authenticator) review(ctx context.Context, token string, key [32]byte, client string) review {
	now := a.opts.Now()
	if rv, ok := a.neg.Get(key); ok {
		if now.Before(rv.expires) {
			a.cache("hit")
			return rv
		}
		a.neg.Remove(key)
	}
	if rv, ok := a.pos.Get(key); ok {
		switch {
		case now.Before(rv.expires.Add(-refreshAhead(a.opts.CacheTTL))):
			a.cache("hit")
			return rv
		case now.Before(rv.expires.Add(StaleGrace)):
			// Known good: renewed from the known budget; kept while
			// no answer can be had.
			a.cache("miss")
			fresh := a.shared(ctx, token, key, a.known.AllowN)
			if unavailable(fresh.reason) {
				a.log.Debug("serving the last TokenReview answer", "user", rv.user.Username, "reason", fresh.reason)
				return rv
			}
			return fresh
		}
		a.pos.Remove(key)
	}
	a.cache("miss")
	return a.shared(ctx, token, key, func(now time.Time, n int) bool {
		// The client's own budget first: a client that exhausted it
		// takes nothing from the agent-wide one.
		cl := a.clientLimiter(client)
		quiet := cl.TokensAt(now) >= float64(cl.Burst())
		if !cl.AllowN(now, n) {
			return false
		}
		// A client that used its budget lately takes the agent-wide one
		// only down to a reserve, which quiet clients draw on: five
		// flooding addresses at their own rate used all of it (issue 30).
		if !quiet && a.limiter.TokensAt(now) < float64(a.reserve()+n) {
			return false
		}
		return a.limiter.AllowN(now, n)
	})
}

// reserve is the part of the agent-wide burst that clients which used
// their own budget lately cannot take: half of it.
func (a *Authenticator) reserve() int { return a.opts.Burst / 2 }

func (a *Authenticator) clientLimiter(client string) *rate.Limiter {
	if l, ok := a.clients.Get(client); ok {
		return l
	}
	l := rate.NewLimiter(a.opts.ClientRate, a.opts.ClientBurst)
	if prev, ok, _ := a.clients.PeekOrAdd(client, l); ok {
		return prev
	}
	return l
}

// shared runs call once for concurrent requests of the same token.
func (a *Authenticator) shared(ctx context.Context, token string, key [32]byte, allow func(time.Time, int) bool) review {
	v, _, _ := a.flight.Do(string(key[:]), func() (any, error) {
		return a.call(ctx, token, key, allow), nil
	})
	return v.(review)
}

// call runs one TokenReview (allow permitting) and caches its verdict.
// Errors are not cached: the next request tries again, within the limit.
func (a *Authenticator) call(ctx context.Context, token string, key [32]byte, allow func(time.Time, int) bool) review {
	now := a.opts.Now()
	if !allow(now, 1) {
		return review{reason: RateLimited}
	}
	tr := &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}
	if a.opts.Audience != "" {
		tr.Spec.Audiences = []string{a.opts.Audience}
	}
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	began := time.Now()
	res, err := a.opts.Reviews.Create(ctx, tr, metav1.CreateOptions{})
	if a.opts.Metrics.Latency != nil {
		a.opts.Metrics.Latency.Observe(time.Since(began).Seconds())
	}
	if err != nil {
		a.log.Warn("TokenReview failed", "err", err)
		return review{reason: TokenReviewError}
	}
	st := res.Status
	switch {
	case !st.Authenticated:
		a.log.Debug("TokenReview denied", "err", st.Error)
		rv := review{reason: TokenReviewDeny, expires: now.Add(a.opts.NegativeTTL)}
		a.neg.Add(key, rv)
		a.pos.Remove(key) // a known token revoked: no stale answer either
		return rv
	case a.opts.Audience != "" && !slices.Contains(st.Audiences, a.opts.Audience):
		// An authenticator that ignores audiences: its "yes" is not for us.
		a.log.Debug("TokenReview without our audience", "user", st.User.Username, "audiences", st.Audiences)
		rv := review{reason: AudienceMismatch, expires: now.Add(a.opts.NegativeTTL)}
		a.neg.Add(key, rv)
		a.pos.Remove(key) // a known token revoked: no stale answer either
		return rv
	}
	rv := review{user: st.User, expires: now.Add(a.opts.CacheTTL)}
	if a.opts.CacheTTL > 0 {
		a.pos.Add(key, rv)
	}
	a.neg.Remove(key)
	return rv
}

// authorize asks whether user may get path, from the cache or with a
// SubjectAccessReview. It returns "" when allowed.
func (a *Authenticator) authorize(ctx context.Context, token [32]byte, user authenticationv1.UserInfo, path string) Reason {
	key := authzKey{token, path}
	now := a.opts.Now()
	d, cached := a.authz.Get(key)
	if cached {
		switch {
		case !d.allowed && now.Before(d.expires),
			d.allowed && now.Before(d.expires.Add(-refreshAhead(a.opts.CacheTTL))):
			return verdict(d.allowed)
		case d.allowed && now.Before(d.expires.Add(StaleGrace)):
			// Renew ahead of expiry; keep the "yes" while the API
			// server cannot answer.
			if r := a.accessReview(ctx, key, user, path); r != AuthorizationError {
				return r
			}
			a.log.Debug("serving the last SubjectAccessReview answer", "user", user.Username, "path", path)
			return ""
		}
		a.authz.Remove(key)
	}
	return a.accessReview(ctx, key, user, path)
}

// accessReview runs one SubjectAccessReview, shared by concurrent
// requests of the same token and path, and caches its decision.
func (a *Authenticator) accessReview(ctx context.Context, key authzKey, user authenticationv1.UserInfo, path string) Reason {
	v, _, _ := a.access.Do(string(key.token[:])+key.path, func() (any, error) {
		return a.callAccess(ctx, key, user, path), nil
	})
	return v.(Reason)
}

func (a *Authenticator) callAccess(ctx context.Context, key authzKey, user authenticationv1.UserInfo, path string) Reason {
	now := a.opts.Now()
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:                  user.Username,
		UID:                   user.UID,
		Groups:                user.Groups,
		NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: path, Verb: "get"},
	}}
	if len(user.Extra) > 0 {
		sar.Spec.Extra = map[string]authorizationv1.ExtraValue{}
		for k, v := range user.Extra {
			sar.Spec.Extra[k] = authorizationv1.ExtraValue(v)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	res, err := a.opts.Access.Create(ctx, sar, metav1.CreateOptions{})
	if err != nil {
		a.log.Warn("SubjectAccessReview failed", "user", user.Username, "path", path, "err", err)
		return AuthorizationError
	}
	d := decision{allowed: res.Status.Allowed, expires: now.Add(a.opts.NegativeTTL)}
	if d.allowed {
		d.expires = now.Add(a.opts.CacheTTL)
	} else {
		a.log.Debug("SubjectAccessReview denied", "user", user.Username, "path", path, "reason", res.Status.Reason)
	}
	if !d.allowed || a.opts.CacheTTL > 0 {
		a.authz.Add(key, d)
	} else {
		a.authz.Remove(key)
	}
	return verdict(d.allowed)
}

func verdict(allowed bool) Reason {
	if allowed {
		return ""
	}
	return Forbidden
}
