package otlp

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"

	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/profi-dev/profi/internal/config"
)

// Exporter sends one batch; the SDK exporters implement it.
type Exporter interface {
	Export(ctx context.Context, rm *metricdata.ResourceMetrics) error
	Shutdown(ctx context.Context) error
}

// NewExporter builds the SDK exporter of cfg. Every setting is passed
// explicitly: the SDK also reads the OTEL_* variables itself, and without
// an explicit value for each it would apply them below our precedence
// rules (a flag beats its env var). TLS material is read now, so a
// missing or bad file is a startup error.
func NewExporter(ctx context.Context, cfg config.OTLPConfig) (Exporter, error) {
	if !cfg.Enabled() {
		return nil, errors.New("otlp: no endpoint")
	}
	var tc *tls.Config
	if cfg.UseTLS() {
		var err error
		if tc, err = clientTLS(cfg); err != nil {
			return nil, err
		}
	}
	headers := cfg.Headers
	if headers == nil {
		headers = map[string]string{} // replaces OTEL_EXPORTER_OTLP_HEADERS read by the SDK
	}
	switch cfg.Protocol {
	case config.ProtocolGRPC:
		creds := insecure.NewCredentials()
		if tc != nil {
			creds = credentials.NewTLS(tc)
		}
		exp, err := otlpmetricgrpc.New(ctx,
			otlpmetricgrpc.WithEndpoint(grpcTarget(cfg.Endpoint)),
			// Credentials, not WithInsecure: credentials the SDK built from
			// OTEL_EXPORTER_OTLP_CERTIFICATE would win over WithInsecure.
			otlpmetricgrpc.WithTLSCredentials(creds),
			otlpmetricgrpc.WithHeaders(headers),
			otlpmetricgrpc.WithTimeout(cfg.Timeout),
		)
		if err != nil {
			return nil, fmt.Errorf("otlp grpc exporter: %w", err)
		}
		return exp, nil
	case config.ProtocolHTTPProtobuf:
		u, err := url.Parse(cfg.Endpoint)
		if err != nil {
			return nil, fmt.Errorf("otlp endpoint %q: %w", cfg.Endpoint, err)
		}
		path := u.Path
		if path == "" {
			path = "/"
		}
		opts := []otlpmetrichttp.Option{
			otlpmetrichttp.WithEndpoint(u.Host),
			otlpmetrichttp.WithURLPath(path),
			// nil clears TLS settings the SDK read from the environment.
			otlpmetrichttp.WithTLSClientConfig(tc),
			otlpmetrichttp.WithHeaders(headers),
			otlpmetrichttp.WithTimeout(cfg.Timeout),
		}
		if tc == nil {
			opts = append(opts, otlpmetrichttp.WithInsecure())
		}
		exp, err := otlpmetrichttp.New(ctx, opts...)
		if err != nil {
			return nil, fmt.Errorf("otlp http exporter: %w", err)
		}
		return exp, nil
	default:
		return nil, fmt.Errorf("otlp: unknown protocol %q", cfg.Protocol)
	}
}

// grpcTarget is the host:port of a gRPC endpoint given as a URL or as
// host:port (gRPC has no path).
func grpcTarget(endpoint string) string {
	if !strings.Contains(endpoint, "://") {
		return endpoint
	}
	if u, err := url.Parse(endpoint); err == nil {
		return u.Host
	}
	return endpoint
}

// clientTLS is the TLS client configuration of both transports: the CA
// bundle that verifies the collector (system roots without one) and the
// client certificate for mTLS.
func clientTLS(cfg config.OTLPConfig) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if cfg.CACert != "" {
		pem, err := os.ReadFile(cfg.CACert)
		if err != nil {
			return nil, fmt.Errorf("otlp CA certificate: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("otlp CA certificate %s: no PEM certificate in it", cfg.CACert)
		}
		tc.RootCAs = pool
	}
	if cfg.ClientCert != "" {
		pair, err := tls.LoadX509KeyPair(cfg.ClientCert, cfg.ClientKey)
		if err != nil {
			return nil, fmt.Errorf("otlp client certificate %s / key %s: %w", cfg.ClientCert, cfg.ClientKey, err)
		}
		tc.Certificates = []tls.Certificate{pair}
	}
	return tc, nil
}
