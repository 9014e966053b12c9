package kvstore

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/credentials"
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

// tlsCreds are the gRPC transport credentials of an etcd.config file with
// TLS. Each handshake is Go's own verification, made against the CA file
// as it is then (so a rotated CA is used without a restart) and against
// the host of the endpoint being dialled, a DNS name or an IP address, as
// etcd's own client does: a certificate of the trusted CA for another
// host is refused. The last handshake error of each endpoint is kept for
// the status, which otherwise sees only its read time out.
type tlsCreds struct {
	credentials.TransportCredentials
	files *certFiles
	base  *tls.Config
	hs    *handshakes
}

// handshakes are the last failed handshake of each endpoint (host:port),
// none once one succeeds.
type handshakes struct {
	mu     sync.Mutex
	failed map[string]error
}

func (t *tlsCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	cfg := t.base.Clone()
	if t.files.ca != "" {
		pool, err := t.files.caPool()
		if err != nil {
			raw.Close()
			return nil, nil, t.hs.record(authority, err)
		}
		cfg.RootCAs = pool
	}
	// gRPC sets ServerName to the host of authority, which etcd's resolver
	// makes the endpoint's host:port; Go checks the certificate's DNS
	// names, or its IP addresses when the host is one, against it.
	conn, info, err := credentials.NewTLS(cfg).ClientHandshake(ctx, authority, raw)
	return conn, info, t.hs.record(authority, err)
}

// record keeps err as the endpoint's last handshake error (nil: it
// succeeded), and returns it naming the endpoint.
func (h *handshakes) record(endpoint string, err error) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err == nil {
		delete(h.failed, endpoint)
		return nil
	}
	err = fmt.Errorf("TLS handshake with etcd %s: %w", endpoint, err)
	h.failed[endpoint] = err
	return err
}

// reset forgets the failed handshakes: etcd answered, and an error of
// before would mislead when it next does not.
func (h *handshakes) reset() {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	clear(h.failed)
}

// err is the endpoints' last failed handshakes, in endpoint order, on
// one line (the status shows it on one); nil for none (or no TLS).
func (h *handshakes) err() error {
	if h == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.failed) == 0 {
		return nil
	}
	var msgs []string
	for _, ep := range slices.Sorted(maps.Keys(h.failed)) {
		msgs = append(msgs, h.failed[ep].Error())
	}
	return errors.New(strings.Join(msgs, "; "))
}

// Clone shares the record of failed handshakes: gRPC clones the
// credentials it is given.
func (t *tlsCreds) Clone() credentials.TransportCredentials {
	return &tlsCreds{TransportCredentials: t.TransportCredentials.Clone(), files: t.files, base: t.base, hs: t.hs}
}

// newTLSCreds are the credentials for an etcd.config file, nil when it
// names no CA nor client certificate (plain http endpoints).
func newTLSCreds(f configFile) (*tlsCreds, error) {
	if f.TrustedCAFile == "" && f.CertFile == "" {
		return nil, nil
	}
	c := &certFiles{ca: f.TrustedCAFile, cert: f.CertFile, key: f.KeyFile}
	base := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.ca != "" {
		if _, err := c.caPool(); err != nil {
			return nil, err
		}
	}
	if c.cert != "" {
		if _, err := c.clientCert(nil); err != nil {
			return nil, err
		}
		base.GetClientCertificate = c.clientCert
	}
	return &tlsCreds{TransportCredentials: credentials.NewTLS(base), files: c, base: base, hs: &handshakes{failed: map[string]error{}}}, nil
}
