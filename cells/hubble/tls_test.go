package hubble

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/cilium/api/v1/observer"
	peerpb "github.com/cilium/cilium/api/v1/peer"
	"github.com/cilium/hive/cell"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/cellium/cellium/cells/health"
	"github.com/cellium/cellium/cells/nodes"
	"github.com/cellium/cellium/pkg/polltest"
	"github.com/cellium/cellium/pkg/tlsca"
)

// secretDir lays files out as the kubelet does in a Secret volume: each
// version in a directory of its own, "..data" a symlink to the current
// one, and every file a symlink through "..data", so that a new version
// replaces all files at once by swapping "..data".
type secretDir struct {
	t        *testing.T
	dir      string
	versions int
}

func newSecretDir(t *testing.T) *secretDir {
	return &secretDir{t: t, dir: t.TempDir()}
}

func (s *secretDir) path(name string) string { return filepath.Join(s.dir, name) }

// write makes files the Secret's new content.
func (s *secretDir) write(files map[string][]byte) {
	s.t.Helper()
	s.versions++
	version := fmt.Sprintf("..2026_11_28_00_00_%02d.%d", s.versions, s.versions)
	if err := os.Mkdir(s.path(version), 0o755); err != nil {
		s.t.Fatal(err)
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(s.path(version), name), data, 0o644); err != nil {
			s.t.Fatal(err)
		}
	}
	if err := os.Symlink(version, s.path("..data_tmp")); err != nil {
		s.t.Fatal(err)
	}
	if err := os.Rename(s.path("..data_tmp"), s.path("..data")); err != nil {
		s.t.Fatal(err)
	}
	for name := range files {
		if err := os.Symlink(filepath.Join("..data", name), s.path(name)); err != nil && !os.IsExist(err) {
			s.t.Fatal(err)
		}
	}
}

type issued struct {
	cert, key []byte
	serial    *big.Int
}

func issue(t *testing.T, ca *tlsca.CA, name string, dnsNames []string, usage tlsca.Usage) issued {
	t.Helper()
	cert, key, err := ca.Issue(name, dnsNames, usage)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	return issued{cert: cert, key: key, serial: pair.Leaf.SerialNumber}
}

