package kvstore

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// certFiles gives TLS its certificates from files, read again whenever a
// file changes, so rotated certificates are used without a restart: the
// client certificate at each handshake, the CA at each verification.
type certFiles struct {
	ca, cert, key string

	mu       sync.Mutex
	caStamp  time.Time
	pool     *x509.CertPool
	keyStamp time.Time
	pair     *tls.Certificate
}

func stamp(paths ...string) (time.Time, error) {
	var newest time.Time
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return time.Time{}, err
		}
		if st.ModTime().After(newest) {
			newest = st.ModTime()
		}
	}
	return newest, nil
}

func (c *certFiles) caPool() (*x509.CertPool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	st, err := stamp(c.ca)
	if err != nil {
		return nil, fmt.Errorf("trusted-ca-file: %w", err)
	}
	if c.pool != nil && st.Equal(c.caStamp) {
		return c.pool, nil
	}
	pem, err := os.ReadFile(c.ca)
	if err != nil {
		return nil, fmt.Errorf("trusted-ca-file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("trusted-ca-file %s: no PEM certificate in it", c.ca)
	}
	c.pool, c.caStamp = pool, st
	return pool, nil
}

func (c *certFiles) clientCert(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	st, err := stamp(c.cert, c.key)
	if err != nil {
		return nil, fmt.Errorf("cert-file/key-file: %w", err)
	}
	if c.pair != nil && st.Equal(c.keyStamp) {
		return c.pair, nil
	}
	pair, err := tls.LoadX509KeyPair(c.cert, c.key)
	if err != nil {
		return nil, fmt.Errorf("cert-file %s, key-file %s: %w", c.cert, c.key, err)
	}
	c.pair, c.keyStamp = &pair, st
	return &pair, nil
}

// verify checks the server's chain against the CA file as it is now.
func (c *certFiles) verify(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("etcd server sent no certificate")
	}
	pool, err := c.caPool()
	if err != nil {
		return err
	}
	opts := x509.VerifyOptions{Roots: pool, DNSName: cs.ServerName, Intermediates: x509.NewCertPool()}
	for _, ic := range cs.PeerCertificates[1:] {
		opts.Intermediates.AddCert(ic)
	}
	_, err = cs.PeerCertificates[0].Verify(opts)
	return err
}

// tlsConfig is the client's TLS configuration for an etcd.config file, nil
// when it names no CA (plain http endpoints).
func tlsConfig(f configFile) (*tls.Config, error) {
	if f.TrustedCAFile == "" && f.CertFile == "" {
		return nil, nil
	}
	c := &certFiles{ca: f.TrustedCAFile, cert: f.CertFile, key: f.KeyFile}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.ca != "" {
		if _, err := c.caPool(); err != nil {
			return nil, err
		}
		// The chain is checked by verify, against the CA file as it is at
		// each handshake, instead of a pool fixed now.
		cfg.InsecureSkipVerify = true
		cfg.VerifyConnection = c.verify
	}
	if c.cert != "" {
		if _, err := c.clientCert(nil); err != nil {
			return nil, err
		}
		cfg.GetClientCertificate = c.clientCert
	}
	return cfg, nil
}
