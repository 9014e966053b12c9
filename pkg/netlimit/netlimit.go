// Package netlimit bounds what clients can hold on a server that others
// than the node itself can reach: how long a request may take to arrive,
// how long a kept-alive connection may sit idle, how large its header may
// be, and how many connections are served at once.
//
// Without them net/http keeps a connection for as long as the client
// likes: a kept-alive connection that sends nothing more, or a body that
// trickles in, holds a goroutine and its buffers forever (issue 25: 3,000
// idle connections to /hello doubled the agent's memory).
//
//	srv := &http.Server{Handler: h}
//	netlimit.Default.Apply(srv)
//	go srv.Serve(netlimit.Default.Listener(ln))
package netlimit

import (
	"net"
	"net/http"
	"time"

	"golang.org/x/net/netutil"
)

// Limits are one server's bounds. A zero duration or count means none.
type Limits struct {
	// ReadHeaderTimeout bounds the arrival of a request's header, counted
	// from the connection's start or the previous response.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds the arrival of a whole request, body included.
	ReadTimeout time.Duration
	// WriteTimeout bounds the writing of a response, from the end of the
	// request's header.
	WriteTimeout time.Duration
	// IdleTimeout closes a kept-alive connection that sends no next
	// request.
	IdleTimeout time.Duration
	// MaxHeaderBytes caps a request's header.
	MaxHeaderBytes int
	// MaxConns is how many connections are served at once; further ones
	// wait in the kernel's accept queue until one closes.
	MaxConns int
}

// Default are the limits of the agent's TCP servers: /hello, the probes,
// /metrics. A request to them is a GET of a few hundred bytes; the write
// timeout leaves room for a scrape of a large /metrics and for the default
// 30-second CPU profile of /debug/pprof/profile.
var Default = Limits{
	ReadHeaderTimeout: 5 * time.Second,
	ReadTimeout:       10 * time.Second,
	WriteTimeout:      time.Minute,
	IdleTimeout:       30 * time.Second,
	MaxHeaderBytes:    16 << 10,
	MaxConns:          256,
}

// Apply sets srv's timeouts and header cap.
func (l Limits) Apply(srv *http.Server) {
	srv.ReadHeaderTimeout = l.ReadHeaderTimeout
	srv.ReadTimeout = l.ReadTimeout
	srv.WriteTimeout = l.WriteTimeout
	srv.IdleTimeout = l.IdleTimeout
	srv.MaxHeaderBytes = l.MaxHeaderBytes
}

// Listener caps the connections accepted from ln at MaxConns.
func (l Limits) Listener(ln net.Listener) net.Listener {
	if l.MaxConns <= 0 {
		return ln
	}
	return netutil.LimitListener(ln, l.MaxConns)
}
