// Package netlimittest checks from outside that a server on a TCP address
// enforces netlimit's bounds, for the tests of each server that uses them.
package netlimittest

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// notServed is how long a request may go unanswered before the test
// takes it as not served: a loopback server answers a GET in microseconds.
const notServed = 300 * time.Millisecond

// Request sends a GET of path on conn, keeping the connection alive.
func Request(t testing.TB, conn net.Conn, path string) {
	t.Helper()
	if _, err := io.WriteString(conn, "GET "+path+" HTTP/1.1\r\nHost: test\r\n\r\n"); err != nil {
		t.Fatalf("send GET %s: %v", path, err)
	}
}

// Response reads one response from r, failing the test if none arrives
// within timeout.
func Response(t testing.TB, conn net.Conn, r *bufio.Reader, timeout time.Duration) *http.Response {
	t.Helper()
	conn.SetReadDeadline(time.Now().Add(timeout))
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatalf("read response on %s: %v", conn.LocalAddr(), err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// Closed waits until the server closes conn (a read returns EOF or an
// error), failing the test if it is still open after timeout. What the
// server sends before closing (a 408, say) is read and ignored.
func Closed(t testing.TB, conn net.Conn, r io.Reader, timeout time.Duration) {
	t.Helper()
	conn.SetReadDeadline(time.Now().Add(timeout))
	if _, err := io.Copy(io.Discard, r); errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("connection %s still open after %s", conn.LocalAddr(), timeout)
	}
}

// Dial connects to addr and closes the connection when the test ends.
func Dial(t testing.TB, addr string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// HeaderCapped checks that addr answers a GET of path whose header exceeds
// maxHeaderBytes (plus the 4 KiB net/http allows beyond it) with 431.
func HeaderCapped(t testing.TB, addr, path string, maxHeaderBytes int) {
	t.Helper()
	conn := Dial(t, addr)
	big := strings.Repeat("x", maxHeaderBytes+8<<10)
	go io.WriteString(conn, "GET "+path+" HTTP/1.1\r\nHost: test\r\nX-Big: "+big+"\r\n\r\n")
	resp := Response(t, conn, bufio.NewReader(conn), 10*time.Second)
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("GET %s with a %d-byte header: status %d, want %d", path, len(big), resp.StatusCode, http.StatusRequestHeaderFieldsTooLarge)
	}
}

// ConnCapped checks that addr serves at most maxConns connections at once:
// with maxConns open (and sending nothing), a GET of path on one more is
// not answered, and is once they close. Any status counts as an answer.
func ConnCapped(t testing.TB, addr, path string, maxConns int) {
	t.Helper()
	held := make([]net.Conn, maxConns)
	for i := range held {
		held[i] = Dial(t, addr)
	}
	// One request answered on the first shows the server accepts, and that
	// the connections before the extra one are in.
	r0 := bufio.NewReader(held[0])
	Request(t, held[0], path)
	Response(t, held[0], r0, 10*time.Second)

	extra := Dial(t, addr)
	Request(t, extra, path)
	r := bufio.NewReader(extra)
	extra.SetReadDeadline(time.Now().Add(notServed))
	if _, err := r.Peek(1); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("connection %d of a cap of %d was served (read: %v)", maxConns+1, maxConns, err)
	}
	for _, c := range held {
		c.Close()
	}
	Response(t, extra, r, 10*time.Second)
}
