package devcluster_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/cilium/api/v1/flow"
	"github.com/cilium/cilium/api/v1/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/cellium/cellium/cells/hubble"
	"github.com/cellium/cellium/pkg/devcluster"
	"github.com/cellium/cellium/pkg/devcluster/devclustertest"
	"github.com/cellium/cellium/pkg/hubblerelay"
	"github.com/cellium/cellium/pkg/polltest"
)

// TestHubbleRelay: every agent serves Hubble on its node's address only
// with mutual TLS; the upstream hubble-relay, told only of node-1's Peer
// service, connects to the Hubble server of every node with the client
// certificate the cluster made at Up; `hubble observe --server <relay>`
// shows the flows of pods on all three nodes with their identities and
// labels; a node removed from the cluster leaves the relay's nodes.
func TestHubbleRelay(t *testing.T) {
	relayBin, hubbleBin, err := hubblerelay.Binaries()
	if err != nil {
		t.Skip(err)
	}
	c := devclustertest.Start(t, devcluster.Options{Nodes: 3})
	for i, node := range []string{"node-1", "node-2", "node-3"} {
		name := fmt.Sprintf("p%d", i+1)
		c.AddPod(node, name, map[string]string{"app": name})
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()

	t.Run("an agent serves Hubble on its address only with mutual TLS", func(t *testing.T) {
		files := c.HubbleTLS()
		ca, err := os.ReadFile(files.CA)
		if err != nil {
			t.Fatal(err)
		}
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM(ca) {
			t.Fatalf("no certificate in %s", files.CA)
		}
		relayCert, err := tls.LoadX509KeyPair(files.RelayCert, files.RelayKey)
		if err != nil {
			t.Fatal(err)
		}
		node1 := c.Node("node-1")
		status := func(creds credentials.TransportCredentials) error {
			conn, err := grpc.NewClient("passthrough:///"+node1.HubbleAddress().String(),
				grpc.WithTransportCredentials(creds),
				grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
					return c.DialBridge(ctx, "tcp", addr)
				}))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			_, err = observer.NewObserverClient(conn).ServerStatus(ctx, &observer.ServerStatusRequest{})
			return err
		}
		withCerts := func(certs ...tls.Certificate) credentials.TransportCredentials {
			return credentials.NewTLS(&tls.Config{RootCAs: roots, ServerName: hubble.TLSServerName("node-1"), Certificates: certs, MinVersion: tls.VersionTLS13})
		}
		if err := status(insecure.NewCredentials()); err == nil {
			t.Errorf("node-1's Hubble at %s serves plaintext", node1.HubbleAddress())
		}
		if err := status(withCerts()); err == nil {
			t.Errorf("node-1's Hubble at %s serves a client without a certificate", node1.HubbleAddress())
		}
		if err := status(withCerts(relayCert)); err != nil {
			t.Errorf("node-1's Hubble at %s with the relay's certificate: %v", node1.HubbleAddress(), err)
		}
	})

	if err := c.StartRelay(ctx, relayBin); err != nil {
		t.Fatal(err)
	}
	if st := c.Status(ctx); st.Relay == nil || !st.Relay.Running || st.Relay.Address != c.RelayAddress().String() {
		t.Fatalf("status of the relay: %+v, want running on %s", st.Relay, c.RelayAddress())
	}

	conn, err := grpc.NewClient("passthrough:///"+c.RelayAddress().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return c.DialBridge(ctx, "tcp", addr)
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	relay := observer.NewObserverClient(conn)

	t.Run("the relay connects to every node", func(t *testing.T) {
		waitRelayNodes(ctx, t, relay, map[string]string{
			"node-1": "NODE_CONNECTED", "node-2": "NODE_CONNECTED", "node-3": "NODE_CONNECTED",
		})
	})

	// Each pod pings the pod of the next node: every node sees a flow
	// from one of its pods to a pod elsewhere, and one the other way.
	type hop struct{ node, src, dst string }
	hops := []hop{{"node-1", "p1", "p2"}, {"node-2", "p2", "p3"}, {"node-3", "p3", "p1"}}
	ids := map[string]uint32{}
	for _, node := range []string{"node-1", "node-2", "node-3"} {
		cl, err := c.Client(node)
		if err != nil {
			t.Fatal(err)
		}
		eps, err := cl.Endpoints(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, ep := range eps {
			if ep.PodName != "" {
				ids[ep.PodName] = ep.Identity
			}
		}
	}
	for _, p := range []string{"p1", "p2", "p3"} {
		if ids[p] < 256 {
			t.Fatalf("pod %s's identity %d: want a cluster identity (identities %v)", p, ids[p], ids)
		}
	}

	t.Run("hubble observe through the relay shows every node's flows with identities and labels", func(t *testing.T) {
		// hasFlow: a flow seen on node from pod src to pod dst, both
		// named by identity and labels.
		hasFlow := func(flows []*flow.Flow, node, src, dst string) bool {
			return slices.ContainsFunc(flows, func(f *flow.Flow) bool {
				return f.GetNodeName() == node &&
					f.GetSource().GetIdentity() == ids[src] && slices.Contains(f.GetSource().GetLabels(), "k8s:app="+src) &&
					f.GetDestination().GetIdentity() == ids[dst] && slices.Contains(f.GetDestination().GetLabels(), "k8s:app="+dst)
			})
		}
		polltest.Until(t, "every hop's flows, with identities and labels, through the relay", time.Minute, time.Second, func() (bool, string) {
			for _, h := range hops {
				c.Ping(h.src, c.Pod(h.dst).IPv4)
			}
			flows, out, err := hubbleObserve(ctx, c, hubbleBin, "--last", "2000", "--protocol", "icmp")
			if err != nil {
				t.Fatal(err)
			}
			var missing []string
			for _, h := range hops {
				// The sender's node sees src -> dst, the receiver's the
				// same flow arriving.
				if !hasFlow(flows, h.node, h.src, h.dst) {
					missing = append(missing, fmt.Sprintf("%s on %s", h.src+" -> "+h.dst, h.node))
				}
			}
			return len(missing) == 0, fmt.Sprintf("the relay's flows (%d) lack %v; hubble observe printed:\n%s", len(flows), missing, lastLines(out, 40))
		})

	})

	t.Run("a node removed from the cluster leaves the relay", func(t *testing.T) {
		c.RemoveNode("node-3")
		waitRelayNodes(ctx, t, relay, map[string]string{"node-1": "NODE_CONNECTED", "node-2": "NODE_CONNECTED"})
	})

	t.Run("StopRelay stops it", func(t *testing.T) {
		if err := c.StopRelay(ctx); err != nil {
			t.Fatal(err)
		}
		if st := c.Status(ctx); st.Relay != nil {
			t.Fatalf("status of a stopped relay: %+v, want none", st.Relay)
		}
		if conn, err := c.DialBridge(ctx, "tcp", c.RelayAddress().String()); err == nil {
			conn.Close()
			t.Fatalf("%s accepts connections after StopRelay", c.RelayAddress())
		}
	})
}

// waitRelayNodes polls the relay's GetNodes until its nodes and their
// states are want.
func waitRelayNodes(ctx context.Context, t *testing.T, relay observer.ObserverClient, want map[string]string) {
	t.Helper()
	polltest.Until(t, fmt.Sprintf("the relay's nodes %v", want), time.Minute, 200*time.Millisecond, func() (bool, string) {
		got, err := relayNodes(ctx, relay)
		return err == nil && maps.Equal(got, want), fmt.Sprintf("%v (%v)", got, err)
	})
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(len(lines)-n, 0):], "\n")
}

// relayNodes is the relay's GetNodes: node name to state.
func relayNodes(ctx context.Context, cl observer.ObserverClient) (map[string]string, error) {
	resp, err := cl.GetNodes(ctx, &observer.GetNodesRequest{})
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, n := range resp.GetNodes() {
		out[n.GetName()] = n.GetState().String()
	}
	return out, nil
}

// hubbleObserve is `hubble observe --server <relay> -o jsonpb` run in the
// bridge namespace, where the relay serves.
func hubbleObserve(ctx context.Context, c *devclustertest.Cluster, hubbleBin string, args ...string) ([]*flow.Flow, string, error) {
	argv := append([]string{"--net=" + c.BridgeNetNS(), hubbleBin, "observe", "--server", c.RelayAddress().String(), "-o", "jsonpb"}, args...)
	out, err := exec.CommandContext(ctx, "nsenter", argv...).CombinedOutput()
	if err != nil {
		return nil, string(out), fmt.Errorf("nsenter %s: %w\n%s", strings.Join(argv, " "), err, out)
	}
	return parseFlows(out), string(out), nil
}
