// Package unixhttp is a small HTTP/1.1 client of the agent's REST API over
// its unix socket, without net/http: one request per connection, a JSON
// body in, a JSON answer out. The CNI plugin uses it: it runs once per
// pod, often a hundred at once, and net/http (with crypto/tls and x509,
// which it links whether or not it speaks TLS, and its transport's
// goroutines) made the plugin twice the size and cost it a fifth more CPU
// per ADD (docs/performance.md, "CNI ADD"). pkg/client, which the agent's
// client commands use, shares its error types.
//
//	var ep apiv1.Endpoint
//	err := unixhttp.Do(ctx, "/var/run/cellium/agent.sock", "PUT", "/v1/endpoints/container-id:3f2a", req, &ep)
//
// An agent that does not answer is an [*UnreachableError] naming the
// socket; an error answer is an [*APIError] with its status and the
// agent's message; a context that ends first is an error wrapping the
// context's error.
package unixhttp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/cellium/cellium/pkg/apiv1"
)

// DialTimeout bounds connecting to the socket, so that a dead agent fails
// fast whatever the request's own deadline.
const DialTimeout = 5 * time.Second

// MaxAnswer bounds an answer's body.
const MaxAnswer = 64 << 20

// UnreachableError is returned when nothing answers on the socket.
type UnreachableError struct {
	Socket string
	Err    error
}

func (e *UnreachableError) Error() string {
	return fmt.Sprintf("cannot reach the agent at %s (is the agent running, and is this its API socket?): %v", e.Socket, e.Err)
}

func (e *UnreachableError) Unwrap() error { return e.Err }

// APIError is an error answer from the agent.
type APIError struct {
	Status int
	// StatusText is the status line's reason ("Not Found").
	StatusText string
	Message    string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("agent answered %d %s: %s", e.Status, e.StatusText, e.Message)
}

// AnswerError is the error of an answer with status, reason and body raw:
// nil for a 2xx, else an [*APIError] whose message is the agent's (the
// body's apiv1.Error) or, when the body is not one, the body itself. A
// redirect is an error too: the agent sends none, and following one could
// report a DELETE done that was not.
func AnswerError(status int, reason string, raw []byte) error {
	if status >= 200 && status <= 299 {
		return nil
	}
	var apiErr apiv1.Error
	if json.Unmarshal(raw, &apiErr) != nil || apiErr.Message == "" {
		apiErr.Message = string(bytes.TrimSpace(raw))
	}
	return &APIError{Status: status, StatusText: reason, Message: apiErr.Message}
}

// Trace holds the times of a call's phases, for a caller that measures
// them ([WithTrace]).
type Trace struct {
	// Sent: the request is written on the connection.
	Sent time.Time
	// Answered: the answer's status line has arrived.
	Answered time.Time
}

type traceKey struct{}

// WithTrace has the calls made with the context it returns fill in t.
func WithTrace(ctx context.Context, t *Trace) context.Context {
	return context.WithValue(ctx, traceKey{}, t)
}

// Do sends method path to the agent on socket, with in (if not nil) as its
// JSON body, and decodes a 2xx answer into out (if not nil); any other
// status is an [*APIError]. path is escaped already.
func Do(ctx context.Context, socket, method, path string, in, out any) error {
	var body []byte
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("encode request: %w", err)
		}
		body = b
	}
	d := net.Dialer{Timeout: DialTimeout}
	conn, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		if ctx.Err() != nil {
			return NoAnswer(socket, method, path, ctx.Err())
		}
		return &UnreachableError{Socket: socket, Err: err}
	}
	defer conn.Close()
	if deadline, ok := ctx.Deadline(); ok {
		conn.SetDeadline(deadline)
	}
	// A context cancelled without a deadline ends the exchange too.
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	trace, _ := ctx.Value(traceKey{}).(*Trace)
	if trace == nil {
		trace = new(Trace)
	}
	status, reason, raw, err := exchange(conn, method, path, body, trace)
	if err != nil {
		if ctx.Err() != nil || errors.Is(err, os.ErrDeadlineExceeded) {
			cause := ctx.Err()
			if cause == nil {
				cause = context.DeadlineExceeded
			}
			return NoAnswer(socket, method, path, cause)
		}
		if errors.Is(err, errMalformed) {
			return fmt.Errorf("answer of the agent at %s to %s %s: %w", socket, method, path, err)
		}
		// The agent went away mid-request.
		return &UnreachableError{Socket: socket, Err: err}
	}
	return DecodeAnswer(method, path, status, reason, raw, out)
}

// DecodeAnswer is the outcome of method path answered with status,
// reason and body raw: the answer's error ([AnswerError]), else raw
// decoded into out (if not nil).
func DecodeAnswer(method, path string, status int, reason string, raw []byte, out any) error {
	if err := AnswerError(status, reason, raw); err != nil {
		return err
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("decode answer to %s %s: %w", method, path, err)
	}
	return nil
}

// NoAnswer is the error of a call to the agent at socket that ended,
// with err, before an answer came.
func NoAnswer(socket, method, path string, err error) error {
	return fmt.Errorf("no answer from the agent at %s to %s %s: %w", socket, method, path, err)
}

