package otlptest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
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

// NewCerts generates the material in a test temporary directory.
func NewCerts(t testing.TB) *Certs {
	t.Helper()
	c := &Certs{Dir: t.TempDir(), ClientCN: "profi-agent"}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "profi test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	c.pool = x509.NewCertPool()
	c.pool.AddCert(caCert)
	c.CA = c.write(t, "ca.pem", "CERTIFICATE", caDER)

	leaf := func(serial int64, cn string, usage x509.ExtKeyUsage, certFile, keyFile string) (string, string, tls.Certificate) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: cn},
			NotBefore:    time.Now().Add(-time.Hour),
			NotAfter:     time.Now().Add(24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		}
		if usage == x509.ExtKeyUsageServerAuth {
			tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
			tmpl.DNSNames = []string{"localhost"}
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		cf := c.write(t, certFile, "CERTIFICATE", der)
		kf := c.write(t, keyFile, "PRIVATE KEY", keyDER)
		pair, err := tls.LoadX509KeyPair(cf, kf)
		if err != nil {
			t.Fatal(err)
		}
		return cf, kf, pair
	}
	c.ServerCert, c.ServerKey, c.server = leaf(2, "127.0.0.1", x509.ExtKeyUsageServerAuth, "server.pem", "server-key.pem")
	c.ClientCert, c.ClientKey, _ = leaf(3, c.ClientCN, x509.ExtKeyUsageClientAuth, "client.pem", "client-key.pem")
	return c
}

func (c *Certs) write(t testing.TB, name, typ string, der []byte) string {
	t.Helper()
	path := filepath.Join(c.Dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
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
