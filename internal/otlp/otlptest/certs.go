package otlptest

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"

	"github.com/profi-dev/profi/internal/testutil/certtest"
)

// Certs is a throw-away CA with a server certificate for 127.0.0.1 and
// localhost and a client certificate, written as PEM files under Dir.
type Certs struct {
	Dir                                              string
	CA, ServerCert, ServerKey, ClientCert, ClientKey string
	ClientCN                                         string
	pool                                             *x509.CertPool
	server                                           tls.Certificate
}

// NewCerts generates the material in a test temporary directory, with
// the test CA of internal/testutil.
func NewCerts(t testing.TB) *Certs {
	t.Helper()
	c := &Certs{Dir: t.TempDir(), ClientCN: "profi-agent"}
	ca := certtest.NewCA(t, "profi test CA")
	c.pool = ca.Pool()
	c.CA = c.write(t, "ca.pem", ca.PEM)
	srv := ca.Server(t)
	c.ServerCert, c.ServerKey = c.write(t, "server.pem", srv.CertPEM), c.write(t, "server-key.pem", srv.KeyPEM)
	c.server = srv.TLSCertificate(t)
	cl := ca.Client(t, c.ClientCN)
	c.ClientCert, c.ClientKey = c.write(t, "client.pem", cl.CertPEM), c.write(t, "client-key.pem", cl.KeyPEM)
	return c
}

func (c *Certs) write(t testing.TB, name string, pem []byte) string {
	t.Helper()
	path := filepath.Join(c.Dir, name)
	if err := os.WriteFile(path, pem, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// ServerTLS is the receiver's TLS configuration; with requireClient it
// demands a client certificate signed by the CA (mTLS).
func (c *Certs) ServerTLS(requireClient bool) *tls.Config {
	tc := &tls.Config{Certificates: []tls.Certificate{c.server}, MinVersion: tls.VersionTLS12}
	if requireClient {
		tc.ClientAuth = tls.RequireAndVerifyClientCert
		tc.ClientCAs = c.pool
	}
	return tc
}
