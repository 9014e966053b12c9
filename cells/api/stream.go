package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"runtime/debug"
	"time"

	"github.com/cellium/cellium/pkg/apiv1"
)

// StreamFunc answers a request with a stream of JSON values, one per line
// (Content-Type application/x-ndjson), for as long as it runs: a live feed
// such as GET /v1/monitor.
//
// It checks the request first: an error it returns before it has sent
// anything is answered like a [HandlerFunc]'s error, with its status. Once
// it has sent or flushed, the answer is a 200 and an error it returns is
// logged and ends the stream.
//
// It must return once r.Context() is done, which happens when the client
// goes away or the agent stops. A write to a client that went away fails;
// when the agent stops, so does a write blocked on a client that stopped
// reading.
type StreamFunc func(r *http.Request, s *Stream) error

// Stream writes the answer of a [StreamFunc].
type Stream struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	enc     *json.Encoder
	started bool
}

// NDJSON is the content type of a stream.
const NDJSON = "application/x-ndjson"

func (s *Stream) start() {
	if s.started {
		return
	}
	s.started = true
	s.w.Header().Set("Content-Type", NDJSON)
	s.w.WriteHeader(http.StatusOK)
}

// Send writes v as one line. Lines are buffered: a client sees them after
// Flush, or once the buffer fills.
func (s *Stream) Send(v any) error {
	s.start()
	return s.enc.Encode(v)
}

// Flush sends what is buffered, and the status if nothing was sent yet: a
// StreamFunc flushes once it is ready, so that the client knows the stream
// has begun, and whenever it has nothing more to send for now.
func (s *Stream) Flush() error {
	s.start()
	return s.rc.Flush()
}

// streamStopGrace is how long a stream has to end when the agent stops: a
// client that reads gets the stream's end, one that does not is cut off.
const streamStopGrace = time.Second

// adaptStream turns a StreamFunc into an http.Handler: status, errors,
// panics, logging, and the end of every stream when the agent stops.
func (s *Server) adaptStream(route Route) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		st := &Stream{w: w, rc: http.NewResponseController(w), enc: json.NewEncoder(w)}

		ctx, cancel := context.WithCancel(r.Context())
		defer cancel()
		// The deadline fails a write that blocks on a client that does not
		// read, so that stopping never waits for one.
		interrupted := make(chan struct{})
		stopInterrupt := context.AfterFunc(s.streams, func() {
			defer close(interrupted)
			cancel()
			st.rc.SetWriteDeadline(time.Now().Add(streamStopGrace))
		})
		defer func() {
			// The ResponseController must not outlive the handler.
			if !stopInterrupt() {
				<-interrupted
			}
		}()

		defer func() {
			if p := recover(); p != nil {
				s.log.Error("API stream handler panicked",
					"method", r.Method, "path", r.URL.Path, "panic", p, "stack", string(debug.Stack()))
				if !st.started {
					status := http.StatusInternalServerError
					writeJSON(w, status, apiv1.Error{Status: status, Message: fmt.Sprintf("internal error: %v", p)})
				}
			}
		}()

		err := route.Stream(r.WithContext(ctx), st)
		switch {
		case err != nil && !st.started:
			status := statusOf(err)
			writeJSON(w, status, apiv1.Error{Status: status, Message: err.Error()})
		case err != nil && ctx.Err() == nil:
			s.log.Warn("API stream ended by an error", "method", r.Method, "path", r.URL.Path, "error", err)
		default:
			st.Flush()
		}
		s.log.Debug("API stream", "method", r.Method, "path", r.URL.Path, "duration", time.Since(start))
	})
}
