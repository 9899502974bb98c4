// Package server serves /metrics, /health, /ready and /status over HTTP
// or HTTPS. It renders what it is given (a Gatherer and a status function)
// and owns nothing else: no data is computed here.
//
// With TLS it owns the listener's certificate, key and client CA, reloaded
// when their files change (a Secret volume's symlink swap), and counts every
// handshake by outcome: it completes handshakes itself before net/http sees
// a connection, so failures are classified from their real errors.
// Every connection is bounded in time (header, request, response, idle)
// and in number (Limits): at the bound a new connection or handshake closes
// the longest-idle one, so clients sitting on connections cannot lock a
// scraper out; concurrent /metrics and /status renders are bounded too.
// Each refusal is counted (profi_system_http_refused_total).
// Authentication of /metrics and /status is a wrapper it is given
// (internal/auth); /health and /ready are never wrapped.
package server
