// Package kubeapiserver builds a real kube-apiserver from k8s.io/kubernetes
// (once per machine, through the module proxy) and says how to run it:
// for the tests (pkg/kubeapitest) and for `cellium-dev cluster up
// --identity-allocation-mode=crd` (pkg/devcluster) alike.
package kubeapiserver

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
)

// Setup is one kube-apiserver: where it listens, its etcd and its files.
type Setup struct {
	// Binary is the kube-apiserver to run.
	Binary string
	// EtcdServers is its etcd's client URL; EtcdPrefix its keys' prefix
	// there.
	EtcdServers, EtcdPrefix string
	// Address and Port are where it serves (and the address it
	// advertises, which its self-signed certificate names).
	Address, Port string
	// Dir holds its certificate (certs/), the token file and the service
	// account key, which WriteFiles writes.
	Dir string
	// ServiceCIDR is the range of Service cluster IPs.
	ServiceCIDR string
}

// Token is a static bearer token of the token file: User authenticates
// with it, a member of Groups.
type Token struct {
	Token, User string
	Groups      []string
}

// CertDir is where kube-apiserver writes its self-signed certificate,
// apiserver.crt, which clients trust.
func (s Setup) CertDir() string { return filepath.Join(s.Dir, "certs") }

// CA is the path of that certificate.
func (s Setup) CA() string { return filepath.Join(s.CertDir(), "apiserver.crt") }

func (s Setup) tokenFile() string { return filepath.Join(s.Dir, "tokens.csv") }
func (s Setup) saKey() string     { return filepath.Join(s.Dir, "sa.key") }

// WriteFiles writes the token file with tokens and a new service account
// signing key into Dir.
func (s Setup) WriteFiles(tokens ...Token) error {
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return err
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	if err := os.WriteFile(s.saKey(), pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
		return err
	}
	var csv []byte
	for i, t := range tokens {
		groups := ""
		for j, g := range t.Groups {
			if j > 0 {
				groups += ","
			}
			groups += g
		}
		csv = fmt.Appendf(csv, "%s,%s,%s-%d,%q\n", t.Token, t.User, t.User, i, groups)
	}
	return os.WriteFile(s.tokenFile(), csv, 0o600)
}

// Args is the command line: RBAC authorization, the token file, the
// service account token issuer, no priority and fairness (one client at
// a time matters more here than fairness among many).
func (s Setup) Args() []string {
	return []string{s.Binary,
		"--etcd-servers", s.EtcdServers,
		"--etcd-prefix", s.EtcdPrefix,
		"--bind-address", s.Address,
		"--advertise-address", s.Address,
		"--secure-port", s.Port,
		"--cert-dir", s.CertDir(),
		"--token-auth-file", s.tokenFile(),
		"--authorization-mode", "RBAC",
		"--service-account-key-file", s.saKey(),
		"--service-account-signing-key-file", s.saKey(),
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-cluster-ip-range", s.ServiceCIDR,
		"--enable-priority-and-fairness=false",
	}
}
