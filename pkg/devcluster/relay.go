package devcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/cellium/cellium/cells/hubble"
	"github.com/cellium/cellium/pkg/netnsrun"
	"github.com/cellium/cellium/pkg/tlsca"
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

// HubbleTLS are the PEM files of the cluster's Hubble mutual TLS, made
// by Up in the cluster's directory (hubble-tls/): a CA of the cluster's
// own, which signed every node's server certificate and the relay's
// client certificate. Every agent serves its TCP listener with its
// node's certificate and requires a client certificate of the CA;
// StartRelay's relay dials them with its own.
type HubbleTLS struct {
	// CA is the CA's certificate (ca.crt).
	CA string
	// RelayCert and RelayKey are hubble-relay's client certificate and
	// key (relay.crt, relay.key), good for any client of the agents,
	// such as `hubble observe --tls`.
	RelayCert, RelayKey string
	dir                 string
}

// NodeCert and NodeKey are node's server certificate and key
// (<node>.crt, <node>.key), for hubble.TLSServerName(node) and
// hubble.PeerTLSServerName.
func (f HubbleTLS) NodeCert(node string) string { return filepath.Join(f.dir, node+".crt") }
func (f HubbleTLS) NodeKey(node string) string  { return filepath.Join(f.dir, node+".key") }

func (s *state) hubbleTLS() HubbleTLS {
	dir := filepath.Join(s.Dir, "hubble-tls")
	return HubbleTLS{
		CA:        filepath.Join(dir, "ca.crt"),
		RelayCert: filepath.Join(dir, "relay.crt"),
		RelayKey:  filepath.Join(dir, "relay.key"),
		dir:       dir,
	}
}

// HubbleTLS are the files of the cluster's Hubble mutual TLS.
func (c *Cluster) HubbleTLS() HubbleTLS { return c.snapshot().hubbleTLS() }

// makeHubbleTLS makes the cluster's CA, a server certificate for every
// node and the relay's client certificate. The CA's key is not kept: the
// cluster's nodes are fixed at Up.
func makeHubbleTLS(s *state) error {
	f := s.hubbleTLS()
	if err := os.MkdirAll(f.dir, 0o700); err != nil {
		return err
	}
	ca, err := tlsca.New("cellium-dev " + s.Name + " hubble CA")
	if err != nil {
		return err
	}
	write := func(certFile, keyFile, name string, dnsNames []string, usage tlsca.Usage) error {
		cert, key, err := ca.Issue(name, dnsNames, usage)
		if err != nil {
			return err
		}
		return errors.Join(tlsca.WriteFile(certFile, cert), tlsca.WriteFile(keyFile, key))
	}
	for _, n := range s.Nodes {
		// Any node may answer the relay's Peer service.
		names := []string{hubble.TLSServerName(n.Name), hubble.PeerTLSServerName}
		if err := write(f.NodeCert(n.Name), f.NodeKey(n.Name), n.Name, names, tlsca.Server); err != nil {
			return fmt.Errorf("hubble TLS of node %s: %w", n.Name, err)
		}
	}
	if err := write(f.RelayCert, f.RelayKey, "hubble-relay", nil, tlsca.Client); err != nil {
		return fmt.Errorf("hubble TLS of the relay: %w", err)
	}
	return tlsca.WriteFile(f.CA, ca.CertPEM())
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
// server with mutual TLS (HubbleTLS: its client certificate, the
// cluster's CA) and retries a lost one every second. Down stops it,
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
		tls := s.hubbleTLS()
		argv := []string{binary, "serve",
			"--peer-service", s.Nodes[0].HubbleAddress().String(),
			"--listen-address", listen.String(),
			"--health-listen-address", netip.AddrPortFrom(s.Gateway4, 4222).String(),
			"--tls-hubble-client-cert-file", tls.RelayCert,
			"--tls-hubble-client-key-file", tls.RelayKey,
			"--tls-hubble-server-ca-files", tls.CA,
			// Its clients are in the bridge namespace only.
			"--disable-server-tls",
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

// dialIn dials addr from the network namespace at path.
func dialIn(ctx context.Context, path, network, addr string) (net.Conn, error) {
	return netnsrun.In(path, func() (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	})
}
