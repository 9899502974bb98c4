// Package client is the HTTP(S) client `profi explain` and `profi top` use
// to read a running agent's /status and /metrics, with the same TLS, mTLS
// and bearer-token options a scraper has.
package client

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Flags are the command-line options of the client, embedded in the kong
// grammar of each subcommand.
type Flags struct {
	Agent              string        `name:"agent" env:"PROFI_AGENT" default:"http://127.0.0.1:9401" placeholder:"URL" help:"Base URL of the running agent (https:// for TLS)."`
	CACert             string        `name:"ca-cert" placeholder:"PATH" help:"CA bundle (PEM) that signed the agent's certificate; default: the system roots."`
	Cert               string        `name:"cert" placeholder:"PATH" help:"Client certificate (PEM) for mtls."`
	Key                string        `name:"key" placeholder:"PATH" help:"Client private key (PEM) for mtls."`
	Token              string        `name:"token" env:"PROFI_TOKEN" placeholder:"TOKEN" help:"Bearer token (--metrics-auth-mode bearer or mtls-or-bearer)."`
	TokenFile          string        `name:"token-file" placeholder:"PATH" help:"File holding the bearer token, read at every request (e.g. a projected service account token)."`
	InsecureSkipVerify bool          `name:"insecure-skip-verify" help:"Do not verify the agent's certificate (testing only)."`
	Timeout            time.Duration `name:"timeout" default:"10s" help:"Timeout of one request."`
}

// Client reads one agent.
type Client struct {
	base      *url.URL
	http      *http.Client
	token     string
	tokenFile string
}

// New checks the flags and builds the client; every problem with them is
// reported at once.
func New(f Flags) (*Client, error) {
	var errs []error
	base, err := url.Parse(strings.TrimRight(f.Agent, "/"))
	switch {
	case err != nil:
		errs = append(errs, fmt.Errorf("--agent %q: %w", f.Agent, err))
	case base.Scheme != "http" && base.Scheme != "https":
		errs = append(errs, fmt.Errorf("--agent %q: want an http:// or https:// URL", f.Agent))
	case base.Host == "":
		errs = append(errs, fmt.Errorf("--agent %q: no host", f.Agent))
	}
	if (f.Cert == "") != (f.Key == "") {
		errs = append(errs, errors.New("--cert and --key go together"))
	}
	if f.Token != "" && f.TokenFile != "" {
		errs = append(errs, errors.New("--token and --token-file exclude each other"))
	}
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: f.InsecureSkipVerify} //nolint:gosec // the user asked for it, for testing
	if f.CACert != "" {
		pem, err := os.ReadFile(f.CACert)
		if err != nil {
			errs = append(errs, fmt.Errorf("--ca-cert: %w", err))
		} else {
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				errs = append(errs, fmt.Errorf("--ca-cert %s: no PEM certificate in it", f.CACert))
			}
			tlsCfg.RootCAs = pool
		}
	}
	if f.Cert != "" && f.Key != "" {
		pair, err := tls.LoadX509KeyPair(f.Cert, f.Key)
		if err != nil {
			errs = append(errs, fmt.Errorf("--cert/--key: %w", err))
		}
		tlsCfg.Certificates = []tls.Certificate{pair}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = tlsCfg
	tr.Proxy = nil // the agent is on the node; a proxy env var must not reroute it
	return &Client{base: base, http: &http.Client{Transport: tr, Timeout: f.Timeout}, token: f.Token, tokenFile: f.TokenFile}, nil
}

// URL is the agent's base URL.
func (c *Client) URL() string { return c.base.String() }

// Get fetches path and returns the body of a 200 answer; any other status
// is an error that says what to do about it.
func (c *Client) Get(ctx context.Context, path, accept string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base.String()+path, nil)
	if err != nil {
		return nil, fmt.Errorf("request %s: %w", path, err)
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	tok := c.token
	if c.tokenFile != "" {
		b, err := os.ReadFile(c.tokenFile)
		if err != nil {
			return nil, fmt.Errorf("--token-file: %w", err)
		}
		tok = strings.TrimSpace(string(b))
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET %s%s: %w", c.base, path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
	if err != nil {
		return nil, fmt.Errorf("GET %s%s: read body: %w", c.base, path, err)
	}
	switch resp.StatusCode {
	case http.StatusOK:
		return body, nil
	case http.StatusUnauthorized:
		return nil, fmt.Errorf("GET %s%s: 401 unauthorized: the agent wants a bearer token (--token or --token-file) or a client certificate (--cert, --key)", c.base, path)
	case http.StatusForbidden:
		return nil, fmt.Errorf("GET %s%s: 403 forbidden: the token is valid but not allowed to read %s (RBAC: nonResourceURLs %s, verb get)", c.base, path, path, path)
	default:
		return nil, fmt.Errorf("GET %s%s: %s: %s", c.base, path, resp.Status, strings.TrimSpace(string(body)))
	}
}

// Status decodes /status into v.
func (c *Client) Status(ctx context.Context, v any) error {
	b, err := c.Get(ctx, "/status", "application/json")
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("decode /status of %s: %w", c.base, err)
	}
	return nil
}

// Metrics fetches and parses /metrics (Prometheus text format).
func (c *Client) Metrics(ctx context.Context) (map[string]*dto.MetricFamily, error) {
	b, err := c.Get(ctx, "/metrics", "text/plain;version=0.0.4")
	if err != nil {
		return nil, err
	}
	return ParseMetrics(b)
}

// ParseMetrics parses a Prometheus text exposition.
func ParseMetrics(b []byte) (map[string]*dto.MetricFamily, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(b)))
	if err != nil {
		return nil, fmt.Errorf("parse /metrics: %w", err)
	}
	return fams, nil
}
