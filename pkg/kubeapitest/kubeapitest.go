// Package kubeapitest runs a real kube-apiserver for integration tests,
// on a loopback port of its own, backed by a real etcd (pkg/etcdtest),
// with RBAC authorization, the ServiceAccount token issuer and an admin
// token. The binary is built once per machine from k8s.io/kubernetes
// through the module proxy (`make kube-apiserver`, see kubeapiserver.Build); a test
// that finds none skips, naming how to build it.
//
// No controller manager runs: nothing allocates pod CIDRs, creates
// EndpointSlices for Services or runs pods. Tests write those objects
// themselves, as the controllers would.
package kubeapitest

import (
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/cellium/cellium/pkg/etcdtest"
	"github.com/cellium/cellium/pkg/kubeapiserver"
)

// Binary is the kube-apiserver tests use (kubeapiserver.Binary).
func Binary() (string, error) { return kubeapiserver.Binary() }

// AdminToken authenticates as a member of system:masters.
const AdminToken = "cellium-test-admin"

// ServiceCIDR is the range the server allocates Service cluster IPs from.
const ServiceCIDR = "10.96.0.0/16"

// Server is one kube-apiserver process.
type Server struct {
	// URL is https://127.0.0.1:<port>.
	URL string
	// CA is the PEM of the server's self-signed certificate.
	CA []byte
	// Admin is a clientset with AdminToken.
	Admin *kubernetes.Clientset
	// PID is the kube-apiserver process's (its CPU time and memory are in
	// /proc/PID).
	PID int
	log string

	cmd     []string
	certDir string
	exited  chan error
	stop    func()
}

// Start starts kube-apiserver on etcd at etcdEndpoint (a prefix of its own
// per test), waits until it is ready, and stops it when the test ends.
func Start(t testing.TB, etcdEndpoint string) *Server {
	t.Helper()
	return StartWith(t, etcdEndpoint, Options{})
}

// StartOnEtcd skips the test when there is no kube-apiserver binary (before
// starting anything), else starts an etcd of the test's own (pkg/etcdtest)
// and kube-apiserver on it.
func StartOnEtcd(t testing.TB) *Server {
	t.Helper()
	if _, err := Binary(); err != nil {
		t.Skip(err)
	}
	return Start(t, etcdtest.Start(t).Endpoint())
}

// Options are StartWith's.
type Options struct {
	// EtcdPrefix is the prefix of the server's keys in etcd; one of its
	// own when empty. A store saved with its keys (etcdtest's SaveData)
	// is served again by a server given the same prefix.
	EtcdPrefix string
}

// StartWith is Start with o.
func StartWith(t testing.TB, etcdEndpoint string, o Options) *Server {
	t.Helper()
	bin, err := kubeapiserver.Binary()
	if err != nil {
		t.Skip(err)
	}
	dir := t.TempDir()
	port := freePort(t)
	prefix := o.EtcdPrefix
	if prefix == "" {
		prefix = "/kubeapitest-" + port
	}
	setup := kubeapiserver.Setup{
		Binary: bin, EtcdServers: etcdEndpoint, EtcdPrefix: prefix,
		Address: "127.0.0.1", Port: port, Dir: dir, ServiceCIDR: ServiceCIDR,
	}
	if err := setup.WriteFiles(kubeapiserver.Token{Token: AdminToken, User: "admin", Groups: []string{"system:masters"}}); err != nil {
		t.Fatal(err)
	}
	s := &Server{URL: "https://127.0.0.1:" + port, log: filepath.Join(dir, "kube-apiserver.log")}
	s.certDir = setup.CertDir()
	s.cmd = setup.Args()
	t.Cleanup(s.Stop)
	s.launch(t)
	admin, err := kubernetes.NewForConfig(s.Config(AdminToken))
	if err != nil {
		t.Fatal(err)
	}
	s.Admin = admin
	return s
}

// launch starts the process and waits until it is ready.
func (s *Server) launch(t testing.TB) {
	t.Helper()
	logFile, err := os.OpenFile(s.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(s.cmd[0], s.cmd[1:]...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", s.cmd[0], err)
	}
	s.PID = cmd.Process.Pid
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait(); logFile.Close() }()
	s.stop = func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
	}

	// Ready: the certificate written, /readyz answering ok (bootstrap
	// RBAC roles and the system namespaces in place).
	deadline := time.Now().Add(90 * time.Second)
	for {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("kube-apiserver exited: %v\n%s", err, s.Log())
		default:
		}
		if s.ready(s.certDir) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("kube-apiserver not ready within 90s:\n%s", s.Log())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Stop stops the server (SIGTERM, then SIGKILL after 30 s); Restart starts
// it again.
func (s *Server) Stop() {
	if s.stop != nil {
		s.stop()
		s.stop = nil
	}
}

// Restart starts a stopped server again, with the same port, certificate,
// keys and etcd prefix, and waits until it is ready.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Stop()
	s.launch(t)
}

func (s *Server) ready(certDir string) bool {
	if s.CA == nil {
		ca, err := os.ReadFile(filepath.Join(certDir, "apiserver.crt"))
		if err != nil {
			return false
		}
		s.CA = ca
	}
	cfg := s.Config(AdminToken)
	tr, err := rest.TransportFor(cfg)
	if err != nil {
		return false
	}
	resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Get(s.URL + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// Config is a client configuration authenticating with token.
func (s *Server) Config(token string) *rest.Config {
	return &rest.Config{Host: s.URL, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAData: s.CA}}
}

// Token is a token of the service account namespace/name, as a pod of it
// gets mounted.
func (s *Server) Token(t testing.TB, namespace, name string) string {
	t.Helper()
	expiry := int64(3600)
	tr, err := s.Admin.CoreV1().ServiceAccounts(namespace).CreateToken(context.Background(), name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token of service account %s/%s: %v", namespace, name, err)
	}
	return tr.Status.Token
}

// WriteKubeconfig writes a kubeconfig for token at path.
func (s *Server) WriteKubeconfig(t testing.TB, path, token string) {
	t.Helper()
	kubeconfig := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: test
  user:
    token: %s
contexts:
- name: test
  context: {cluster: test, user: test}
current-context: test
`, s.URL, base64.StdEncoding.EncodeToString(s.CA), token)
	if err := os.WriteFile(path, []byte(kubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
}

// Log is the server's output so far.
func (s *Server) Log() string {
	data, _ := os.ReadFile(s.log)
	return string(data)
}

func freePort(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}
