package etcdtest

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cellium/cellium/pkg/tlsca"
)

// TLSFiles are the PEM files of one side of a TLS connection: its
// certificate and key, and the CA it trusts.
type TLSFiles struct {
	CA, Cert, Key string
}

// ClientConfig is a TLS client configuration from the files.
func (f TLSFiles) ClientConfig() (*tls.Config, error) {
	pair, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return nil, err
	}
	ca, err := os.ReadFile(f.CA)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("%s: no PEM certificate", f.CA)
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

// CA is a tlsca.CA that writes what it issues as files and fails the test
// on an error.
type CA struct {
	t  testing.TB
	ca *tlsca.CA
}

// NewCA makes a CA named name.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	ca, err := tlsca.New(name)
	if err != nil {
		t.Fatal(err)
	}
	return &CA{t: t, ca: ca}
}

// Issue writes into dir a certificate for 127.0.0.1 and localhost named
// name, good for both server and client authentication, its key and this
// CA's certificate, replacing what the files held (each written
// atomically).
func (ca *CA) Issue(dir, name string) TLSFiles {
	ca.t.Helper()
	return ca.IssueFor(dir, name, "127.0.0.1", "localhost")
}

// IssueFor is Issue with a certificate for hosts: IP addresses and DNS
// names (a test's certificate for the wrong host).
func (ca *CA) IssueFor(dir, name string, hosts ...string) TLSFiles {
	t := ca.t
	t.Helper()
	cert, key, err := ca.ca.Issue(name, hosts, tlsca.Server|tlsca.Client)
	if err != nil {
		t.Fatal(err)
	}
	f := TLSFiles{CA: filepath.Join(dir, name+"-ca.pem"), Cert: filepath.Join(dir, name+".pem"), Key: filepath.Join(dir, name+"-key.pem")}
	for path, data := range map[string][]byte{f.CA: ca.ca.CertPEM(), f.Cert: cert, f.Key: key} {
		if err := tlsca.WriteFile(path, data); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// UncheckedClient is a client of the TLS server at endpoint with the
// files' certificate that does not check the server's: to read what a
// server with a certificate for another host holds. It is closed when the
// test ends.
func UncheckedClient(t testing.TB, endpoint string, files TLSFiles) *clientv3.Client {
	t.Helper()
	cfg, err := files.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	cfg.InsecureSkipVerify = true
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, TLS: cfg, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}
