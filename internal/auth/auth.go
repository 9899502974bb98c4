package auth

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
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
	authenticationclient "k8s.io/client-go/kubernetes/typed/authentication/v1"
	authorizationclient "k8s.io/client-go/kubernetes/typed/authorization/v1"

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
)

// Reasons lists every Reason, for initialising counters and tests.
var Reasons = []Reason{NoAuth, TokenReviewDeny, TokenReviewError, AudienceMismatch, RateLimited, Forbidden, AuthorizationError}

// Defaults of Options left zero.
const (
	DefaultNegativeTTL = 10 * time.Second
	DefaultRate        = rate.Limit(5) // TokenReview calls per second on cache misses
	DefaultBurst       = 10
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

// Options configure an Authenticator.
type Options struct {
	Mode string // config.AuthModeOff, AuthModeBearer or AuthModeMTLSOrBearer
	// ClientCerts says that the TLS listener verifies client certificates
	// against the client CA (--metrics-tls-mode=mtls): a request with a
	// verified chain is authenticated by it.
	ClientCerts bool
	Reviews     authenticationclient.TokenReviewInterface // needed for bearer modes
	// Access, with Authorize, checks each bearer-authenticated request with
	// a SubjectAccessReview (non-resource URL = request path, verb get).
	Access    authorizationclient.SubjectAccessReviewInterface
	Authorize bool
	Audience  string        // empty: no audience requested or checked
	CacheTTL  time.Duration // successful reviews; 0 disables that cache
	CacheSize int           // LRU capacity of each cache (default 1024)
	// NegativeTTL is how long a failed review (denied, audience mismatch)
	// or an authorization decision of "no" is cached.
	NegativeTTL time.Duration
	Rate        rate.Limit // TokenReview calls per second on cache misses
	Burst       int
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
	limiter *rate.Limiter
	flight  singleflight.Group
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
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	a := &Authenticator{opts: opts, log: opts.Logger.With("component", "auth"), limiter: rate.NewLimiter(opts.Rate, opts.Burst)}
	var err error
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
		if a.opts.ClientCerts && r.TLS != nil && len(r.TLS.VerifiedChains) > 0 {
			a.success(MethodMTLS)
			next.ServeHTTP(w, r)
			return
		}
		if a.opts.Mode == config.AuthModeOff {
			// mtls without auth: the handshake let a client without a
			// certificate in (for kubelet probes); only /health and
			// /ready serve it. No bearer challenge: none would help.
			a.count(NoAuth)
			http.Error(w, "a client certificate signed by the client CA is required", http.StatusForbidden)
			return
		}
		token, ok := bearer(r.Header.Get("Authorization"))
		if !ok {
			a.reject(w, NoAuth)
			return
		}
		// The review outlives a client that hangs up: its result is
		// cached and shared with concurrent requests for the same token.
		ctx := context.WithoutCancel(r.Context())
		key := sha256.Sum256([]byte(token))
		rv := a.review(ctx, token, key)
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

// Review checks a bearer token: from the caches, or with one TokenReview
// shared by concurrent callers of the same token, when the rate limit
// allows a call.
func (a *Authenticator) Review(ctx context.Context, token string) Result {
	rv := a.review(ctx, token, sha256.Sum256([]byte(token)))
	return Result{User: rv.user, Reason: rv.reason}
}

func (a *Authenticator) review(ctx context.Context, token string, key [32]byte) review {
	now := a.opts.Now()
	for _, c := range []*lru.Cache[[32]byte, review]{a.pos, a.neg} {
		if rv, ok := c.Get(key); ok {
			if now.Before(rv.expires) {
				a.cache("hit")
				return rv
			}
			c.Remove(key)
		}
	}
	a.cache("miss")
	v, _, _ := a.flight.Do(string(key[:]), func() (any, error) {
		return a.call(ctx, token, key), nil
	})
	return v.(review)
}

// call runs one TokenReview (rate limit permitting) and caches its verdict.
// Errors are not cached: the next request tries again, within the limit.
func (a *Authenticator) call(ctx context.Context, token string, key [32]byte) review {
	now := a.opts.Now()
	if !a.limiter.AllowN(now, 1) {
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
		return rv
	case a.opts.Audience != "" && !slices.Contains(st.Audiences, a.opts.Audience):
		// An authenticator that ignores audiences: its "yes" is not for us.
		a.log.Debug("TokenReview without our audience", "user", st.User.Username, "audiences", st.Audiences)
		rv := review{reason: AudienceMismatch, expires: now.Add(a.opts.NegativeTTL)}
		a.neg.Add(key, rv)
		return rv
	}
	rv := review{user: st.User, expires: now.Add(a.opts.CacheTTL)}
	if a.opts.CacheTTL > 0 {
		a.pos.Add(key, rv)
	}
	return rv
}

// authorize asks whether user may get path, from the cache or with a
// SubjectAccessReview. It returns "" when allowed.
func (a *Authenticator) authorize(ctx context.Context, token [32]byte, user authenticationv1.UserInfo, path string) Reason {
	key := authzKey{token, path}
	now := a.opts.Now()
	if d, ok := a.authz.Get(key); ok {
		if now.Before(d.expires) {
			return verdict(d.allowed)
		}
		a.authz.Remove(key)
	}
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
	}
	return verdict(d.allowed)
}

func verdict(allowed bool) Reason {
	if allowed {
		return ""
	}
	return Forbidden
}
