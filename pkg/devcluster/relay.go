package devcluster

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"time"
)

// HubblePort is the port of every agent's Hubble TCP listener, on its
// node's IPv4 address (--hubble-tcp-listen-address): what its Peer
// service announces for every node and what hubble-relay dials.
const HubblePort = 4244

// RelayPort is where StartRelay's hubble-relay serves, on the bridge's
// gateway address: Hubble's relay port.
const RelayPort = 4245

// HubbleAddress is the agent's Hubble TCP listener, reachable from the
// bridge namespace and every node.
func (n Node) HubbleAddress() netip.AddrPort { return netip.AddrPortFrom(n.IPv4, HubblePort) }

// RelayAddress is where StartRelay's hubble-relay serves: in the bridge
// namespace, so a client runs there (nsenter --net=<BridgeNetNS>) or dials
// through DialBridge.
func (c *Cluster) RelayAddress() netip.AddrPort {
	return netip.AddrPortFrom(c.snapshot().Gateway4, RelayPort)
}

// BridgeNetNS is the path of the bridge's network namespace, where etcd
// and the relay run.
func (c *Cluster) BridgeNetNS() string { return c.snapshot().BridgeNetNS }

// DialBridge dials addr from the bridge namespace: the relay, etcd, or a
// node's address.
func (c *Cluster) DialBridge(ctx context.Context, network, addr string) (net.Conn, error) {
	return dialIn(ctx, c.snapshot().BridgeNetNS, network, addr)
}

// relayStopGrace is how long hubble-relay has after SIGTERM. v1.18.4
// stops serving at once but never stops its gRPC health server, so the
// process does not exit by itself; it keeps no state, so SIGKILL loses
// nothing.
const relayStopGrace = time.Second

func (s *state) relayLog() string { return filepath.Join(s.Dir, "hubble-relay.log") }

// StartRelay starts the upstream hubble-relay at binary in the bridge
// namespace, serving on RelayAddress without TLS, and returns once it
// accepts connections. It learns the nodes from the Peer service of the
// first node's agent (its HubbleAddress), dials every node's Hubble
// server without TLS and retries a lost one every second. Down stops it,
// and so does StopRelay; removing the first node takes its Peer service
// away, so restart the relay then.
func (c *Cluster) StartRelay(ctx context.Context, binary string) error {
	if err := executable("hubble-relay", binary); err != nil {
		return err
	}
	return c.update(func(s *state) error {
		if s.Relay.Alive() {
			return fmt.Errorf("hubble-relay runs already (pid %d)", s.Relay.PID)
		}
		if len(s.Nodes) == 0 {
			return fmt.Errorf("cluster %s has no node whose Peer service the relay could ask", s.Name)
		}
		listen := netip.AddrPortFrom(s.Gateway4, RelayPort)
		argv := []string{binary, "serve",
			"--peer-service", s.Nodes[0].HubbleAddress().String(),
			"--listen-address", listen.String(),
			"--health-listen-address", netip.AddrPortFrom(s.Gateway4, 4222).String(),
			"--disable-client-tls", "--disable-server-tls",
			"--retry-timeout", "1s",
			"--gops=false",
		}
		p, err := startDetached(s.BridgeNetNS, argv, s.relayLog(), c.stopWithCaller)
		if err != nil {
			return fmt.Errorf("hubble-relay: %w", err)
		}
		s.Relay = p
		if err := s.save(); err != nil {
			return err
		}
		start := time.Now()
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		for {
			if !p.Alive() {
				return fmt.Errorf("hubble-relay exited at start; the end of its log %s:\n%s", s.relayLog(), tail(s.relayLog(), 20))
			}
			conn, err := dialIn(ctx, s.BridgeNetNS, "tcp", listen.String())
			if err == nil {
				conn.Close()
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("hubble-relay does not accept connections on %s after %s; the end of its log %s:\n%s", listen, time.Since(start).Round(time.Second), s.relayLog(), tail(s.relayLog(), 20))
			case <-time.After(50 * time.Millisecond):
			}
		}
		c.log.Info("Started hubble-relay", "pid", p.PID, "address", listen, "peer-service", s.Nodes[0].HubbleAddress(), "log", s.relayLog())
		return nil
	})
}

// StopRelay stops StartRelay's hubble-relay, if it runs.
func (c *Cluster) StopRelay(ctx context.Context) error {
	return c.update(func(s *state) error {
		if err := s.Relay.stop(ctx, relayStopGrace); err != nil {
			return fmt.Errorf("stop hubble-relay: %w", err)
		}
		s.Relay = Process{}
		return nil
	})
}
