package clusterhealth

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

// helloHandler answers the other nodes' HTTP probes.
func helloHandler(what string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /hello", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "cellium %s\n", what)
	})
	return mux
}

// serve serves /hello on ln until ctx ends. Every node address, and the
// health endpoint's, is reachable from outside: netlimit bounds what a
// client may hold there.
func serve(ctx context.Context, ln net.Listener, what string) error {
	srv := &http.Server{Handler: helloHandler(what)}
	netlimit.Default.Apply(srv)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(netlimit.Default.Listener(ln)) }()
	select {
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		srv.Shutdown(sctx)
		return nil
	case err := <-errc:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	}
}

// serveNode serves /hello on every address of the node.
func serveNode(ctx context.Context, health cell.Health, log *slog.Logger, port uint16, node string) error {
	ln, err := net.Listen("tcp", fmt.Sprintf(":%d", port))
	if err != nil {
		health.Degraded("Serving /hello", err)
		return fmt.Errorf("--cluster-health-port %d: %w", port, err)
	}
	log.Info("Serving /hello for the other nodes' probes", "addr", ln.Addr().String())
	health.OK(fmt.Sprintf("Serving /hello on %s", ln.Addr()))
	return serve(ctx, ln, "node "+node)
}
