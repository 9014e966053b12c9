// Package etcdtest runs a real etcd server for tests: Debian's etcd-server
// binary (`etcd` on the PATH, or $ETCD_BIN), on loopback ports of its own,
// with its data in the test's temporary directory. A test that finds no
// etcd binary skips, naming what to install.
//
// The server can be stopped and started again on the same ports and data,
// which is how tests take etcd away from a running agent and give it back.
package etcdtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Server is one etcd server process.
type Server struct {
	t      testing.TB
	bin    string
	dir    string
	client string // http://127.0.0.1:port, https with TLS
	// name is the member's name, unique to this server: the health check
	// asks who answers, so another etcd that holds the port is not taken
	// for this one.
	name    string
	peer    string
	tls     *TLSFiles
	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{}
	logFile *os.File
}

// Binary is the etcd binary tests use, or an error saying how to get one.
func Binary() (string, error) {
	if bin := os.Getenv("ETCD_BIN"); bin != "" {
		return bin, nil
	}
	bin, err := exec.LookPath("etcd")
	if err != nil {
		return "", fmt.Errorf("no etcd binary on the PATH (install Debian's etcd-server, or set ETCD_BIN)")
	}
	return bin, nil
}

// Start starts an etcd server for t and stops it at cleanup. It skips t
// when there is no etcd binary.
func Start(t testing.TB) *Server { return start(t, t.TempDir(), nil) }

// StartInMemory is Start with the data directory on a tmpfs (/dev/shm),
// where etcd's fsyncs cost nothing: for benchmarks that load a large
// store first and measure what reads it. It is Start where /dev/shm is not
// a tmpfs.
func StartInMemory(t testing.TB) *Server {
	t.Helper()
	return StartInMemoryWith(t, InMemoryOptions{})
}

// InMemoryOptions are StartInMemoryWith's.
type InMemoryOptions struct {
	// Binary is the etcd to run; Binary() when empty.
	Binary string
	// Data is a data directory to start from (saved by SaveData): the
	// server starts on a copy of it, with its keys, under a name and on
	// ports of its own. Empty is an empty store.
	Data string
}

// StartInMemoryWith is StartInMemory with the binary and the data that o
// names.
func StartInMemoryWith(t testing.TB, o InMemoryOptions) *Server {
	t.Helper()
	var st unix.Statfs_t
	dir := ""
	if unix.Statfs("/dev/shm", &st) == nil && st.Type == unix.TMPFS_MAGIC {
		var err error
		if dir, err = os.MkdirTemp("/dev/shm", "etcdtest-"); err != nil {
			t.Fatal(err)
		}
		// Registered before start's own cleanup, which stops etcd, so it
		// runs after it.
		t.Cleanup(func() { os.RemoveAll(dir) })
	} else {
		dir = t.TempDir()
	}
	if o.Data != "" {
		if err := copyDir(o.Data, filepath.Join(dir, "data")); err != nil {
			t.Fatalf("etcd data from %s: %v", o.Data, err)
		}
	}
	return startBinary(t, o.Binary, dir, nil)
}

// SaveData copies the stopped server's data directory to dst (which must
// not exist), for StartInMemoryWith's Data.
func (s *Server) SaveData(dst string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return errors.New("etcdtest: SaveData of a running server (Stop it first)")
	}
	return copyDir(filepath.Join(s.dir, "data"), dst)
}

// copyDir copies the directory src to dst (which must not exist), with
// its files' modes.
func copyDir(src, dst string) error {
	if _, err := os.Stat(dst); err == nil {
		return fmt.Errorf("copy %s: %s exists", src, dst)
	}
	if out, err := exec.Command("cp", "-a", src, dst).CombinedOutput(); err != nil {
		return fmt.Errorf("cp -a %s %s: %v: %s", src, dst, err, out)
	}
	return nil
}

// StartTLS is Start with a client URL served over TLS from files, which
// requires client certificates signed by files.CA. The files are read at
// each (re)start: a test rotates the server's certificates by writing new
// ones and calling Restart.
func StartTLS(t testing.TB, files TLSFiles) *Server { return start(t, t.TempDir(), &files) }

func start(t testing.TB, dir string, tlsFiles *TLSFiles) *Server {
	t.Helper()
	return startBinary(t, "", dir, tlsFiles)
}

