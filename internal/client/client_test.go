package client

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/profi-dev/profi/internal/testutil/certtest"
)

type pki struct {
	caPEM, serverCert, serverKey, clientCert, clientKey []byte
	caFile, clientCertFile, clientKeyFile               string
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	ca := certtest.NewCA(t, "test CA")
	srv := ca.Issue(t, certtest.CertOptions{CommonName: "agent", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
	cl := ca.Client(t, "prometheus")
	p := &pki{caPEM: ca.PEM, serverCert: srv.CertPEM, serverKey: srv.KeyPEM, clientCert: cl.CertPEM, clientKey: cl.KeyPEM}
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	p.caFile, p.clientCertFile, p.clientKeyFile = write("ca.pem", p.caPEM), write("client.pem", p.clientCert), write("client-key.pem", p.clientKey)
	return p
}

// agent is an httptest TLS server that asks for mtls and a bearer token
// as the agent's mtls + bearer modes do.
func agent(t *testing.T, p *pki, requireCert bool, token string) *httptest.Server {
	t.Helper()
	pair, err := tls.X509KeyPair(p.serverCert, p.serverKey)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(p.caPEM)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if token != "" && r.Header.Get("Authorization") != "Bearer "+token {
			w.Header().Set("WWW-Authenticate", "Bearer")
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		switch r.URL.Path {
		case "/status":
			_, _ = w.Write([]byte(`{"kernel_mode":"anonymous","tracked_pids":[7]}`))
		case "/metrics":
			_, _ = w.Write([]byte("# TYPE profi_tracked_pids gauge\nprofi_tracked_pids 1\n"))
		default:
			http.NotFound(w, r)
		}
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}, ClientCAs: pool, MinVersion: tls.VersionTLS12}
	if requireCert {
		srv.TLS.ClientAuth = tls.RequireAndVerifyClientCert
	}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

func TestClientTLS(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	mtls := agent(t, p, true, "s3cret")
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		flags   Flags
		wantErr string // "" = success
	}{
		{"mtls and token", Flags{Agent: mtls.URL, CACert: p.caFile, Cert: p.clientCertFile, Key: p.clientKeyFile, Token: "s3cret"}, ""},
		{"token file", Flags{Agent: mtls.URL, CACert: p.caFile, Cert: p.clientCertFile, Key: p.clientKeyFile, TokenFile: tokenFile}, ""},
		{"wrong token", Flags{Agent: mtls.URL, CACert: p.caFile, Cert: p.clientCertFile, Key: p.clientKeyFile, Token: "nope"}, "401 unauthorized"},
		{"no client cert", Flags{Agent: mtls.URL, CACert: p.caFile, Token: "s3cret"}, "certificate"},
		{"unknown CA", Flags{Agent: mtls.URL, Cert: p.clientCertFile, Key: p.clientKeyFile, Token: "s3cret"}, "certificate signed by unknown authority"},
		{"skip verify", Flags{Agent: mtls.URL, Cert: p.clientCertFile, Key: p.clientKeyFile, Token: "s3cret", InsecureSkipVerify: true}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.flags.Timeout = 10 * time.Second
			c, err := New(tc.flags)
			if err != nil {
				t.Fatal(err)
			}
			var st struct {
				KernelMode  string `json:"kernel_mode"`
				TrackedPIDs []int  `json:"tracked_pids"`
			}
			err = c.Status(context.Background(), &st)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Status error = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if st.KernelMode != "anonymous" || len(st.TrackedPIDs) != 1 || st.TrackedPIDs[0] != 7 {
				t.Errorf("status = %+v", st)
			}
			fams, err := c.Metrics(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if got := fams["profi_tracked_pids"].GetMetric()[0].GetGauge().GetValue(); got != 1 {
				t.Errorf("profi_tracked_pids = %v, want 1", got)
			}
		})
	}
}

func TestNewFlagErrors(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "missing.pem")
	_, err := New(Flags{Agent: "ftp://x", Cert: "a", Token: "t", TokenFile: "f", CACert: missing})
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"want an http:// or https:// URL", "--cert and --key go together", "--token and --token-file exclude each other", "--ca-cert: open " + missing} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}
