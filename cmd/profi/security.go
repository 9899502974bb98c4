package main

import (
	"fmt"
	"log/slog"
	"net/http"
	"os"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/profi-dev/profi/internal/auth"
	"github.com/profi-dev/profi/internal/collector"
	"github.com/profi-dev/profi/internal/config"
	"github.com/profi-dev/profi/internal/k8s"
	"github.com/profi-dev/profi/internal/server"
)

// kubeConfig is the agent's Kubernetes client configuration: the
// kubeconfig file named by KUBECONFIG (outside a cluster, tests), else
// in-cluster credentials.
func kubeConfig() (*rest.Config, error) {
	if path := os.Getenv("KUBECONFIG"); path != "" {
		return clientcmd.BuildConfigFromFlags("", path)
	}
	return rest.InClusterConfig()
}

// metricsSecurity builds the /metrics listener's TLS options and the
// authentication of /metrics and /status (docs/INTERFACE.md 2.5). Bearer modes
// need a Kubernetes client: without credentials the agent does not start.
func metricsSecurity(cfg *config.Config, m *collector.HTTP, log *slog.Logger) (*server.TLSOptions, func(http.Handler) http.Handler, error) {
	var tlsOpts *server.TLSOptions
	if cfg.MetricsTLS.Mode != config.TLSModeOff {
		tlsOpts = &server.TLSOptions{
			CertFile: cfg.MetricsTLS.CertFile, KeyFile: cfg.MetricsTLS.KeyFile,
			Handshakes: m.TLSHandshakes, ReloadFailures: m.TLSReloadFailures,
		}
		if cfg.MetricsTLS.Mode == config.TLSModeMTLS {
			tlsOpts.ClientCAFile = cfg.MetricsTLS.ClientCAFile
		}
	}
	opts := auth.Options{
		Mode:        cfg.MetricsAuth.Mode,
		ClientCerts: cfg.MetricsTLS.Mode == config.TLSModeMTLS,
		Audience:    cfg.MetricsAuth.Audience,
		CacheTTL:    cfg.MetricsAuth.CacheTTL,
		CacheSize:   cfg.MetricsAuth.CacheSize,
		Authorize:   cfg.MetricsAuth.Authorize,
		AllowedSANs: cfg.MetricsTLS.AllowedClientSANs,
		Metrics: auth.Metrics{Success: m.AuthSuccess, Failures: m.AuthFailures,
			Cache: m.TokenReviewCache, Latency: m.TokenReviewLatency},
		Logger: log,
	}
	if cfg.MetricsAuth.Mode != config.AuthModeOff {
		rc, err := kubeConfig()
		if err != nil {
			return nil, nil, fmt.Errorf("--metrics-auth-mode=%s needs a Kubernetes client (in-cluster credentials or KUBECONFIG): %w", cfg.MetricsAuth.Mode, err)
		}
		client, err := k8s.NewClient(rc)
		if err != nil {
			return nil, nil, err
		}
		opts.Reviews = client.TokenReviews()
		opts.Access = client.SubjectAccessReviews()
	}
	a, err := auth.New(opts)
	if err != nil {
		return nil, nil, err
	}
	return tlsOpts, a.Wrap, nil
}
