package hubble

import (
	"maps"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	peerpb "github.com/cilium/cilium/api/v1/peer"
	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/nodes"
)

// DefaultPeerPort is the port the Peer service announces for every node
// when neither --hubble-peer-port nor a TCP listener of this agent says
// otherwise: Hubble's own port.
const DefaultPeerPort = 4244

// PeerService is the Peer service's gRPC name, for the health service.
var PeerService = peerpb.Peer_ServiceDesc.ServiceName

// peerServer is the Hubble Peer service (peer.Peer/Notify), which
// hubble-relay asks for the cluster's Hubble servers: every node of the
// nodes table that has an address, as "<node-ip>:<port>" with the same
// port for every node, and the changes to that set. It is level
// triggered: each stream compares the table with what it has sent so far,
// so a burst of changes makes one round of notifications, and a stream
// never announces an address twice or a deletion of what it did not add.
type peerServer struct {
	peerpb.UnimplementedPeerServer

	db    *statedb.DB
	nodes statedb.Table[*nodes.Node]
	// port is set by the start hook, before the server serves: it may be
	// the port the TCP listener got.
	port atomic.Uint32
	// tls, set before the server serves, makes every announcement say
	// that the node's server speaks TLS, under the node's TLSServerName:
	// hubble-relay then dials it with TLS and checks that name.
	tls bool
	// done ends the Notify streams when the server stops.
	done     chan struct{}
	stopOnce sync.Once
	// streams counts the Notify streams being served.
	streams atomic.Int64
}

func newPeerServer(db *statedb.DB, tbl statedb.Table[*nodes.Node]) *peerServer {
	return &peerServer{db: db, nodes: tbl, done: make(chan struct{})}
}

// address is where a node's Hubble server is announced: its primary
// address (IPv4, else IPv6) and the peer port; "" for a node without
// address, which is not announced.
func (p *peerServer) address(n *nodes.Node) string {
	ip := n.PrimaryIP()
	if !ip.IsValid() {
		return ""
	}
	return net.JoinHostPort(ip.String(), strconv.Itoa(int(p.port.Load())))
}

// Notify sends PEER_ADDED for every node with an address, then
// PEER_ADDED, PEER_UPDATED (a new address) and PEER_DELETED (the node is
// gone or lost its address) as the nodes table changes, until the client
// goes or the server stops.
func (p *peerServer) Notify(_ *peerpb.NotifyRequest, stream peerpb.Peer_NotifyServer) error {
	p.streams.Add(1)
	defer p.streams.Add(-1)
	ctx := stream.Context()
	sent := map[string]string{}
	for {
		iter, watch := p.nodes.AllWatch(p.db.ReadTxn())
		want := map[string]string{}
		for n := range iter {
			if addr := p.address(n); addr != "" {
				want[n.Name] = addr
			}
		}
		for _, cn := range peerChanges(sent, want) {
			if p.tls {
				cn.Tls = &peerpb.TLS{ServerName: TLSServerName(cn.Name)}
			}
			if err := stream.Send(cn); err != nil {
				return err
			}
		}
		sent = want
		select {
		case <-ctx.Done():
			return nil
		case <-p.done:
			return nil
		case <-watch:
		}
	}
}

// peerChanges are the notifications that take a client from the peers
// in sent to those in want (name to address): deletions first, then
// additions and updates, each in name order.
func peerChanges(sent, want map[string]string) []*peerpb.ChangeNotification {
	var out []*peerpb.ChangeNotification
	for _, name := range slices.Sorted(maps.Keys(sent)) {
		if _, ok := want[name]; !ok {
			out = append(out, &peerpb.ChangeNotification{Name: name, Address: sent[name], Type: peerpb.ChangeNotificationType_PEER_DELETED})
		}
	}
	for _, name := range slices.Sorted(maps.Keys(want)) {
		addr := want[name]
		switch old, ok := sent[name]; {
		case !ok:
			out = append(out, &peerpb.ChangeNotification{Name: name, Address: addr, Type: peerpb.ChangeNotificationType_PEER_ADDED})
		case old != addr:
			out = append(out, &peerpb.ChangeNotification{Name: name, Address: addr, Type: peerpb.ChangeNotificationType_PEER_UPDATED})
		}
	}
	return out
}

// stop ends the Notify streams; stopping again does nothing.
func (p *peerServer) stop() { p.stopOnce.Do(func() { close(p.done) }) }
