package certtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// CA is a throw-away certificate authority for TLS tests.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	PEM  []byte // the CA certificate, PEM
}

// CertOptions describe a certificate to issue.
type CertOptions struct {
	CommonName   string
	Organization []string // becomes the Kubernetes groups of an x509 user
	Client       bool     // ExtKeyUsageClientAuth instead of ServerAuth
	DNSNames     []string
	IPs          []net.IP
	NotBefore    time.Time // zero: an hour ago
	NotAfter     time.Time // zero: in a day
}

// KeyPair is an issued certificate with its key.
type KeyPair struct {
	Cert    *x509.Certificate
	CertPEM []byte
	KeyPEM  []byte // PKCS#8
}

// serials makes every certificate of a test binary distinct, so a test can
// tell which one a server presented.
var serials atomic.Int64

// NewCA creates a self-signed ECDSA P-256 CA.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(serials.Add(1)),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &CA{Cert: cert, Key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// Issue signs a new leaf certificate.
func (ca *CA) Issue(t testing.TB, o CertOptions) *KeyPair {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if o.NotBefore.IsZero() {
		o.NotBefore = time.Now().Add(-time.Hour)
	}
	if o.NotAfter.IsZero() {
		o.NotAfter = time.Now().Add(24 * time.Hour)
	}
	usage := x509.ExtKeyUsageServerAuth
	if o.Client {
		usage = x509.ExtKeyUsageClientAuth
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serials.Add(1)),
		Subject:      pkix.Name{CommonName: o.CommonName, Organization: o.Organization},
		NotBefore:    o.NotBefore,
		NotAfter:     o.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		DNSNames:     o.DNSNames,
		IPAddresses:  o.IPs,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return &KeyPair{
		Cert:    cert,
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}),
	}
}

// Server issues a serving certificate for localhost and 127.0.0.1.
func (ca *CA) Server(t testing.TB) *KeyPair {
	t.Helper()
	return ca.Issue(t, CertOptions{CommonName: "profi", DNSNames: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
}

// Client issues a client certificate for cn.
func (ca *CA) Client(t testing.TB, cn string) *KeyPair {
	t.Helper()
	return ca.Issue(t, CertOptions{CommonName: cn, Client: true})
}

// TLSCertificate returns the pair for a tls.Config.
func (kp *KeyPair) TLSCertificate(t testing.TB) tls.Certificate {
	t.Helper()
	c, err := tls.X509KeyPair(kp.CertPEM, kp.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Pool returns a pool holding the CA certificate.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// SecretVolume mimics a Kubernetes Secret volume as the kubelet writes it
// (its AtomicWriter): the files live in a timestamped directory, "..data"
// links to it and each name links to "..data/name". An update writes a new
// directory and renames a new "..data" link over the old one, so readers
// see either all old or all new files; the old directory is then removed.
type SecretVolume struct {
	Dir string
	gen int
}

// NewSecretVolume writes files (name → content) as a Secret volume in a new
// temporary directory.
func NewSecretVolume(t testing.TB, files map[string][]byte) *SecretVolume {
	t.Helper()
	v := &SecretVolume{Dir: t.TempDir()}
	v.Update(t, files)
	for name := range files {
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(v.Dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return v
}

// Path returns the path of a file in the volume (the user-visible link).
func (v *SecretVolume) Path(name string) string { return filepath.Join(v.Dir, name) }

// Update swaps in new contents for the same file names atomically.
func (v *SecretVolume) Update(t testing.TB, files map[string][]byte) {
	t.Helper()
	v.gen++
	old, _ := os.Readlink(filepath.Join(v.Dir, "..data"))
	ts := fmt.Sprintf("..%s.%d", time.Now().UTC().Format("2006_01_02_15_04_05"), v.gen)
	if err := os.Mkdir(filepath.Join(v.Dir, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(v.Dir, ts, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tmp := filepath.Join(v.Dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(v.Dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if old != "" {
		if err := os.RemoveAll(filepath.Join(v.Dir, old)); err != nil {
			t.Fatal(err)
		}
	}
}
