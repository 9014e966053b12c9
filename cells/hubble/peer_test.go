package hubble

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/cilium/cilium/api/v1/observer"
	peerpb "github.com/cilium/cilium/api/v1/peer"
	"github.com/cilium/statedb"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/cellium/cellium/cells/nodes"
	"github.com/cellium/cellium/pkg/polltest"
)

// node is a node of the nodes table with the given addresses.
func node(name string, local bool, ips ...string) *nodes.Node {
	n := &nodes.Node{Name: name, Local: local, Source: nodes.SourceK8s}
	for _, ip := range ips {
		n.Addresses = append(n.Addresses, nodes.Address{Type: nodes.InternalIP, IP: netip.MustParseAddr(ip)})
	}
	return n
}

// peerEnv is a Peer service of a nodes table the test writes, served over
// a unix socket.
type peerEnv struct {
	t      *testing.T
	db     *statedb.DB
	nodes  statedb.RWTable[*nodes.Node]
	peer   *peerServer
	client peerpb.PeerClient
}

func newPeerEnv(t *testing.T, port int, initial ...*nodes.Node) *peerEnv {
	t.Helper()
	db := statedb.New()
	tbl, err := nodes.NewTable(db)
	if err != nil {
		t.Fatal(err)
	}
	e := &peerEnv{t: t, db: db, nodes: tbl, peer: newPeerServer(db, tbl)}
	e.peer.port.Store(uint32(port))
	e.upsert(initial...)
	conn, _ := serveWith(t, NewObserver(16, "node-1", time.Now), e.peer)
	e.client = peerpb.NewPeerClient(conn)
	return e
}

func (e *peerEnv) upsert(ns ...*nodes.Node) {
	txn := e.db.WriteTxn(e.nodes)
	for _, n := range ns {
		if _, _, err := e.nodes.Insert(txn, n); err != nil {
			e.t.Fatal(err)
		}
	}
	txn.Commit()
}

func (e *peerEnv) delete(n *nodes.Node) {
	txn := e.db.WriteTxn(e.nodes)
	if _, _, err := e.nodes.Delete(txn, n); err != nil {
		e.t.Fatal(err)
	}
	txn.Commit()
}

// notification is a ChangeNotification as "TYPE name address".
func notification(cn *peerpb.ChangeNotification) string {
	if cn.GetTls() != nil {
		return fmt.Sprintf("%s %s %s tls=%s", cn.GetType(), cn.GetName(), cn.GetAddress(), cn.GetTls().GetServerName())
	}
	return fmt.Sprintf("%s %s %s", cn.GetType(), cn.GetName(), cn.GetAddress())
}

// recv receives len(want) notifications from stream and fails unless they
// are want, in order.
func recv(t *testing.T, stream peerpb.Peer_NotifyClient, want ...string) {
	t.Helper()
	for i, w := range want {
		cn, err := stream.Recv()
		if err != nil {
			t.Fatalf("notification %d: %v, want %q", i, err, w)
		}
		if got := notification(cn); got != w {
			t.Fatalf("notification %d: %q, want %q", i, got, w)
		}
	}
}

// A Notify stream starts with every node that has an address, then
// follows the table: a node added, a node's new address, a node that
// loses its address, a node deleted. Nodes without address are never
// announced.
func TestPeerNotify(t *testing.T) {
	e := newPeerEnv(t, 4244,
		node("node-1", true, "10.90.0.11", "fd00:10:90::11"),
		node("node-2", false, "10.90.0.12"),
		node("node-v6", false, "fd00:10:90::14"),
		node("no-address", false),
	)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := e.client.Notify(ctx, &peerpb.NotifyRequest{})
	if err != nil {
		t.Fatal(err)
	}
	recv(t, stream,
		"PEER_ADDED node-1 10.90.0.11:4244",
		"PEER_ADDED node-2 10.90.0.12:4244",
		"PEER_ADDED node-v6 [fd00:10:90::14]:4244",
	)

	e.upsert(node("node-3", false, "10.90.0.13"))
	recv(t, stream, "PEER_ADDED node-3 10.90.0.13:4244")

	e.upsert(node("node-2", false, "10.90.0.22"))
	recv(t, stream, "PEER_UPDATED node-2 10.90.0.22:4244")

	// A change that leaves the address as it is is no news; the next
	// notification is the deletion.
	n3 := node("node-3", false, "10.90.0.13")
	n3.Problems = []string{"something"}
	e.upsert(n3)
	e.delete(n3)
	recv(t, stream, "PEER_DELETED node-3 10.90.0.13:4244")

	// A node that loses its address can no longer be dialled: deleted.
	e.upsert(node("node-v6", false))
	recv(t, stream, "PEER_DELETED node-v6 [fd00:10:90::14]:4244")

	// The node without address gets one: added.
	e.upsert(node("no-address", false, "10.90.0.15"))
	recv(t, stream, "PEER_ADDED no-address 10.90.0.15:4244")

	// A second client starts from the table as it is now.
	stream2, err := e.client.Notify(ctx, &peerpb.NotifyRequest{})
	if err != nil {
		t.Fatal(err)
	}
	recv(t, stream2,
		"PEER_ADDED no-address 10.90.0.15:4244",
		"PEER_ADDED node-1 10.90.0.11:4244",
		"PEER_ADDED node-2 10.90.0.22:4244",
	)
}

