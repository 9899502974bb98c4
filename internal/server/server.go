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
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// StaleAfter is how old the main loop's heartbeat may be before /health fails.
const StaleAfter = 30 * time.Second

// Options configure the Server.
type Options struct {
	Listen    string
	Gatherer  prometheus.Gatherer
	Status    func() any          // JSON body of /status
	Ready     func() bool         // readiness of everything but the server itself
	Heartbeat func() time.Time    // last beat of the main loop
	Encode    func(time.Duration) // observes each /metrics render; may be nil
	Logger    *slog.Logger
}

// Server is the HTTP endpoint of the agent.
type Server struct {
	opts    Options
	log     *slog.Logger
	ln      net.Listener
	serving atomic.Bool
}

// Listen binds the address, so a bad --listen fails at start-up and tests
// can learn the port before Run.
func Listen(opts Options) (*Server, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	ln, err := net.Listen("tcp", opts.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", opts.Listen, err)
	}
	return &Server{opts: opts, log: opts.Logger.With("component", "server"), ln: ln}, nil
}

// Addr is the bound address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Serving reports whether Run is serving requests.
func (s *Server) Serving() bool { return s.serving.Load() }

// Handler returns the routes.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	metrics := promhttp.HandlerFor(s.opts.Gatherer, promhttp.HandlerOpts{
		ErrorHandling:     promhttp.ContinueOnError,
		EnableOpenMetrics: true,
	})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		began := time.Now()
		metrics.ServeHTTP(w, r)
		if s.opts.Encode != nil {
			s.opts.Encode(time.Since(began))
		}
	})
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
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		if err := enc.Encode(s.opts.Status()); err != nil {
			s.log.Warn("encode /status", "err", err)
		}
	})
	return mux
}

// Run serves until ctx ends, then shuts down gracefully.
func (s *Server) Run(ctx context.Context) error {
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(s.ln) }()
	s.serving.Store(true)
	s.log.Info("serving", "addr", s.Addr())
	select {
	case err := <-errc:
		s.serving.Store(false)
		return fmt.Errorf("serve %s: %w", s.Addr(), err)
	case <-ctx.Done():
	}
	s.serving.Store(false)
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("shut down server: %w", err)
	}
	return nil
}
