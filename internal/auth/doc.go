// Package auth authenticates requests to /metrics and /status
// (docs/INTERFACE.md 2.5): a verified client certificate, or a bearer token
// checked with the Kubernetes TokenReview API (optional audience), and
// optionally authorised with a SubjectAccessReview for the non-resource
// URL and verb get, as kube-rbac-proxy does.
//
// Reviews are cached by the SHA-256 of the token: successes for the
// configured TTL (a revoked token stays accepted until its entry expires),
// failures briefly in a separate cache (random tokens cannot evict valid
// entries), and calls on a cache miss are rate-limited and deduplicated, so
// a flood of bad tokens costs the API server a bounded number of calls.
//
// It must not: serve HTTP routes, or know about TLS beyond reading the
// verified chains of a request.
package auth
