package tlsca

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"
)

// An issued certificate verifies against the CA for its names and usage
// only, and WriteFile replaces a file's content.
func TestIssue(t *testing.T) {
	ca, err := New("test-ca")
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(ca.CertPEM()) {
		t.Fatal("CertPEM holds no certificate")
	}
	certPEM, keyPEM, err := ca.Issue("node-1", []string{"node-1.example"}, Server)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	server := x509.VerifyOptions{Roots: roots, DNSName: "node-1.example", KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	if _, err := pair.Leaf.Verify(server); err != nil {
		t.Fatalf("server certificate: %v", err)
	}
	other := server
	other.DNSName = "node-2.example"
	if _, err := pair.Leaf.Verify(other); err == nil {
		t.Fatal("the certificate verifies for a name it was not issued for")
	}
	client := x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if _, err := pair.Leaf.Verify(client); err == nil {
		t.Fatal("a server certificate verifies as a client certificate")
	}
	// An IP address is an IP SAN: the certificate verifies for it, not
	// for another address.
	certPEM, keyPEM, err = ca.Issue("etcd", []string{"127.0.0.1", "localhost"}, Server)
	if err != nil {
		t.Fatal(err)
	}
	if pair, err = tls.X509KeyPair(certPEM, keyPEM); err != nil {
		t.Fatal(err)
	}
	byIP := server
	byIP.DNSName = "127.0.0.1"
	if _, err := pair.Leaf.Verify(byIP); err != nil {
		t.Fatalf("certificate for 127.0.0.1: %v", err)
	}
	if len(pair.Leaf.DNSNames) != 1 || len(pair.Leaf.IPAddresses) != 1 {
		t.Fatalf("SANs: DNS %v, IP %v; want localhost and 127.0.0.1", pair.Leaf.DNSNames, pair.Leaf.IPAddresses)
	}
	byIP.DNSName = "127.0.0.2"
	if _, err := pair.Leaf.Verify(byIP); err == nil {
		t.Fatal("the certificate for 127.0.0.1 verifies for 127.0.0.2")
	}

	certPEM, _, err = ca.Issue("relay", nil, Client)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "relay.crt")
	if err := os.WriteFile(path, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(path, certPEM); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil || string(got) != string(certPEM) {
		t.Fatalf("%s after WriteFile: %q (%v)", path, got, err)
	}
	block, _ := pem.Decode(got)
	if block == nil {
		t.Fatal("no PEM written")
	}
	relay, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := relay.Verify(client); err != nil {
		t.Fatalf("client certificate: %v", err)
	}
}
