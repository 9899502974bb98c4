package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// HandshakeTimeout bounds one TLS handshake; a client that stalls it is dropped.
const HandshakeTimeout = 10 * time.Second

// Handshake results (profi_system_http_tls_handshakes_total{result}).
const (
	HandshakeOK      = "ok"
	HandshakeBadCert = "bad_cert"
	HandshakeError   = "error"
)

// TLSOptions configure TLS on the listener (docs/INTERFACE.md 2.5).
type TLSOptions struct {
	CertFile string
	KeyFile  string
	// ClientCAFile, when set, verifies client certificates against it
	// (mtls). A certificate is asked for, verified when given, and a bad
	// one fails the handshake; a missing one does not: /health and /ready
	// must answer kubelet probes, which present none, so the requirement
	// is enforced per request by the auth layer on /metrics and /status.
	ClientCAFile   string
	Handshakes     *prometheus.CounterVec // result; may be nil
	ReloadFailures prometheus.Counter     // may be nil
}

// certs holds the TLS material and reloads it when its files change:
// cert-manager rotates a Secret volume by swapping its "..data" link, so
// the files are re-stated (links followed) before each handshake and
// every few seconds. A new connection gets the new material; established
// ones keep theirs. Files that fail to load keep the old material in use.
type certs struct {
	opts TLSOptions
	log  *slog.Logger

	cert atomic.Pointer[tls.Certificate]
	pool atomic.Pointer[x509.CertPool]

	mu     sync.Mutex
	loaded []os.FileInfo // stat of each file when last loaded
	failed []os.FileInfo // stat of each file at the last failed load
}

func newCerts(opts TLSOptions, log *slog.Logger) (*certs, error) {
	c := &certs{opts: opts, log: log}
	st, err := c.stat()
	if err != nil {
		return nil, err
	}
	if err := c.load(st); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *certs) files() []string {
	f := []string{c.opts.CertFile, c.opts.KeyFile}
	if c.opts.ClientCAFile != "" {
		f = append(f, c.opts.ClientCAFile)
	}
	return f
}

func (c *certs) stat() ([]os.FileInfo, error) {
	var out []os.FileInfo
	for _, f := range c.files() {
		fi, err := os.Stat(f) // follows the Secret volume's links
		if err != nil {
			return nil, fmt.Errorf("tls: %w", err)
		}
		out = append(out, fi)
	}
	return out, nil
}

func sameFiles(a, b []os.FileInfo) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !os.SameFile(a[i], b[i]) || !a[i].ModTime().Equal(b[i].ModTime()) || a[i].Size() != b[i].Size() {
			return false
		}
	}
	return true
}

// load reads the files; st is their stat taken before reading, so a file
// replaced while it is read is read again at the next check.
func (c *certs) load(st []os.FileInfo) error {
	cert, err := tls.LoadX509KeyPair(c.opts.CertFile, c.opts.KeyFile)
	if err != nil {
		return fmt.Errorf("tls: load certificate %s and key %s: %w", c.opts.CertFile, c.opts.KeyFile, err)
	}
	var pool *x509.CertPool
	if c.opts.ClientCAFile != "" {
		b, err := os.ReadFile(c.opts.ClientCAFile)
		if err != nil {
			return fmt.Errorf("tls: client CA: %w", err)
		}
		pool = x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b) {
			return fmt.Errorf("tls: client CA %s: no PEM certificate", c.opts.ClientCAFile)
		}
	}
	c.cert.Store(&cert)
	c.pool.Store(pool)
	c.loaded = st
	return nil
}

// check reloads the material if any file changed since it was loaded, and
// reports whether a new version was loaded. A version that failed to load
// is not retried (nor logged again) until the files change once more.
func (c *certs) check() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	st, err := c.stat()
	if err != nil {
		// A file missing for a moment (mid-rotation) keeps the old
		// material; logged once per distinct situation would need more
		// state than it is worth, so it is logged at debug level.
		c.log.Debug("TLS files not readable; keeping the loaded material", "err", err)
		return false
	}
	if sameFiles(st, c.loaded) || sameFiles(st, c.failed) {
		return false
	}
	if err := c.load(st); err != nil {
		c.failed = st
		if c.opts.ReloadFailures != nil {
			c.opts.ReloadFailures.Inc()
		}
		c.log.Warn("TLS files changed but cannot be loaded; keeping the previous certificate", "err", err)
		return false
	}
	c.failed = nil
	leaf := c.cert.Load().Leaf
	c.log.Info("TLS material reloaded", "serial", leaf.SerialNumber.String(), "not_after", leaf.NotAfter)
	return true
}

