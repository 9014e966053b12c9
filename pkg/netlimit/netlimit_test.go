package netlimit_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/cellium/cellium/pkg/netlimit"
	"github.com/cellium/cellium/pkg/netlimit/netlimittest"
)

// serve serves a handler that reads the request's body on a loopback
// listener with limits l, and returns its address.
func serve(t *testing.T, l netlimit.Limits) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
		}
	})}
	l.Apply(srv)
	go srv.Serve(l.Listener(ln))
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// Short enough for a test, long enough that a loopback request never
// meets them by accident.
var short = netlimit.Limits{
	ReadHeaderTimeout: 2 * time.Second,
	ReadTimeout:       time.Second,
	WriteTimeout:      5 * time.Second,
	IdleTimeout:       time.Second,
	MaxHeaderBytes:    1 << 10,
	MaxConns:          4,
}

// A kept-alive connection that sends no second request is closed after
// the idle timeout.
func TestIdleConnectionClosed(t *testing.T) {
	addr := serve(t, short)
	conns := make([]net.Conn, short.MaxConns)
	readers := make([]*bufio.Reader, len(conns))
	for i := range conns {
		conns[i] = netlimittest.Dial(t, addr)
		readers[i] = bufio.NewReader(conns[i])
		netlimittest.Request(t, conns[i], "/")
		netlimittest.Response(t, conns[i], readers[i], 5*time.Second)
	}
	for i := range conns {
		netlimittest.Closed(t, conns[i], readers[i], short.IdleTimeout+5*time.Second)
	}
}

// A body that stops arriving is cut at the read timeout: the connection
// closes, though the client never finishes.
func TestSlowBodyCut(t *testing.T) {
	addr := serve(t, short)
	conn := netlimittest.Dial(t, addr)
	if _, err := io.WriteString(conn, "POST / HTTP/1.1\r\nHost: test\r\nContent-Length: 100\r\n\r\nabc"); err != nil {
		t.Fatal(err)
	}
	netlimittest.Closed(t, conn, conn, short.ReadTimeout+5*time.Second)
}

// A connection that never sends a header is closed too.
func TestSilentConnectionClosed(t *testing.T) {
	addr := serve(t, short)
	conn := netlimittest.Dial(t, addr)
	netlimittest.Closed(t, conn, conn, short.ReadHeaderTimeout+5*time.Second)
}

func TestConnectionsCapped(t *testing.T) {
	netlimittest.ConnCapped(t, serve(t, short), "/", short.MaxConns)
}

func TestHeaderCapped(t *testing.T) {
	netlimittest.HeaderCapped(t, serve(t, short), "/", short.MaxHeaderBytes)
}
