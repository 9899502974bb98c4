package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/profi-dev/profi/internal/status"
)

// StaleAfter is how old the main loop's heartbeat may be before /health fails.
const StaleAfter = 30 * time.Second

// Options configure the Server.
type Options struct {
	Listen string
	// Metrics is what /metrics serves; Gatherer's families when nil.
	Metrics   Metrics
	Gatherer  prometheus.Gatherer
	Status    func() status.Doc   // JSON body of /status
	Ready     func() bool         // readiness of everything but the server itself
	Heartbeat func() time.Time    // last beat of the main loop (see Heartbeat)
	Encode    func(time.Duration) // observes each /metrics render; may be nil
	Logger    *slog.Logger
	// TLS, when set, serves HTTPS only (docs/INTERFACE.md 2.5).
	TLS *TLSOptions
	// Protect, when set, wraps /metrics and /status (authentication);
	// /health and /ready are never wrapped: kubelet probes carry no
	// credentials.
	Protect func(http.Handler) http.Handler
	// Limits bound connections, handshakes, time and concurrent renders;
	// zero fields take the defaults.
	Limits       Limits
	LimitMetrics LimitMetrics
}

// Heartbeat is the main loop's beat for /health: the older of the last
// drain and the time the discovery pass after the last one was due. The
// loop is then healthy while drains are fresh and discovery passes arrive
// on schedule, whatever the discovery interval is.
func Heartbeat(drained, passed func() time.Time, interval time.Duration) func() time.Time {
	return func() time.Time {
		drain, passDue := drained(), passed().Add(interval)
		if passDue.Before(drain) {
			return passDue
		}
		return drain
	}
}

// MaxHeaderBytes bounds a request's header.
const MaxHeaderBytes = 16 << 10

// ReloadInterval is how often the TLS files are checked for a rotation
// when no handshake does it first (a bad file is then logged promptly).
const ReloadInterval = 10 * time.Second

// Server is the HTTP endpoint of the agent.
type Server struct {
	opts    Options
	log     *slog.Logger
	ln      net.Listener
	certs   *certs // nil without TLS
	conns   *slots // open connections
	serving atomic.Bool
}

// Listen binds the address, so a bad --listen fails at start-up and tests
// can learn the port before Run.
func Listen(opts Options) (*Server, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	opts.Limits = opts.Limits.withDefaults()
	s := &Server{opts: opts, log: opts.Logger.With("component", "server")}
	if opts.TLS != nil {
		var err error
		if s.certs, err = newCerts(*opts.TLS, s.log); err != nil {
			return nil, err
		}
	}
	ln, err := net.Listen("tcp", opts.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", opts.Listen, err)
	}
	// The connection bound sits under TLS, so connections in their
	// handshake hold a slot too.
	lm := opts.LimitMetrics
	s.conns = newSlots(opts.Limits.MaxConns)
	s.ln = &limitListener{Listener: ln, slots: s.conns, refuse: lm.refuse, open: lm.open}
	if s.certs != nil {
		count := func(string) {}
		if h := opts.TLS.Handshakes; h != nil {
			count = func(result string) { h.WithLabelValues(result).Inc() }
		}
		s.ln = newTLSListener(s.ln, s.certs.config(), count, lm.refuse, opts.Limits.MaxHandshakes, s.log)
	}
	return s, nil
}

// Addr is the bound address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Serving reports whether Run is serving requests.
func (s *Server) Serving() bool { return s.serving.Load() }

// Handler returns the routes.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	auth := s.opts.Protect
	if auth == nil {
		auth = func(h http.Handler) http.Handler { return h }
	}
	// /metrics and /status share one bound, behind authentication: only
	// authenticated requests can occupy a render slot.
	limit := bounded(s.opts.Limits.MaxRequests, s.opts.LimitMetrics.refuse)
	protect := func(h http.Handler) http.Handler { return auth(limit(h)) }
	metrics := s.opts.Metrics
	if metrics == nil {
		metrics = gathererMetrics{s.opts.Gatherer}
	}
	mux.Handle("GET /metrics", protect(s.metricsHandler(metrics)))
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		if s.opts.Heartbeat != nil && time.Since(s.opts.Heartbeat()) > StaleAfter {
			http.Error(w, "event loop stale", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /ready", func(w http.ResponseWriter, _ *http.Request) {
		if !s.Serving() || (s.opts.Ready != nil && !s.opts.Ready()) {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ready\n")
	})
	mux.Handle("GET /status", protect(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		if err := enc.Encode(s.opts.Status()); err != nil {
			s.log.Warn("encode /status", "err", err)
		}
	})))
	return mux
}

// Run serves until ctx ends, then shuts down gracefully.
func (s *Server) Run(ctx context.Context) error {
	lim := s.opts.Limits
	srv := &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: lim.ReadHeaderTimeout,
		ReadTimeout:       lim.ReadTimeout,
		WriteTimeout:      lim.WriteTimeout,
		IdleTimeout:       lim.IdleTimeout,
		ConnState:         connState,
		// Request headers are a few hundred bytes (a bearer token is
		// about a kilobyte); net/http's default allows 1 MiB per request.
		MaxHeaderBytes: MaxHeaderBytes,
		ErrorLog:       slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(s.ln) }()
	s.serving.Store(true)
	s.log.Info("serving", "addr", s.Addr(), "tls", s.certs != nil)
	var reload <-chan time.Time
	if s.certs != nil {
		t := time.NewTicker(ReloadInterval)
		defer t.Stop()
		reload = t.C
	}
	for done := false; !done; {
		select {
		case err := <-errc:
			s.serving.Store(false)
			return fmt.Errorf("serve %s: %w", s.Addr(), err)
		case <-reload:
			s.certs.check()
		case <-ctx.Done():
			done = true
		}
	}
	s.serving.Store(false)
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("shut down server: %w", err)
	}
	return nil
}
