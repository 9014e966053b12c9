package api_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"

	"github.com/cellium/cellium/cells/api"
	"github.com/cellium/cellium/pkg/client"
)

// tick is what the test feed streams.
type tick struct {
	N       int    `json:"n"`
	Payload string `json:"payload,omitempty"`
}

// feed is a test cell's streaming routes. /v1/ticks?n=N streams N ticks,
// then waits for the client to go (or the agent to stop) and reports that
// on ended. /v1/flood streams one value far larger than any socket buffer,
// which blocks while the client does not read; writing says it is about to.
type feed struct {
	ended   chan error
	writing chan struct{}
}

func newFeed() *feed {
	return &feed{ended: make(chan error, 1), writing: make(chan struct{}, 1)}
}

func (f *feed) routes() api.Routes {
	return api.NewRoutes(
		api.Route{Method: http.MethodGet, Path: "/v1/ticks", Stream: func(r *http.Request, s *api.Stream) error {
			q, err := api.QueryParams(r, "n")
			if err != nil {
				return err
			}
			n, err := strconv.Atoi(q.Get("n"))
			if err != nil || n < 0 {
				return api.BadRequest("invalid n %q: want a number of ticks", q.Get("n"))
			}
			if err := s.Flush(); err != nil {
				return err
			}
			for i := range n {
				if err := s.Send(tick{N: i}); err != nil {
					return err
				}
			}
			if err := s.Flush(); err != nil {
				return err
			}
			<-r.Context().Done()
			f.ended <- r.Context().Err()
			return nil
		}},
		api.Route{Method: http.MethodGet, Path: "/v1/flood", Stream: func(r *http.Request, s *api.Stream) error {
			if err := s.Flush(); err != nil {
				return err
			}
			f.writing <- struct{}{}
			err := s.Send(tick{Payload: strings.Repeat("x", 32<<20)})
			if err == nil {
				err = s.Flush()
			}
			f.ended <- err
			return err
		}},
		api.Route{Method: http.MethodGet, Path: "/v1/stream-panic", Stream: func(*http.Request, *api.Stream) error {
			panic("stream bug")
		}},
	)
}

func startFeed(t *testing.T) (*feed, *client.Client, func() error) {
	f := newFeed()
	socket := filepath.Join(t.TempDir(), "agent.sock")
	h := newAPIHive(t, socket, cell.Module("feed", "Test streams", cell.Provide(f.routes)))
	log := hivetest.Logger(t)
	if err := h.Start(log, context.Background()); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() error {
		stopped = true
		return h.Stop(log, context.Background())
	}
	t.Cleanup(func() {
		if !stopped {
			stop()
		}
	})
	return f, client.New(socket), stop
}

func openTicks(t *testing.T, ctx context.Context, c *client.Client, n string) (*client.Stream[tick], error) {
	t.Helper()
	return client.OpenStream[tick](ctx, c, "/v1/ticks", url.Values{"n": {n}})
}

func TestStreamSendsValuesUntilTheClientGoes(t *testing.T) {
	f, c, _ := startFeed(t)
	s, err := openTicks(t, context.Background(), c, "3")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		v, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if v.N != i {
			t.Fatalf("tick %d: got %d", i, v.N)
		}
	}
	s.Close()
	if err := <-f.ended; !errors.Is(err, context.Canceled) {
		t.Fatalf("the handler's context after the client closed: %v, want canceled", err)
	}
}

func TestStreamCancelledByTheClientContext(t *testing.T) {
	f, c, _ := startFeed(t)
	ctx, cancel := context.WithCancel(context.Background())
	s, err := openTicks(t, ctx, c, "0")
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if _, err := s.Recv(); !errors.Is(err, context.Canceled) {
		t.Fatalf("Recv after cancel: %v, want the context's error", err)
	}
	if err := <-f.ended; !errors.Is(err, context.Canceled) {
		t.Fatalf("the handler's context after the client cancelled: %v", err)
	}
}

func TestStreamErrorBeforeStartIsAnErrorAnswer(t *testing.T) {
	_, c, _ := startFeed(t)
	_, err := openTicks(t, context.Background(), c, "many")
	wantAPIError(t, err, http.StatusBadRequest, `invalid n "many"`)
	_, err = client.OpenStream[tick](context.Background(), c, "/v1/ticks", url.Values{"n": {"1"}, "colour": {"red"}})
	wantAPIError(t, err, http.StatusBadRequest, `unknown query parameter "colour"`)
	_, err = client.OpenStream[tick](context.Background(), c, "/v1/stream-panic", nil)
	wantAPIError(t, err, http.StatusInternalServerError, "stream bug")
	if _, err := c.Healthz(context.Background()); err != nil {
		t.Fatalf("server after a panicking stream: %v", err)
	}
	_, err = client.OpenStream[tick](context.Background(), c, "/v1/config", nil)
	if err == nil || !strings.Contains(err.Error(), "not a stream") {
		t.Fatalf("stream from a plain route: %v, want an error saying it is not a stream", err)
	}
}

func TestStopEndsStreams(t *testing.T) {
	f, c, stop := startFeed(t)
	s, err := openTicks(t, context.Background(), c, "1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); err != nil {
		t.Fatal(err)
	}
	if err := stop(); err != nil {
		t.Fatalf("stop with a stream open: %v", err)
	}
	if err := <-f.ended; !errors.Is(err, context.Canceled) {
		t.Fatalf("the handler's context after stop: %v, want canceled", err)
	}
	if _, err := s.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("Recv after the agent stopped: %v, want io.EOF", err)
	}
}

// A client that stops reading blocks the handler's write; stopping the
// agent must fail that write rather than wait for the stop timeout.
func TestStopEndsAStreamBlockedOnAClientThatDoesNotRead(t *testing.T) {
	f, c, stop := startFeed(t)
	s, err := client.OpenStream[tick](context.Background(), c, "/v1/flood", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	<-f.writing
	if err := stop(); err != nil {
		t.Fatalf("stop with a blocked stream: %v", err)
	}
	if err := <-f.ended; err == nil {
		t.Fatal("the blocked write succeeded, want it failed by the stop")
	}
}

func TestRouteNeedsAHandlerOrAStream(t *testing.T) {
	for name, route := range map[string]api.Route{
		"neither": {Method: http.MethodGet, Path: "/v1/nothing"},
		"both": {Method: http.MethodGet, Path: "/v1/both",
			Handler: func(*http.Request) (any, error) { return nil, nil },
			Stream:  func(*http.Request, *api.Stream) error { return nil }},
	} {
		t.Run(name, func(t *testing.T) {
			h := newAPIHive(t, filepath.Join(t.TempDir(), "agent.sock"),
				cell.Module("bad", "Bad route", cell.Provide(func() api.Routes { return api.NewRoutes(route) })))
			err := h.Populate(hivetest.Logger(t))
			if err == nil || !strings.Contains(err.Error(), "want a Handler or a Stream") {
				t.Fatalf("populate: %v, want an error naming the route", err)
			}
		})
	}
}