// A client that goes away ends its stream on the server: nothing keeps
// watching the table for it.
func TestPeerNotifyClientGone(t *testing.T) {
	e := newPeerEnv(t, 4244, node("node-1", true, "10.90.0.11"))
	var cancels []context.CancelFunc
	for range 3 {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		cancels = append(cancels, cancel)
		stream, err := e.client.Notify(ctx, &peerpb.NotifyRequest{})
		if err != nil {
			t.Fatal(err)
		}
		recv(t, stream, "PEER_ADDED node-1 10.90.0.11:4244")
	}
	if n := e.peer.streams.Load(); n != 3 {
		t.Fatalf("%d streams served, want 3", n)
	}
	for _, cancel := range cancels {
		cancel()
	}
	waitFor(t, "no stream served after the clients went", func() bool { return e.peer.streams.Load() == 0 })
	// Changes after that reach nobody and block nothing.
	e.upsert(node("node-2", false, "10.90.0.12"))
}

// Stopping the server ends the Notify streams, so that it stops at once.
func TestPeerNotifyEndsOnStop(t *testing.T) {
	db := statedb.New()
	tbl, err := nodes.NewTable(db)
	if err != nil {
		t.Fatal(err)
	}
	peer := newPeerServer(db, tbl)
	conn, srv := serveWith(t, NewObserver(16, "node-1", time.Now), peer)
	stream, err := peerpb.NewPeerClient(conn).Notify(context.Background(), &peerpb.NotifyRequest{})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the stream served", func() bool { return peer.streams.Load() == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	srv.stop(ctx)
	if ctx.Err() != nil {
		t.Fatal("the server's stop waited for the Notify stream until its deadline")
	}
	if _, err := stream.Recv(); err == nil {
		t.Fatal("the stream goes on after the server stopped")
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	polltest.Until(t, what, 10*time.Second, 10*time.Millisecond, func() (bool, string) { return cond(), "not yet" })
}

// The cell serves the Peer service beside the Observer on both of its
// listeners; the announced port is the TCP listener's.
func TestPeerServiceOfTheCell(t *testing.T) {
	e := newCellEnv(t, envOptions{
		config: func(c *Config) { c.HubbleTCPListenAddress, c.HubbleDisableTLS = "127.0.0.1:0", true },
		nodes:  []*nodes.Node{node("node-1", true, "10.90.0.11"), node("node-2", false, "10.90.0.12")},
	})
	tcp, ok := e.hubble.TCPAddress()
	if !ok || tcp.Network != "tcp" || strings.HasSuffix(tcp.Addr, ":0") {
		t.Fatalf("TCP address %v (%v), want the TCP listener's", tcp, ok)
	}
	_, port, _ := net.SplitHostPort(tcp.Addr)
	if fmt.Sprint(e.hubble.PeerPort()) != port {
		t.Fatalf("peer port %d, want the TCP listener's %s", e.hubble.PeerPort(), port)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, addr := range []Address{e.hubble.Address(), tcp} {
		conn, err := Dial(addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		stream, err := peerpb.NewPeerClient(conn).Notify(ctx, &peerpb.NotifyRequest{})
		if err != nil {
			t.Fatal(err)
		}
		recv(t, stream, "PEER_ADDED node-1 10.90.0.11:"+port, "PEER_ADDED node-2 10.90.0.12:"+port)
		for _, svc := range []string{ObserverService, PeerService} {
			resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
			if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
				t.Fatalf("health of %s on %s: %v %v, want SERVING", svc, addr, resp, err)
			}
		}
		if _, err := observer.NewObserverClient(conn).ServerStatus(ctx, &observer.ServerStatusRequest{}); err != nil {
			t.Fatalf("ServerStatus on %s: %v", addr, err)
		}
	}
	txn := e.db.WriteTxn(e.nodes)
	e.nodes.Delete(txn, node("node-2", false))
	txn.Commit()
	conn, err := Dial(tcp)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stream, err := peerpb.NewPeerClient(conn).Notify(ctx, &peerpb.NotifyRequest{})
	if err != nil {
		t.Fatal(err)
	}
	recv(t, stream, "PEER_ADDED node-1 10.90.0.11:"+port)
}

// --hubble-peer-port wins over the listener's port; without a TCP
// listener the default port is announced.
func TestPeerPortOfTheCell(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  func(*Config)
		want int
	}{
		{"unix socket only", func(*Config) {}, DefaultPeerPort},
		{"flag", func(c *Config) {
			c.HubbleTCPListenAddress, c.HubblePeerPort, c.HubbleDisableTLS = "127.0.0.1:0", 5000, true
		}, 5000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newCellEnv(t, envOptions{config: tc.cfg, noClient: true})
			if got := e.hubble.PeerPort(); got != tc.want {
				t.Fatalf("peer port %d, want %d", got, tc.want)
			}
		})
	}
}

func TestInvalidPeerConfig(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{HubbleBufferSize: 1, HubblePeerPort: -1}, "invalid --hubble-peer-port -1"},
		{Config{HubbleBufferSize: 1, HubblePeerPort: 65536}, "invalid --hubble-peer-port 65536"},
	} {
		if err := tc.cfg.validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("validate(%+v) = %v, want %q", tc.cfg, err, tc.want)
		}
	}
	for _, bad := range []string{"unix:///run/hubble.sock", "4244", "host.example:4244", ":http"} {
		_, err := Config{HubbleTCPListenAddress: bad}.tcpListenAddress()
		if want := fmt.Sprintf("invalid --hubble-tcp-listen-address %q: want host:port", bad); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("--hubble-tcp-listen-address %q: %v, want %q", bad, err, want)
		}
	}
	for _, good := range []string{":4244", "10.0.0.1:4244", "[fd00::1]:4244"} {
		if a, err := (Config{HubbleTCPListenAddress: good}).tcpListenAddress(); err != nil || a.Addr != good {
			t.Errorf("--hubble-tcp-listen-address %q: %v, %v", good, a, err)
		}
	}
}
