package hubble

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cilium/hive/cell"
)

// ClusterName is the cluster name in the TLS server names of the Peer
// service and every node: hubble-relay's default --cluster-name.
const ClusterName = "default"

// TLSServerName is the name a node's Hubble server certificate must hold
// (as a DNS SAN) for hubble-relay to accept it, and what the Peer service
// announces for the node: "<node>.<cluster>.hubble-grpc.cilium.io", the
// dots of the node's name made hyphens so that every node's name has the
// same number of labels, as the relay expects. A certificate for
// "*.default.hubble-grpc.cilium.io" serves every node.
func TLSServerName(node string) string {
	return strings.ReplaceAll(node, ".", "-") + "." + ClusterName + ".hubble-grpc.cilium.io"
}

// PeerTLSServerName is the name hubble-relay checks in the certificate of
// the agent that answers its Peer service (--peer-service): the relay's
// own choice for "hubble-peer".
var PeerTLSServerName = TLSServerName("hubble-peer")

// certReloadInterval is how often the files are looked at for a change
// when no client connects: each TLS handshake looks as well.
const certReloadInterval = time.Second

// tlsFiles serves the TCP listeners' TLS from files that may change while
// the agent runs, as a Kubernetes Secret volume does (by swapping a
// symlink): each handshake, and a job every second, compare the files'
// identity (device, inode, size, modification time, following symlinks)
// with that of the files last read and read them again on a change. A
// change that does not make a good certificate and key (or CA bundle)
// keeps the last good ones, and says so in health and the log.
type tlsFiles struct {
	certFile, keyFile string
	// caFiles are the CAs a client's certificate must be signed by; none:
	// no client certificate is asked for.
	caFiles []string
	log     *slog.Logger
	health  cell.Health

	mu sync.Mutex
	// stamp identifies the files as last read; "" before the first read.
	stamp string
	// config is the last good configuration; nil until there is one.
	config *tls.Config
	// desc describes config's certificate, for health and the log.
	desc string
}

func newTLSFiles(cfg Config, log *slog.Logger, health cell.Health) *tlsFiles {
	return &tlsFiles{
		certFile: cfg.HubbleTLSCertFile,
		keyFile:  cfg.HubbleTLSKeyFile,
		caFiles:  cfg.HubbleTLSClientCAFiles,
		log:      log,
		health:   health,
	}
}

// serverConfig is the configuration of the TLS listeners: each handshake
// gets the current files' configuration.
func (t *tlsFiles) serverConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			t.reload()
			t.mu.Lock()
			defer t.mu.Unlock()
			if t.config == nil {
				return nil, fmt.Errorf("no usable certificate in --hubble-tls-cert-file %s and --hubble-tls-key-file %s", t.certFile, t.keyFile)
			}
			return t.config, nil
		},
	}
}

func (t *tlsFiles) files() []string {
	return append([]string{t.certFile, t.keyFile}, t.caFiles...)
}

// fileStamp identifies what path names now: another file, or the same one
// written again, has another stamp.
func fileStamp(path string) string {
	fi, err := os.Stat(path)
	if err != nil {
		return "error " + err.Error()
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	if st == nil {
		return fmt.Sprintf("%d %d", fi.Size(), fi.ModTime().UnixNano())
	}
	return fmt.Sprintf("%d:%d %d %d", st.Dev, st.Ino, fi.Size(), fi.ModTime().UnixNano())
}

// reload reads the files again if they changed since they were last read.
func (t *tlsFiles) reload() {
	var b strings.Builder
	for _, f := range t.files() {
		b.WriteString(fileStamp(f))
		b.WriteByte('\n')
	}
	stamp := b.String()

	t.mu.Lock()
	defer t.mu.Unlock()
	if stamp == t.stamp {
		return
	}
	first := t.stamp == ""
	t.stamp = stamp
	config, desc, err := t.read()
	switch {
	case err != nil && t.config == nil:
		t.log.Error("No usable Hubble TLS certificate: TLS handshakes fail until the files are fixed", "error", err)
		t.health.Degraded("No usable certificate: TLS handshakes fail until the files are fixed", err)
	case err != nil:
		t.log.Error("Hubble TLS files changed but are not usable: still serving the previous certificate", "certificate", t.desc, "error", err)
		t.health.Degraded("Files changed but are not usable: still serving "+t.desc, err)
	default:
		t.config, t.desc = config, desc
		if first {
			t.log.Info("Serving Hubble TLS", "certificate", desc, "client-ca-files", t.caFiles)
		} else {
			t.log.Info("Hubble TLS files changed: serving the new certificate", "certificate", desc, "client-ca-files", t.caFiles)
		}
		t.health.OK("Serving " + desc)
	}
}

// read reads the certificate, its key and the client CAs.
func (t *tlsFiles) read() (*tls.Config, string, error) {
	certPEM, err := os.ReadFile(t.certFile)
	if err != nil {
		return nil, "", fmt.Errorf("--hubble-tls-cert-file: %w", err)
	}
	keyPEM, err := os.ReadFile(t.keyFile)
	if err != nil {
		return nil, "", fmt.Errorf("--hubble-tls-key-file: %w", err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, "", fmt.Errorf("--hubble-tls-cert-file %s with --hubble-tls-key-file %s: %w", t.certFile, t.keyFile, err)
	}
	config := &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
	}
	if len(t.caFiles) > 0 {
		pool := x509.NewCertPool()
		for _, f := range t.caFiles {
			pem, err := os.ReadFile(f)
			if err != nil {
				return nil, "", fmt.Errorf("--hubble-tls-client-ca-files: %w", err)
			}
			if !pool.AppendCertsFromPEM(pem) {
				return nil, "", fmt.Errorf("--hubble-tls-client-ca-files %s: no PEM certificate in it", f)
			}
		}
		config.ClientCAs = pool
		config.ClientAuth = tls.RequireAndVerifyClientCert
	}
	leaf := cert.Leaf
	desc := fmt.Sprintf("%s (serial %s, DNS names %s, valid until %s)", t.certFile, leaf.SerialNumber, strings.Join(leaf.DNSNames, ","), leaf.NotAfter.UTC().Format(time.RFC3339))
	if len(t.caFiles) > 0 {
		desc += ", client certificates required"
	}
	return config, desc, nil
}

// errTLSFlags is the error for a TCP listener with neither a certificate
// nor consent to plaintext.
var errTLSFlags = errors.New("set --hubble-tls-cert-file and --hubble-tls-key-file (and --hubble-tls-client-ca-files for mutual TLS), or --hubble-disable-tls to serve plaintext")
