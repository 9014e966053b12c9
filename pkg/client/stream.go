package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"

	"github.com/cellium/cellium/pkg/unixhttp"
)

// Stream is an open streaming answer of the agent: JSON values, one per
// line, read one at a time with Recv. It lasts until its context ends,
// Close, or the agent ends it.
type Stream[T any] struct {
	what string
	ctx  context.Context
	body io.ReadCloser
	dec  *json.Decoder
}

// streamType is the content type of a streaming answer (api.NDJSON).
const streamType = "application/x-ndjson"

// OpenStream sends a GET to a streaming route (see api.StreamFunc) and
// returns once the agent has begun the stream, so that whatever the stream
// reports from then on reaches the caller. Typed methods such as
// [Client.Monitor] wrap it.
func OpenStream[T any](ctx context.Context, c *Client, path string, query url.Values) (*Stream[T], error) {
	u := url.URL{Scheme: "http", Host: "agent", Path: path, RawQuery: query.Encode()}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", streamType)
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, unixhttp.NoAnswer(c.socket, http.MethodGet, path, ctx.Err())
		}
		return nil, &UnreachableError{Socket: c.socket, Err: unwrapURLError(err)}
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		defer resp.Body.Close()
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return nil, unixhttp.AnswerError(resp.StatusCode, http.StatusText(resp.StatusCode), raw)
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != streamType {
		resp.Body.Close()
		return nil, fmt.Errorf("GET %s: the agent answered %s, not a stream: is it older than this client?", path, resp.Header.Get("Content-Type"))
	}
	return &Stream[T]{what: "GET " + path, ctx: ctx, body: resp.Body, dec: json.NewDecoder(resp.Body)}, nil
}

// Recv waits for the next value. It returns io.EOF when the agent ended
// the stream (it stopped), and the context's error once that ends.
func (s *Stream[T]) Recv() (T, error) {
	var v T
	err := s.dec.Decode(&v)
	switch {
	case err == nil:
		return v, nil
	case s.ctx.Err() != nil:
		return v, s.ctx.Err()
	case errors.Is(err, io.EOF):
		return v, io.EOF
	}
	return v, fmt.Errorf("read stream of %s: %w", s.what, err)
}

// Close ends the stream; the agent sees the client go.
func (s *Stream[T]) Close() error { return s.body.Close() }
