package unixhttp_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cellium/cellium/pkg/unixhttp"
)

// rawServer serves one connection on a unix socket with answer, which gets
// the request as the client wrote it (header and body), and returns the
// socket. The agent's own server is tested against the client in
// cells/api (TestUnixHTTPClient); this one writes what net/http would not.
func rawServer(t *testing.T, answer func(req *http.Request, body string, conn net.Conn)) string {
	t.Helper()
	socket := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		req, err := http.ReadRequest(bufio.NewReader(conn))
		if err != nil {
			t.Errorf("the client's request: %v", err)
			return
		}
		body, _ := io.ReadAll(req.Body)
		answer(req, string(body), conn)
	}()
	return socket
}

func TestRequestAndAnswers(t *testing.T) {
	for _, tc := range []struct {
		name, answer string
	}{
		{"content length", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 13\r\n\r\n{\"id\":\"gear\"}"},
		{"chunked with a trailer", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\n{\"id\"\r\n8\r\n:\"gear\"}\r\n0\r\nX-Trailer: 1\r\n\r\n"},
		{"until the connection closes", "HTTP/1.0 200 OK\nContent-Type: application/json\n\n{\"id\":\"gear\"}"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got struct{ method, path, contentType, body string }
			socket := rawServer(t, func(req *http.Request, body string, conn net.Conn) {
				got.method, got.path, got.contentType, got.body = req.Method, req.URL.Path, req.Header.Get("Content-Type"), body
				io.WriteString(conn, tc.answer)
			})
			var out struct{ ID string }
			if err := unixhttp.Do(context.Background(), socket, "PUT", "/v1/widgets/gear", map[string]string{"colour": "red"}, &out); err != nil {
				t.Fatal(err)
			}
			if out.ID != "gear" {
				t.Fatalf("decoded %+v, want id gear", out)
			}
			if got.method != "PUT" || got.path != "/v1/widgets/gear" || got.contentType != "application/json" || got.body != `{"colour":"red"}` {
				t.Fatalf("the server read %+v, want PUT /v1/widgets/gear with the JSON body", got)
			}
		})
	}
}

func TestErrors(t *testing.T) {
	t.Run("nothing on the socket", func(t *testing.T) {
		socket := filepath.Join(t.TempDir(), "agent.sock")
		err := unixhttp.Do(context.Background(), socket, "GET", "/v1/healthz", nil, nil)
		if ue, ok := errors.AsType[*unixhttp.UnreachableError](err); !ok || ue.Socket != socket || !strings.Contains(err.Error(), "cannot reach the agent at "+socket) {
			t.Fatalf("got %v, want an UnreachableError naming %s", err, socket)
		}
	})
	t.Run("the agent goes away before answering", func(t *testing.T) {
		socket := rawServer(t, func(*http.Request, string, net.Conn) {})
		err := unixhttp.Do(context.Background(), socket, "GET", "/v1/healthz", nil, nil)
		if _, ok := errors.AsType[*unixhttp.UnreachableError](err); !ok {
			t.Fatalf("got %v, want an UnreachableError", err)
		}
	})
	t.Run("no answer before the deadline", func(t *testing.T) {
		release := make(chan struct{})
		defer close(release)
		socket := rawServer(t, func(*http.Request, string, net.Conn) { <-release })
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		err := unixhttp.Do(ctx, socket, "GET", "/v1/healthz", nil, nil)
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "no answer from the agent at "+socket+" to GET /v1/healthz") {
			t.Fatalf("got %v, want no answer, the deadline exceeded", err)
		}
	})
	t.Run("cancelled while waiting", func(t *testing.T) {
		release := make(chan struct{})
		defer close(release)
		ctx, cancel := context.WithCancel(context.Background())
		socket := rawServer(t, func(*http.Request, string, net.Conn) { cancel(); <-release })
		err := unixhttp.Do(ctx, socket, "GET", "/v1/healthz", nil, nil)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("got %v, want context.Canceled", err)
		}
	})
	for _, tc := range []struct{ name, answer, want string }{
		{"not HTTP", "SSH-2.0-OpenSSH\r\n", `status line "SSH-2.0-OpenSSH"`},
		{"a length that is not a number", "HTTP/1.1 200 OK\r\nContent-Length: lots\r\n\r\n", `Content-Length "lots"`},
		{"an encoding it cannot read", "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", `Transfer-Encoding "gzip"`},
		{"a chunk size that is not hex", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", `chunk size "zz"`},
		{"a header line without a colon", "HTTP/1.1 200 OK\r\nnonsense\r\n\r\n", `header line "nonsense"`},
		{"a length over the bound", fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", unixhttp.MaxAnswer+1), fmt.Sprintf(`Content-Length "%d"`, unixhttp.MaxAnswer+1)},
		{"chunks over the bound", fmt.Sprintf("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n", unixhttp.MaxAnswer+1), fmt.Sprintf(`chunk size "%x"`, unixhttp.MaxAnswer+1)},
		{"more than 100 header lines", "HTTP/1.1 200 OK\r\n" + strings.Repeat("X-A: b\r\n", 101) + "\r\n", "more than 100 header lines"},
		{"a line that never ends", "HTTP/1.1 200 OK\r\nX-Long: " + strings.Repeat("a", 64<<10), "line longer than 64 KiB"},
		{"a body to the close over the bound", "HTTP/1.0 200 OK\r\n\r\n" + strings.Repeat("a", unixhttp.MaxAnswer+1), fmt.Sprintf("answer longer than %d bytes", unixhttp.MaxAnswer)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			socket := rawServer(t, func(_ *http.Request, _ string, conn net.Conn) { io.WriteString(conn, tc.answer) })
			err := unixhttp.Do(context.Background(), socket, "GET", "/v1/healthz", nil, nil)
			if err == nil || !strings.Contains(err.Error(), "answer of the agent at "+socket+" to GET /v1/healthz: malformed HTTP answer: "+tc.want) {
				t.Fatalf("got %v, want a malformed answer: %s", err, tc.want)
			}
		})
	}
	t.Run("a body cut short of its length", func(t *testing.T) {
		socket := rawServer(t, func(_ *http.Request, _ string, conn net.Conn) {
			io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Length: 13\r\n\r\n{\"id\"")
		})
		err := unixhttp.Do(context.Background(), socket, "GET", "/v1/healthz", nil, nil)
		if _, ok := errors.AsType[*unixhttp.UnreachableError](err); !ok || !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("got %v, want an UnreachableError: the agent went away mid-answer", err)
		}
	})
	// The agent sends no redirect; following one (as net/http does) or
	// taking it for success could report a DELETE done that was not.
	t.Run("a redirect", func(t *testing.T) {
		socket := rawServer(t, func(_ *http.Request, _ string, conn net.Conn) {
			io.WriteString(conn, "HTTP/1.1 301 Moved Permanently\r\nLocation: /v1/endpoints/x\r\nContent-Length: 0\r\n\r\n")
		})
		err := unixhttp.Do(context.Background(), socket, "DELETE", "/v1/endpoints/x/", nil, nil)
		if ae, ok := errors.AsType[*unixhttp.APIError](err); !ok || ae.Status != 301 {
			t.Fatalf("got %v, want an APIError with status 301", err)
		}
	})
	t.Run("an error answer that is not JSON", func(t *testing.T) {
		socket := rawServer(t, func(_ *http.Request, _ string, conn net.Conn) {
			io.WriteString(conn, "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 10\r\n\r\nrestoring\n")
		})
		err := unixhttp.Do(context.Background(), socket, "GET", "/v1/healthz", nil, nil)
		if ae, ok := errors.AsType[*unixhttp.APIError](err); !ok || ae.Status != 503 || err.Error() != "agent answered 503 Service Unavailable: restoring" {
			t.Fatalf("got %v, want the 503 with its body as the message", err)
		}
	})
}

// WithTrace has a call note when its request was written and its answer
// arrived.
func TestTrace(t *testing.T) {
	socket := rawServer(t, func(_ *http.Request, _ string, conn net.Conn) {
		io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
	})
	var tr unixhttp.Trace
	before := time.Now()
	if err := unixhttp.Do(unixhttp.WithTrace(context.Background(), &tr), socket, "GET", "/v1/healthz", nil, nil); err != nil {
		t.Fatal(err)
	}
	if tr.Sent.Before(before) || tr.Answered.Before(tr.Sent) || time.Now().Before(tr.Answered) {
		t.Fatalf("call at %v: sent %v, answered %v: want them in order within the call", before, tr.Sent, tr.Answered)
	}
}