// The TCP listener serves TLS from files that change under it: a client
// needs the server CA's trust and a certificate of the client CA; a new
// certificate on disk is what the next connection gets, a bad one leaves
// the last good one in place. The unix socket stays plaintext.
func TestTLS(t *testing.T) {
	serverCA, err := tlsca.New("hubble-server-ca")
	if err != nil {
		t.Fatal(err)
	}
	clientCA, err := tlsca.New("hubble-client-ca")
	if err != nil {
		t.Fatal(err)
	}
	serverNames := []string{TLSServerName("node-1"), PeerTLSServerName}
	first := issue(t, serverCA, "node-1", serverNames, tlsca.Server)
	sec := newSecretDir(t)
	sec.write(map[string][]byte{"tls.crt": first.cert, "tls.key": first.key, "client-ca.crt": clientCA.CertPEM()})

	e := newCellEnv(t, envOptions{
		config: func(c *Config) {
			c.HubbleTCPListenAddress = "127.0.0.1:0"
			c.HubbleTLSCertFile, c.HubbleTLSKeyFile = sec.path("tls.crt"), sec.path("tls.key")
			c.HubbleTLSClientCAFiles = []string{sec.path("client-ca.crt")}
		},
		nodes: []*nodes.Node{node("node-1", true, "10.90.0.11"), node("node-2", false, "10.90.0.12")},
	})
	tcp, _ := e.hubble.TCPAddress()
	_, port, _ := net.SplitHostPort(tcp.Addr)

	roots := x509.NewCertPool()
	roots.AddCert(serverCA.Cert)
	relay := issue(t, clientCA, "hubble-relay", nil, tlsca.Client)
	relayPair, err := tls.X509KeyPair(relay.cert, relay.key)
	if err != nil {
		t.Fatal(err)
	}
	// A client certificate of the server's CA: signed, but not by the
	// client CA.
	strangerPair, err := tls.X509KeyPair(func() ([]byte, []byte) {
		s := issue(t, serverCA, "stranger", nil, tlsca.Client)
		return s.cert, s.key
	}())
	if err != nil {
		t.Fatal(err)
	}
	clientTLS := func(certs ...tls.Certificate) *tls.Config {
		return &tls.Config{RootCAs: roots, ServerName: TLSServerName("node-1"), Certificates: certs, MinVersion: tls.VersionTLS12}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// status is ServerStatus over a new connection to the TCP listener.
	status := func(creds credentials.TransportCredentials) error {
		conn, err := grpc.NewClient(tcp.Target(), grpc.WithTransportCredentials(creds))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err = observer.NewObserverClient(conn).ServerStatus(ctx, &observer.ServerStatusRequest{})
		return err
	}
	// servedSerial is the serial number of the certificate a new TLS
	// connection gets.
	servedSerial := func() (*big.Int, error) {
		cfg := clientTLS(relayPair)
		cfg.NextProtos = []string{"h2"}
		conn, err := (&tls.Dialer{Config: cfg}).DialContext(ctx, "tcp", tcp.Addr)
		if err != nil {
			return nil, err
		}
		defer conn.Close()
		return conn.(*tls.Conn).ConnectionState().PeerCertificates[0].SerialNumber, nil
	}
	tlsHealth := func() *health.Status {
		s, _, _ := e.health.Get(e.db.ReadTxn(), health.StatusID.Query("hubble.tls"))
		return s
	}

	t.Run("a plaintext client is refused", func(t *testing.T) {
		if err := status(insecure.NewCredentials()); err == nil {
			t.Fatal("ServerStatus over plaintext TCP succeeded, want it refused")
		}
	})
	t.Run("a client without a certificate is refused", func(t *testing.T) {
		if err := status(credentials.NewTLS(clientTLS())); err == nil {
			t.Fatal("ServerStatus without a client certificate succeeded, want it refused")
		}
	})
	t.Run("a client whose certificate is not of the client CA is refused", func(t *testing.T) {
		if err := status(credentials.NewTLS(clientTLS(strangerPair))); err == nil {
			t.Fatal("ServerStatus with a certificate of another CA succeeded, want it refused")
		}
	})
	t.Run("a client with a certificate of the client CA is served", func(t *testing.T) {
		if err := status(credentials.NewTLS(clientTLS(relayPair))); err != nil {
			t.Fatalf("ServerStatus with the client CA's certificate: %v", err)
		}
		if s := tlsHealth(); s == nil || s.Level != cell.StatusOK || !strings.Contains(s.Message, first.serial.String()) {
			t.Fatalf("health of hubble.tls %+v, want OK serving serial %s", s, first.serial)
		}
	})
	t.Run("the Peer service announces TLS with each node's server name", func(t *testing.T) {
		conn, err := grpc.NewClient(tcp.Target(), grpc.WithTransportCredentials(credentials.NewTLS(clientTLS(relayPair))))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		stream, err := peerpb.NewPeerClient(conn).Notify(ctx, &peerpb.NotifyRequest{})
		if err != nil {
			t.Fatal(err)
		}
		recv(t, stream,
			"PEER_ADDED node-1 10.90.0.11:"+port+" tls=node-1.default.hubble-grpc.cilium.io",
			"PEER_ADDED node-2 10.90.0.12:"+port+" tls=node-2.default.hubble-grpc.cilium.io")
	})
	t.Run("the unix socket stays plaintext", func(t *testing.T) {
		if _, err := e.client.ServerStatus(ctx, &observer.ServerStatusRequest{}); err != nil {
			t.Fatalf("ServerStatus over the socket: %v", err)
		}
	})

	second := issue(t, serverCA, "node-1", serverNames, tlsca.Server)
	t.Run("a certificate rotated on disk is what a new connection gets", func(t *testing.T) {
		sec.write(map[string][]byte{"tls.crt": second.cert, "tls.key": second.key, "client-ca.crt": clientCA.CertPEM()})
		got, err := servedSerial()
		if err != nil || got.Cmp(second.serial) != 0 {
			t.Fatalf("certificate served after the rotation: serial %v (%v), want the new one %s (the old one: %s)", got, err, second.serial, first.serial)
		}
		if err := status(credentials.NewTLS(clientTLS(relayPair))); err != nil {
			t.Fatalf("ServerStatus after the rotation: %v", err)
		}
	})
	t.Run("a bad new certificate keeps the last good one", func(t *testing.T) {
		sec.write(map[string][]byte{"tls.crt": []byte("not a certificate"), "tls.key": second.key, "client-ca.crt": clientCA.CertPEM()})
		got, err := servedSerial()
		if err != nil || got.Cmp(second.serial) != 0 {
			t.Fatalf("certificate served after a bad one was written: serial %v (%v), want the last good one %s", got, err, second.serial)
		}
		if err := status(credentials.NewTLS(clientTLS(relayPair))); err != nil {
			t.Fatalf("ServerStatus after a bad certificate was written: %v", err)
		}
		s := tlsHealth()
		if s == nil || s.Level != cell.StatusDegraded || !strings.Contains(s.Message, "still serving") || !strings.Contains(s.Message, second.serial.String()) {
			t.Fatalf("health of hubble.tls %+v, want Degraded, still serving serial %s", s, second.serial)
		}

		// Without a handshake to look, the job sees the next change.
		third := issue(t, serverCA, "node-1", serverNames, tlsca.Server)
		sec.write(map[string][]byte{"tls.crt": third.cert, "tls.key": third.key, "client-ca.crt": clientCA.CertPEM()})
		polltest.Until(t, "hubble.tls OK with the third certificate", 10*time.Second, 20*time.Millisecond, func() (bool, string) {
			s := tlsHealth()
			return s != nil && s.Level == cell.StatusOK && strings.Contains(s.Message, third.serial.String()), fmt.Sprintf("%+v", s)
		})
		if got, err := servedSerial(); err != nil || got.Cmp(third.serial) != 0 {
			t.Fatalf("certificate served after a good one followed the bad one: serial %v (%v), want %s", got, err, third.serial)
		}
	})
}

// A TCP listener without certificate starts only with consent to
// plaintext; the TLS flags are checked against each other.
func TestTLSFlags(t *testing.T) {
	ok := Config{HubbleEnabled: true, HubbleBufferSize: 1}
	for _, tc := range []struct {
		cfg  func(*Config)
		want string
	}{
		{func(c *Config) { c.HubbleTCPListenAddress = ":4244" },
			"--hubble-tcp-listen-address :4244 is TCP, which Hubble serves only with TLS: set --hubble-tls-cert-file and --hubble-tls-key-file (and --hubble-tls-client-ca-files for mutual TLS), or --hubble-disable-tls to serve plaintext"},
		{func(c *Config) { c.HubbleListenAddress = "127.0.0.1:4244" }, "--hubble-listen-address 127.0.0.1:4244 is TCP, which Hubble serves only with TLS"},
		{func(c *Config) { c.HubbleTLSCertFile = "/tls/tls.crt" }, `--hubble-tls-cert-file "/tls/tls.crt" and --hubble-tls-key-file "": set both or neither`},
		{func(c *Config) { c.HubbleTLSKeyFile = "/tls/tls.key" }, `--hubble-tls-cert-file "" and --hubble-tls-key-file "/tls/tls.key": set both or neither`},
		{func(c *Config) { c.HubbleTLSClientCAFiles = []string{"/tls/ca.crt"} }, "--hubble-tls-client-ca-files [/tls/ca.crt] without --hubble-tls-cert-file"},
		{func(c *Config) {
			c.HubbleTLSCertFile, c.HubbleTLSKeyFile, c.HubbleDisableTLS = "/tls/tls.crt", "/tls/tls.key", true
		}, `--hubble-disable-tls with --hubble-tls-cert-file "/tls/tls.crt": choose one`},
	} {
		cfg := ok
		tc.cfg(&cfg)
		if err := cfg.validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("validate(%+v) = %v, want %q", cfg, err, tc.want)
		}
	}
	for _, good := range []func(*Config){
		func(*Config) {},
		func(c *Config) { c.HubbleTCPListenAddress, c.HubbleDisableTLS = ":4244", true },
		func(c *Config) {
			c.HubbleTCPListenAddress, c.HubbleTLSCertFile, c.HubbleTLSKeyFile = ":4244", "/tls/tls.crt", "/tls/tls.key"
		},
		// A server that does not serve needs no certificate.
		func(c *Config) { c.HubbleTCPListenAddress, c.HubbleEnabled = ":4244", false },
	} {
		cfg := ok
		good(&cfg)
		if err := cfg.validate(); err != nil {
			t.Errorf("validate(%+v) = %v, want nil", cfg, err)
		}
	}
}

