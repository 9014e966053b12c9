package hubble

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/cilium/statedb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/cellium/cellium/cells/nodes"
	"github.com/cellium/cellium/pkg/netlimit"
	"github.com/cellium/cellium/pkg/netlimit/netlimittest"
)

// limitedServer serves an Observer on a loopback TCP listener capped and
// bounded by limits, as the cell serves its TCP addresses.
func limitedServer(t *testing.T, limits netlimit.Limits) string {
	t.Helper()
	db := statedb.New()
	tbl, err := nodes.NewTable(db)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := newGRPCServer(NewObserver(16, "node-1", time.Now), newPeerServer(db, tbl), nil, limits)
	s.serve([]net.Listener{limits.Listener(ln)}, nil, func(_ net.Listener, err error) { t.Errorf("serve: %v", err) })
	t.Cleanup(func() { s.stop(context.Background()) })
	return ln.Addr().String()
}

func checkHealth(ctx context.Context, addr string) error {
	conn, err := Dial(Address{Network: "tcp", Addr: addr})
	if err != nil {
		return err
	}
	defer conn.Close()
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: ObserverService})
	return err
}

// A connection that never finishes its handshake is closed, and no more
// connections than the cap are served at once.
func TestLimitsSilentConnectionsAndCap(t *testing.T) {
	limits := netlimit.Limits{ReadHeaderTimeout: 2 * time.Second, IdleTimeout: time.Minute, MaxHeaderBytes: 16 << 10, MaxConns: 2}
	addr := limitedServer(t, limits)

	held := []net.Conn{netlimittest.Dial(t, addr), netlimittest.Dial(t, addr)}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := checkHealth(ctx, addr); err == nil {
		t.Fatalf("a third connection was served with a cap of %d", limits.MaxConns)
	}
	// The held connections send nothing: each is closed once the handshake
	// timeout passes, which frees its slot.
	for _, c := range held {
		netlimittest.Closed(t, c, c, limits.ReadHeaderTimeout+5*time.Second)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := checkHealth(ctx, addr); err != nil {
		t.Fatalf("not served once the silent connections were closed: %v", err)
	}
}

// A client connection with no call in flight is closed by the server after
// the idle timeout.
func TestLimitsIdleConnectionClosed(t *testing.T) {
	limits := netlimit.Limits{ReadHeaderTimeout: 5 * time.Second, IdleTimeout: time.Second, MaxHeaderBytes: 16 << 10, MaxConns: 8}
	addr := limitedServer(t, limits)
	conn, err := Dial(Address{Network: "tcp", Addr: addr})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: ObserverService}, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}
	// The server's GOAWAY takes the client from READY to IDLE.
	for state := conn.GetState(); state == connectivity.Ready; state = conn.GetState() {
		if !conn.WaitForStateChange(ctx, state) {
			t.Fatalf("connection still %s after %s with no call, idle timeout %s", state, 10*time.Second, limits.IdleTimeout)
		}
	}
}
