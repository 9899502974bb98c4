// Package server serves /metrics, /health, /ready and /status over HTTP
// or HTTPS. It renders what it is given (a Gatherer and a status function)
// and owns nothing else: no data is computed here.
//
// With TLS it owns the listener's certificate, key and client CA, reloaded
// when their files change (a Secret volume's symlink swap), and counts every
// handshake by outcome: it completes handshakes itself before net/http sees
// a connection, so failures are classified from their real errors.
// Authentication of /metrics and /status is a wrapper it is given
// (internal/auth); /health and /ready are never wrapped.
package server