// Certificate files that are not there yet: the listener serves, every
// handshake fails, and health says why until the files appear.
func TestTLSWithoutCertificateYet(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	e := newCellEnv(t, envOptions{config: func(c *Config) {
		c.HubbleTCPListenAddress = "127.0.0.1:0"
		c.HubbleTLSCertFile, c.HubbleTLSKeyFile = certFile, keyFile
	}})
	s, _, _ := e.health.Get(e.db.ReadTxn(), health.StatusID.Query("hubble.tls"))
	if s == nil || s.Level != cell.StatusDegraded || !strings.Contains(s.Error, certFile) {
		t.Fatalf("health of hubble.tls without the files %+v, want Degraded naming %s", s, certFile)
	}
	ca, err := tlsca.New("ca")
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	tcp, _ := e.hubble.TCPAddress()
	cfg := &tls.Config{RootCAs: roots, ServerName: TLSServerName("node-1"), NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS13}
	if conn, err := tls.Dial("tcp", tcp.Addr, cfg); err == nil {
		conn.Close()
		t.Fatal("TLS handshake without a certificate succeeded")
	}
	c := issue(t, ca, "node-1", []string{TLSServerName("node-1")}, tlsca.Server)
	if err := tlsca.WriteFile(keyFile, c.key); err != nil {
		t.Fatal(err)
	}
	if err := tlsca.WriteFile(certFile, c.cert); err != nil {
		t.Fatal(err)
	}
	polltest.Until(t, "hubble.tls OK", 10*time.Second, 20*time.Millisecond, func() (bool, string) {
		s, _, _ := e.health.Get(e.db.ReadTxn(), health.StatusID.Query("hubble.tls"))
		return s != nil && s.Level == cell.StatusOK, fmt.Sprintf("%+v", s)
	})
	conn, err := tls.Dial("tcp", tcp.Addr, cfg)
	if err != nil {
		t.Fatalf("TLS handshake once the files are there: %v", err)
	}
	conn.Close()
}
