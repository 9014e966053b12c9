package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/cilium/hive/cell"

	"github.com/cellium/cellium/pkg/netlimit"
)

// HTTPServer serves a handler on a listener that its owner's start hook
// opened, and keeps the owner's health saying whether it serves. The API and
// the probe server are both one.
type HTTPServer struct {
	what   string
	log    *slog.Logger
	health cell.Health
	srv    *http.Server
}

// NewHTTPServer prepares a server; what names it in logs ("API").
func NewHTTPServer(what string, handler http.Handler, log *slog.Logger, health cell.Health) *HTTPServer {
	return &HTTPServer{
		what:   what,
		log:    log,
		health: health,
		srv: &http.Server{
			Handler:           handler,
			ReadHeaderTimeout: 10 * time.Second,
			ConnContext:       connAccepted,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		},
	}
}

// Serve serves on ln in the background until Shutdown.
func (s *HTTPServer) Serve(ln net.Listener) {
	addr := ln.Addr().String()
	s.log.Info("Serving "+s.what, "addr", addr)
	s.health.OK("Serving on " + addr)
	go func() {
		if err := s.srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			s.log.Error(s.what+" server failed", "error", err)
			s.health.Degraded(s.what+" server failed", err)
		}
	}()
}

// ServeTCP listens on addr, which --flag chose, and serves there in the
// background with netlimit.Default's bounds: a TCP address may be reachable
// from outside the node.
func (s *HTTPServer) ServeTCP(flag, addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("--%s %s: %w", flag, addr, err)
	}
	netlimit.Default.Apply(s.srv)
	s.Serve(netlimit.Default.Listener(ln))
	return nil
}

// Shutdown stops accepting, waits for requests in flight (until ctx ends)
// and closes the listener.
func (s *HTTPServer) Shutdown(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	s.health.Stopped("Stopped")
	return err
}
