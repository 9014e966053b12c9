package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"path"
	"path/filepath"
	"runtime/debug"
	"strings"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/spf13/pflag"

	"github.com/cellium/cellium/pkg/apiv1"
	"github.com/cellium/cellium/pkg/flagcheck"
)

// Config is the api cell's configuration.
type Config struct {
	// APISocket is the unix socket the API is served on. Client commands
	// take the same flag to find the agent.
	APISocket string
}

// DefaultConfig is the api cell's default configuration.
var DefaultConfig = Config{APISocket: "/var/run/cellium/agent.sock"}

func (def Config) Flags(flags *pflag.FlagSet) {
	flags.String("api-socket", def.APISocket, "Unix socket of the agent's REST API")
}

type serverParams struct {
	cell.In

	Config    Config
	Log       *slog.Logger
	Lifecycle cell.Lifecycle
	Health    cell.Health
	Routes    []Route `group:"api-routes"`
}

// Server serves the API. It is provided so that tests and cells can ask
// where it listens; nothing needs to call it.
type Server struct {
	cfg  Config
	log  *slog.Logger
	mux  *http.ServeMux
	http *HTTPServer
	// streams ends when the server stops, and every stream with it: a
	// stream never ends on its own, so a graceful shutdown would wait for
	// it forever.
	streams     context.Context
	stopStreams context.CancelFunc
}

func newServer(p serverParams) (*Server, error) {
	if p.Config.APISocket == "" || !filepath.IsAbs(p.Config.APISocket) {
		return nil, fmt.Errorf("invalid --api-socket %q: must be an absolute path", p.Config.APISocket)
	}
	if err := flagcheck.Creatable(p.Config.APISocket); err != nil {
		return nil, fmt.Errorf("invalid --api-socket %q: %w", p.Config.APISocket, err)
	}
	s := &Server{cfg: p.Config, log: p.Log, mux: http.NewServeMux()}
	for _, route := range p.Routes {
		if err := s.register(route); err != nil {
			return nil, err
		}
	}
	s.http = NewHTTPServer("API", s, p.Log, p.Health)
	p.Lifecycle.Append(cell.Hook{OnStart: s.start, OnStop: s.stop})
	return s, nil
}

// register adds a route to the mux, turning ServeMux's panic on a
// conflicting pattern into an error that names both routes.
func (s *Server) register(route Route) (err error) {
	pattern := route.Method + " " + route.Path
	if (route.Handler == nil) == (route.Stream == nil) {
		return fmt.Errorf("api route %q: want a Handler or a Stream, one of the two", pattern)
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("api route %q: %v", pattern, r)
		}
	}()
	if route.Stream != nil {
		s.mux.Handle(pattern, s.adaptStream(route))
	} else {
		s.mux.Handle(pattern, s.adapt(route))
	}
	return nil
}

// SocketPath is where the server listens.
func (s *Server) SocketPath() string { return s.cfg.APISocket }

func (s *Server) start(cell.HookContext) error {
	ln, err := ListenUnix("api-socket", s.cfg.APISocket)
	if err != nil {
		return err
	}
	s.streams, s.stopStreams = context.WithCancel(context.Background())
	s.http.Serve(ln)
	return nil
}

func (s *Server) stop(ctx cell.HookContext) error {
	s.stopStreams()
	// Closing the listener unlinks the socket.
	return s.http.Shutdown(ctx)
}

// ServeHTTP answers requests that match no route with a JSON error, and hands
// the rest to the mux.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// ServeMux would redirect an unclean path ("/v1//health",
	// "/v1/x/../health") to its clean form; the API answers every error in
	// JSON with a 4xx instead, as it promises.
	if clean := cleanPath(r.URL.Path); clean != r.URL.Path {
		writeJSON(w, http.StatusBadRequest, apiv1.Error{Status: http.StatusBadRequest,
			Message: fmt.Sprintf("unclean path %q: ask for %q", r.URL.Path, clean)})
		return
	}
	h, pattern := s.mux.Handler(r)
	if pattern != "" {
		// Through the mux, not h, so that r.PathValue works.
		s.mux.ServeHTTP(w, r)
		return
	}
	// The mux knows whether it is a 404 or a 405 (and sets Allow): let it
	// decide the status, then answer in JSON.
	rec := &statusRecorder{header: w.Header()}
	h.ServeHTTP(rec, r)
	msg := fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path)
	if rec.status == http.StatusMethodNotAllowed {
		msg = fmt.Sprintf("method %s not allowed for %s (allowed: %s)", r.Method, r.URL.Path, w.Header().Get("Allow"))
	}
	writeJSON(w, rec.status, apiv1.Error{Status: rec.status, Message: msg})
}

// cleanPath is path.Clean keeping a trailing slash, the form ServeMux
// matches without redirecting.
func cleanPath(p string) string {
	if p == "" || p[0] != '/' {
		p = "/" + p
	}
	clean := path.Clean(p)
	if strings.HasSuffix(p, "/") && clean != "/" {
		clean += "/"
	}
	return clean
}

// adapt turns a HandlerFunc into an http.Handler: JSON encoding, errors,
// panics and request logging.
func (s *Server) adapt(route Route) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		status := http.StatusOK
		defer func() {
			if p := recover(); p != nil {
				s.log.Error("API handler panicked",
					"method", r.Method, "path", r.URL.Path, "panic", p, "stack", string(debug.Stack()))
				status = http.StatusInternalServerError
				writeJSON(w, status, apiv1.Error{Status: status, Message: fmt.Sprintf("internal error: %v", p)})
			}
			s.log.Debug("API request", "method", r.Method, "path", r.URL.Path,
				"status", status, "duration", time.Since(start))
		}()

		v, err := route.Handler(r.WithContext(withHandled(r.Context(), start)))
		if err != nil {
			status = statusOf(err)
			writeJSON(w, status, apiv1.Error{Status: status, Message: err.Error()})
			return
		}
		writeJSON(w, status, v)
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		status = http.StatusInternalServerError
		buf.Reset()
		json.NewEncoder(&buf).Encode(apiv1.Error{Status: status, Message: "encode response: " + err.Error()})
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(buf.Bytes())
}

// statusRecorder captures the status a handler writes and drops its body.
type statusRecorder struct {
	header http.Header
	status int
}

func (r *statusRecorder) Header() http.Header { return r.header }
func (r *statusRecorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return len(b), nil
}
func (r *statusRecorder) WriteHeader(status int) { r.status = status }