// errMalformed marks an answer that is not HTTP/1.1 as this client reads it.
var errMalformed = errors.New("malformed HTTP answer")

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errMalformed, fmt.Sprintf(format, args...))
}

// exchange writes the request on conn and reads the answer: its status,
// reason and body.
func exchange(conn net.Conn, method, path string, body []byte, trace *Trace) (int, string, []byte, error) {
	var req bytes.Buffer
	req.Grow(256 + len(body))
	fmt.Fprintf(&req, "%s %s HTTP/1.1\r\nHost: agent\r\nUser-Agent: cellium-unixhttp\r\nConnection: close\r\n", method, path)
	if body != nil {
		fmt.Fprintf(&req, "Content-Type: application/json\r\nContent-Length: %d\r\n", len(body))
	}
	req.WriteString("\r\n")
	req.Write(body)
	if _, err := conn.Write(req.Bytes()); err != nil {
		return 0, "", nil, err
	}
	trace.Sent = time.Now()
	r := bufio.NewReaderSize(conn, maxLine)
	status, reason, err := readStatus(r)
	if err != nil {
		return 0, "", nil, err
	}
	trace.Answered = time.Now()
	length, chunked, err := readHeader(r)
	if err != nil {
		return 0, "", nil, err
	}
	var raw []byte
	switch {
	case chunked:
		raw, err = readChunked(r)
	case length >= 0:
		raw = make([]byte, length)
		_, err = io.ReadFull(r, raw)
	default:
		// Neither: the body ends with the connection.
		raw, err = io.ReadAll(io.LimitReader(r, MaxAnswer+1))
		if err == nil && len(raw) > MaxAnswer {
			err = malformed("answer longer than %d bytes", MaxAnswer)
		}
	}
	if err != nil {
		return 0, "", nil, err
	}
	return status, reason, raw, nil
}

// maxLine bounds a status, header or chunk-size line: the reader's buffer,
// so that a peer that never ends a line is refused once it fills it.
const maxLine = 64 << 10

// readLine reads a CRLF- (or LF-) terminated line without its end.
func readLine(r *bufio.Reader) (string, error) {
	line, err := r.ReadSlice('\n')
	switch {
	case err == bufio.ErrBufferFull:
		return "", malformed("line longer than %d KiB", maxLine>>10)
	case err == io.EOF:
		return "", io.ErrUnexpectedEOF
	case err != nil:
		return "", err
	}
	return strings.TrimSuffix(strings.TrimSuffix(string(line), "\n"), "\r"), nil
}

// readStatus reads the status line, "HTTP/1.1 404 Not Found".
func readStatus(r *bufio.Reader) (int, string, error) {
	line, err := readLine(r)
	if err != nil {
		return 0, "", err
	}
	proto, rest, _ := strings.Cut(line, " ")
	code, reason, _ := strings.Cut(rest, " ")
	status, err := strconv.Atoi(code)
	if !strings.HasPrefix(proto, "HTTP/1.") || err != nil || len(code) != 3 || status < 200 {
		return 0, "", malformed("status line %q", line)
	}
	return status, reason, nil
}

// readHeader reads the header up to its empty line: the body's length (-1
// if unsaid) and whether it is chunked.
func readHeader(r *bufio.Reader) (length int, chunked bool, err error) {
	length = -1
	for n := 0; ; n++ {
		line, err := readLine(r)
		if err != nil {
			return 0, false, err
		}
		if line == "" {
			return length, chunked, nil
		}
		if n == 100 {
			return 0, false, malformed("more than 100 header lines")
		}
		name, value, ok := strings.Cut(line, ":")
		if !ok {
			return 0, false, malformed("header line %q", line)
		}
		value = strings.TrimSpace(value)
		switch strings.ToLower(name) {
		case "content-length":
			n, err := strconv.Atoi(value)
			if err != nil || n < 0 || n > MaxAnswer {
				return 0, false, malformed("Content-Length %q", value)
			}
			length = n
		case "transfer-encoding":
			if !strings.EqualFold(value, "chunked") {
				return 0, false, malformed("Transfer-Encoding %q", value)
			}
			chunked = true
		}
	}
}

// readChunked reads a chunked body and its trailer.
func readChunked(r *bufio.Reader) ([]byte, error) {
	var body []byte
	for {
		line, err := readLine(r)
		if err != nil {
			return nil, err
		}
		sizeText, _, _ := strings.Cut(line, ";")
		size, err := strconv.ParseUint(strings.TrimSpace(sizeText), 16, 32)
		if err != nil || len(body)+int(size) > MaxAnswer {
			return nil, malformed("chunk size %q", line)
		}
		if size == 0 {
			break
		}
		start := len(body)
		body = append(body, make([]byte, size)...)
		if _, err := io.ReadFull(r, body[start:]); err != nil {
			return nil, err
		}
		if end, err := readLine(r); err != nil || end != "" {
			if err == nil {
				err = malformed("chunk of %d bytes not followed by CRLF", size)
			}
			return nil, err
		}
	}
	// The trailer, to its empty line.
	for {
		line, err := readLine(r)
		if err != nil {
			return nil, err
		}
		if line == "" {
			return body, nil
		}
	}
}