// config returns the listener's tls.Config: modern defaults (TLS 1.2+,
// AEAD suites with forward secrecy only), material from check().
func (c *certs) config() *tls.Config {
	base := &tls.Config{
		MinVersion: tls.VersionTLS12,
		// TLS 1.3 suites are not configurable (all are fine); for 1.2 only
		// ECDHE with AES-GCM or ChaCha20-Poly1305.
		CipherSuites: []uint16{
			tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
			tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384, tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
			tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256, tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
		},
		NextProtos: []string{"http/1.1"},
		// A resumed session would skip verification against a client CA
		// that has been rotated since; scrapers keep connections alive,
		// so full handshakes cost little.
		SessionTicketsDisabled: true,
	}
	if c.opts.ClientCAFile != "" {
		base.ClientAuth = tls.VerifyClientCertIfGiven
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			c.check()
			cfg := base.Clone()
			cfg.Certificates = []tls.Certificate{*c.cert.Load()}
			cfg.ClientCAs = c.pool.Load()
			return cfg, nil
		},
	}
}

// handshakeResult classifies a server-side handshake error.
func handshakeResult(err error) string {
	var verr *tls.CertificateVerificationError
	switch {
	case err == nil:
		return HandshakeOK
	case errors.As(err, &verr):
		return HandshakeBadCert
	default:
		return HandshakeError
	}
}

// tlsListener completes each TLS handshake before handing the connection to
// net/http, so that every outcome is counted with its real error (net/http
// only logs failed handshakes). Handshakes run on their own goroutines:
// a slow client holds up nobody else. At most Limits.MaxHandshakes run at
// once; a new one beyond that closes the oldest (slots), so clients that
// stall handshakes cost a bounded number of goroutines and cannot keep a
// scraper from completing its own.
type tlsListener struct {
	net.Listener
	cfg     *tls.Config
	count   func(result string)
	refuse  func(reason string)
	hs      *slots
	log     *slog.Logger
	conns   chan net.Conn
	errs    chan error
	done    chan struct{}
	closing sync.Once
}

func newTLSListener(ln net.Listener, cfg *tls.Config, count, refuse func(string), maxHandshakes int, log *slog.Logger) *tlsListener {
	l := &tlsListener{Listener: ln, cfg: cfg, count: count, refuse: refuse, hs: newSlots(maxHandshakes), log: log,
		conns: make(chan net.Conn), errs: make(chan error), done: make(chan struct{})}
	go l.acceptLoop()
	return l
}

func (l *tlsListener) acceptLoop() {
	for {
		raw, err := l.Listener.Accept()
		if err != nil {
			select {
			case l.errs <- err: // net/http retries temporary errors itself
			case <-l.done:
				return
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond) // e.g. EMFILE: do not spin
			continue
		}
		sl, evicted := l.hs.acquire(func() { _ = raw.Close() }) // never nil: handshakes are never busy
		if evicted {
			l.refuse(RefusedHandshakeEvicted)
		}
		go l.handshake(raw, sl)
	}
}

func (l *tlsListener) handshake(raw net.Conn, sl *slot) {
	conn := tls.Server(raw, l.cfg)
	ctx, cancel := context.WithTimeout(context.Background(), HandshakeTimeout)
	err := conn.HandshakeContext(ctx)
	cancel()
	sl.release()
	result := handshakeResult(err)
	l.count(result)
	if err != nil {
		l.log.Debug("TLS handshake failed", "remote", raw.RemoteAddr().String(), "result", result, "err", err)
		// As net/http does: tell a plain-HTTP client what went wrong.
		var rhe tls.RecordHeaderError
		if errors.As(err, &rhe) && rhe.Conn != nil && looksLikeHTTP(rhe.RecordHeader) {
			_ = raw.SetWriteDeadline(time.Now().Add(time.Second))
			_, _ = io.WriteString(raw, "HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n")
		}
		_ = raw.Close()
		return
	}
	select {
	case l.conns <- conn:
	case <-l.done:
		_ = conn.Close()
	}
}

func looksLikeHTTP(hdr [5]byte) bool {
	switch string(hdr[:]) {
	case "GET /", "HEAD ", "POST ", "PUT /", "OPTIO":
		return true
	}
	return false
}

func (l *tlsListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case err := <-l.errs:
		return nil, err
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *tlsListener) Close() error {
	err := net.ErrClosed
	l.closing.Do(func() {
		close(l.done)
		err = l.Listener.Close()
	})
	return err
}