// startBinary starts bin (Binary() when empty) on dir, whose data
// subdirectory may hold a store already.
func startBinary(t testing.TB, bin, dir string, tlsFiles *TLSFiles) *Server {
	t.Helper()
	if bin == "" {
		var err error
		if bin, err = Binary(); err != nil {
			t.Skip(err)
		}
	}
	scheme := "http://"
	if tlsFiles != nil {
		scheme = "https://"
	}
	s := &Server{
		t:      t,
		bin:    bin,
		dir:    dir,
		client: scheme + freeAddr(t),
		peer:   "http://" + freeAddr(t),
		tls:    tlsFiles,
		name:   fmt.Sprintf("etcdtest-%016x", rand.Uint64()),
	}
	t.Cleanup(func() {
		s.Stop()
		if t.Failed() {
			t.Logf("the test failed; etcd's log:\n%s", s.Log())
		}
	})
	// A port free when chosen may be taken before etcd binds it (by a
	// test running beside, or an outgoing connection): then etcd exits at
	// once, and the first start tries other ports. A restart keeps its
	// ports, which clients were given. A store given to start from
	// (StartInMemoryWith) is kept: it serves on any ports.
	_, err := os.Stat(filepath.Join(dir, "data"))
	given := err == nil
	for attempt := 1; ; attempt++ {
		err := s.launch()
		if err == nil {
			break
		}
		if !errors.Is(err, errPortTaken) || attempt == maxStartAttempts {
			t.Fatal(err)
		}
		t.Logf("etcd's port was taken (attempt %d of %d), trying others", attempt, maxStartAttempts)
		if !given {
			if err := os.RemoveAll(filepath.Join(s.dir, "data")); err != nil {
				t.Fatal(err)
			}
		}
		s.client, s.peer = scheme+freeAddr(t), "http://"+freeAddr(t)
	}
	return s
}

const maxStartAttempts = 5

// errPortTaken is etcd exiting at start because one of its ports was taken.
var errPortTaken = errors.New("etcd's port is taken")

