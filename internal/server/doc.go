// Package server serves /metrics, /health, /ready and /status over HTTP.
// It renders what it is given (a Gatherer and a status function) and owns
// nothing else: no data is computed here.
package server
