package check

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"time"

	"github.com/profi-dev/profi/internal/config"
)

// expirySoon is when a certificate close to expiry becomes a warning.
const expirySoon = 7 * 24 * time.Hour

func tlsChecks(env *Env) []Result {
	var out []Result
	t := env.Config.MetricsTLS
	if t.Mode == "" || t.Mode == config.TLSModeOff {
		out = append(out, Result{Name: "metrics_tls", Status: OK, Detail: "off (--metrics-tls-mode off): /metrics is plain HTTP"})
	} else {
		out = append(out, keyPair("metrics_tls", "--metrics-tls-cert", t.CertFile, "--metrics-tls-key", t.KeyFile))
		if t.Mode == config.TLSModeMTLS {
			out = append(out, caBundle("metrics_tls_client_ca", "--metrics-tls-client-ca", t.ClientCAFile))
		}
	}
	o := env.Config.OTLP
	if o.Enabled() && o.ClientCert != "" {
		out = append(out, keyPair("otlp_tls", "--otlp-client-cert", o.ClientCert, "--otlp-client-key", o.ClientKey))
	}
	if o.Enabled() && o.CACert != "" {
		out = append(out, caBundle("otlp_ca", "--otlp-ca-cert", o.CACert))
	}
	return out
}

func keyPair(name, certFlag, certFile, keyFlag, keyFile string) Result {
	for _, f := range [][2]string{{certFlag, certFile}, {keyFlag, keyFile}} {
		if f[1] == "" {
			return Result{Name: name, Status: Fail, Detail: f[0] + " is not set", Fix: "set " + certFlag + " and " + keyFlag + " (PEM files, e.g. from a cert-manager Secret)"}
		}
		if _, err := os.ReadFile(f[1]); err != nil {
			return Result{Name: name, Status: Fail, Detail: fmt.Sprintf("%s %s: %v", f[0], f[1], err),
				Fix: "mount the Secret at that path and make it readable by the agent's user (defaultMode 0440 or 0400 for root)"}
		}
	}
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return Result{Name: name, Status: Fail, Detail: fmt.Sprintf("%s %s with %s %s: %v", certFlag, certFile, keyFlag, keyFile, err),
			Fix: "the key must be the private key of the certificate's public key (PEM, PKCS#1, PKCS#8 or SEC1); re-issue the pair or point both flags at the same Secret"}
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return Result{Name: name, Status: Fail, Detail: fmt.Sprintf("%s %s: %v", certFlag, certFile, err), Fix: "re-issue the certificate"}
	}
	return validity(name, certFlag+" "+certFile, leaf)
}

func validity(name, what string, c *x509.Certificate) Result {
	now := time.Now()
	subject := c.Subject.String()
	switch {
	case now.After(c.NotAfter):
		return Result{Name: name, Status: Fail, Detail: fmt.Sprintf("%s (%s) expired at %s", what, subject, c.NotAfter.UTC().Format(time.RFC3339)),
			Fix: "renew the certificate (cert-manager renews before expiry when the Certificate's renewBefore is set); profi reloads the files without a restart"}
	case now.Before(c.NotBefore):
		return Result{Name: name, Status: Fail, Detail: fmt.Sprintf("%s (%s) is not valid before %s", what, subject, c.NotBefore.UTC().Format(time.RFC3339)),
			Fix: "check the node's clock (NTP) or re-issue the certificate"}
	case c.NotAfter.Sub(now) < expirySoon:
		return Result{Name: name, Status: Warn, Detail: fmt.Sprintf("%s (%s) expires at %s, in less than 7 days", what, subject, c.NotAfter.UTC().Format(time.RFC3339)),
			Fix: "renew it soon; profi reloads the files without a restart"}
	}
	return Result{Name: name, Status: OK, Detail: fmt.Sprintf("%s (%s) valid until %s; key matches", what, subject, c.NotAfter.UTC().Format(time.RFC3339))}
}

func caBundle(name, flag, file string) Result {
	if file == "" {
		return Result{Name: name, Status: Fail, Detail: flag + " is not set", Fix: "set " + flag + " to the CA bundle (PEM) that signs the clients' certificates"}
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return Result{Name: name, Status: Fail, Detail: fmt.Sprintf("%s %s: %v", flag, file, err), Fix: "mount the CA bundle at that path, readable by the agent"}
	}
	var certs []*x509.Certificate
	for rest := b; ; {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return Result{Name: name, Status: Fail, Detail: fmt.Sprintf("%s %s: %v", flag, file, err), Fix: "replace it with a valid PEM CA bundle"}
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return Result{Name: name, Status: Fail, Detail: fmt.Sprintf("%s %s holds no PEM certificate", flag, file), Fix: "replace it with a PEM CA bundle (-----BEGIN CERTIFICATE-----)"}
	}
	worst := validity(name, flag+" "+file, certs[0])
	for _, c := range certs[1:] {
		if r := validity(name, flag+" "+file, c); rank(r.Status) > rank(worst.Status) {
			worst = r
		}
	}
	if worst.Status == OK {
		worst.Detail = fmt.Sprintf("%s %s: %d CA certificate(s), valid", flag, file, len(certs))
	}
	return worst
}

func rank(s Status) int {
	switch s {
	case Fail:
		return 2
	case Warn:
		return 1
	}
	return 0
}