// freeAddr is a loopback address with a port nobody listens on now, chosen
// at random below the kernel's usual ephemeral range (32768-60999), from
// which listeners on port 0 and outgoing connections take theirs.
func freeAddr(t testing.TB) string {
	t.Helper()
	for range 100 {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", 20000+rand.IntN(12768)))
		if err == nil {
			l.Close()
			return l.Addr().String()
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("find a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().String()
}

// Endpoint is the client URL, http://127.0.0.1:port.
func (s *Server) Endpoint() string { return s.client }

// PID is the server's process id (its CPU time is in /proc/PID), 0 while
// it is stopped.
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Restart starts the server if it is stopped, on the same ports and data,
// and waits until it answers its health check.
func (s *Server) Restart() {
	s.t.Helper()
	if err := s.launch(); err != nil {
		s.t.Fatal(err)
	}
}

// launch starts the server if it is stopped and waits until it answers its
// health check. It returns errPortTaken (wrapped, with etcd's log) when
// etcd exits at start because a port is taken.
func (s *Server) launch() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return nil
	}
	log, err := os.OpenFile(filepath.Join(s.dir, "etcd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("etcd log: %w", err)
	}
	args := []string{
		"--name", s.name,
		"--data-dir", filepath.Join(s.dir, "data"),
		"--listen-client-urls", s.client,
		"--advertise-client-urls", s.client,
		"--listen-peer-urls", s.peer,
		"--initial-advertise-peer-urls", s.peer,
		"--initial-cluster", s.name + "=" + s.peer,
		"--heartbeat-interval", "50",
		"--election-timeout", "500",
	}
	if s.tls != nil {
		args = append(args, "--cert-file", s.tls.Cert, "--key-file", s.tls.Key,
			"--trusted-ca-file", s.tls.CA, "--client-cert-auth")
	}
	cmd := exec.Command(s.bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	// etcd dies with the test process. The kernel sends Pdeathsig when the
	// thread that forked the child exits, not the process: the fork runs on
	// a thread locked to a goroutine that lives as long as etcd does, or
	// etcd would be killed when the Go runtime retires that thread (as it
	// does after a goroutine that entered a netns ends locked).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	started, exited := make(chan error), make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		err := cmd.Start()
		started <- err
		if err == nil {
			cmd.Wait()
			close(exited)
		}
	}()
	if err := <-started; err != nil {
		log.Close()
		return fmt.Errorf("start etcd: %w", err)
	}
	s.cmd, s.exited, s.logFile = cmd, exited, log

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		select {
		case <-exited:
		default:
			if s.healthy(ctx) {
				return nil
			}
		}
		select {
		case <-exited:
			log.Close()
			s.cmd = nil
			if strings.Contains(s.Log(), "address already in use") {
				return fmt.Errorf("%w; its log: %s", errPortTaken, s.Log())
			}
			return fmt.Errorf("etcd exited at start; its log: %s", s.Log())
		case <-ctx.Done():
			return fmt.Errorf("etcd not healthy after 30s; its log: %s", s.Log())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// healthy says whether this server, and not another etcd that holds its
// port, answers its health check within a second (whoever else holds a
// taken port may never answer); with TLS it presents the server's own
// certificate, which is also a client one.
func (s *Server) healthy(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	hc := http.DefaultClient
	if s.tls != nil {
		cfg, err := s.tls.ClientConfig()
		if err != nil {
			return false
		}
		// A test may give the server a certificate for another host (to
		// see a client refuse it); which server answers is checked by
		// its member name below.
		cfg.InsecureSkipVerify = true
		hc = &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}
		defer hc.CloseIdleConnections()
	}
	if resp, err := s.call(ctx, hc, http.MethodGet, "/health", nil); err != nil || resp.StatusCode != http.StatusOK {
		return false
	}
	name, err := s.answering(ctx, hc)
	return err == nil && name == s.name
}

// answering is the name of the member that answers on the client URL,
// from etcd's member list (the JSON gateway of its v3 API).
func (s *Server) answering(ctx context.Context, hc *http.Client) (string, error) {
	resp, err := s.call(ctx, hc, http.MethodPost, "/v3/cluster/member/list", strings.NewReader("{}"))
	if err != nil {
		return "", err
	}
	var list struct {
		Header struct {
			MemberID string `json:"member_id"`
		} `json:"header"`
		Members []struct {
			ID   string `json:"ID"`
			Name string `json:"name"`
		} `json:"members"`
	}
	if err := json.Unmarshal(resp.Body, &list); err != nil {
		return "", fmt.Errorf("member list from %s: %w", s.client, err)
	}
	for _, m := range list.Members {
		if m.ID == list.Header.MemberID {
			return m.Name, nil
		}
	}
	return "", fmt.Errorf("member list from %s does not name the member answering (%s)", s.client, list.Header.MemberID)
}

// RangeRequests is how many Range calls (reads) the server has answered,
// from its own metrics: what a test counts to see how many requests a
// listing took. Servers with TLS are not asked.
func (s *Server) RangeRequests() (int, error) {
	if s.tls != nil {
		return 0, errors.New("RangeRequests: not for a server with TLS")
	}
	resp, err := s.call(context.Background(), http.DefaultClient, http.MethodGet, "/metrics", nil)
	if err != nil {
		return 0, err
	}
	n := 0
	for line := range strings.Lines(string(resp.Body)) {
		if !strings.HasPrefix(line, "grpc_server_handled_total{") || !strings.Contains(line, `grpc_method="Range"`) {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("metrics of %s: %q: %w", s.client, line, err)
		}
		n += int(v)
	}
	return n, nil
}

type response struct {
	StatusCode int
	Body       []byte
}

func (s *Server) call(ctx context.Context, hc *http.Client, method, path string, body io.Reader) (*response, error) {
	req, err := http.NewRequestWithContext(ctx, method, s.client+path, body)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	return &response{StatusCode: resp.StatusCode, Body: b}, nil
}

// Stop stops the server (SIGKILL: as a crash would) and waits for it to exit.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Kill()
	<-s.exited
	s.logFile.Close()
	s.cmd = nil
}

// Wipe stops the server and removes its data: the next Restart starts an
// empty store on the same ports, as an etcd rebuilt or restored would be
// to its clients.
func (s *Server) Wipe() {
	s.t.Helper()
	s.Stop()
	if err := os.RemoveAll(filepath.Join(s.dir, "data")); err != nil {
		s.t.Fatal(err)
	}
}

// Log is what the server has logged so far.
func (s *Server) Log() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "etcd.log"))
	return string(b)
}
