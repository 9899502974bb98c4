// Package auth authenticates requests to /metrics and /status
// (docs/INTERFACE.md 2.5): a verified client certificate, or a bearer token
// checked with the Kubernetes TokenReview API (optional audience), and
// optionally authorised with a SubjectAccessReview for the non-resource
// URL and verb get, as kube-rbac-proxy does.
//
// Reviews are cached by the SHA-256 of the token: successes for the
// configured TTL (a revoked token stays accepted until its entry expires),
// failures briefly in a separate cache (random tokens cannot evict valid
// entries), and calls on a cache miss are rate-limited (per client address
// and for the whole agent) and deduplicated, so a flood of bad tokens costs
// the API server a bounded number of calls and the flooding client's budget,
// not anyone else's. Known-good tokens are renewed ahead of expiry from a
// budget of their own, and their last answer is served for StaleGrace while
// no new one can be had (docs/SECURITY.md "Cache semantics").
//
// It must not: serve HTTP routes, or know about TLS beyond reading the
// verified chains of a request.
package auth
