package devcluster

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cellium/cellium/pkg/apiv1"
	"github.com/cellium/cellium/pkg/client"
	"github.com/cellium/cellium/pkg/netnsrun"
)

// healthPort is every agent's probe port. Each agent listens in its own
// namespace, so the port repeats without clashing.
const healthPort = "9879"

// agentFlags are the flags of node n's agent, for `agent run` and for
// `agent cleanup` alike: everything that would collide between agents on
// one machine gets a value of the node's own, and Kubernetes, IPAM and the
// kvstore are the cluster's. The cluster's AgentArgs come last, so they
// override these.
func agentFlags(s *state, n Node) []string {
	tls := s.hubbleTLS()
	// The cluster's shared state: etcd and each agent's embedded API
	// server of the manifests directory, or the kube-apiserver alone.
	shared := []string{
		"--kvstore", "etcd",
		"--kvstore-opt", "etcd.address=" + s.etcdURL(),
		"--k8s-mode", "embedded",
		"--k8s-manifests-dir", s.manifestsDir(),
	}
	if s.crd() {
		shared = []string{
			"--k8s-mode", "kubeconfig",
			"--kubeconfig", s.agentKubeconfig(),
			"--identity-allocation-mode", "crd",
		}
	}
	return slices.Concat(shared, []string{
		"--node-name", n.Name,
		"--node-ip", n.IPv4.String() + "," + n.IPv6.String(),
		"--routing-mode", s.RoutingMode,
		"--state-dir", n.StateDir(),
		"--run-dir", n.RunDir(),
		"--api-socket", n.APISocket,
		"--health-addr", ":" + healthPort,
		"--bpf-root", s.BPFRoot,
		"--bpf-map-prefix", n.BPFPrefix,
		"--cgroup-root", n.Cgroup,
		"--cni-conf-dir", n.CNIConfDir(),
		"--hubble-listen-address", "unix://" + n.HubbleSocket(),
		"--hubble-tcp-listen-address", n.HubbleAddress().String(),
		"--hubble-tls-cert-file", tls.NodeCert(n.Name),
		"--hubble-tls-key-file", tls.NodeKey(n.Name),
		"--hubble-tls-client-ca-files", tls.CA,
		"--ipam", "kubernetes",
		"--log-format", "text",
		// An eighth of the default sizes: the maps are preallocated kernel
		// memory (some 300 MB per agent at the defaults), and a cluster on
		// one machine carries little traffic.
		"--conntrack-tcp-max", "65536",
		"--conntrack-any-max", "32768",
		"--lb-sock-revnat-map-max", "32768",
	}, s.AgentArgs)
}

// startAgent starts n's agent in its namespace and records its PID;
// extraArgs come after the node's flags, for this start only.
func (c *Cluster) startAgent(s *state, n *Node, extraArgs ...string) error {
	if n.Agent.Alive() {
		return fmt.Errorf("node %s: its agent runs already (pid %d)", n.Name, n.Agent.PID)
	}
	argv := slices.Concat([]string{s.AgentBinary, "run"}, agentFlags(s, *n), extraArgs)
	p, err := startDetached(n.NetNS, argv, n.Log(), c.stopWithCaller)
	if err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	n.Agent = p
	c.log.Info("Started agent", "node", n.Name, "pid", p.PID, "log", n.Log())
	return s.save()
}

// waitReady waits until every node's agent says it is ready, and fails for
// the first that exits or is not ready in time, naming its node and the end
// of its log.
func (c *Cluster) waitReady(ctx context.Context, nodes ...Node) error {
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() { errs[i] = c.waitAgentReady(ctx, n) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (c *Cluster) waitAgentReady(ctx context.Context, n Node) error {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, c.readyTimeout)
	defer cancel()
	cl := client.New(n.APISocket)
	var last string
	for {
		if !n.Agent.Alive() {
			return fmt.Errorf("node %s: the agent (pid %d) exited; the end of its log %s:\n%s", n.Name, n.Agent.PID, n.Log(), tail(n.Log(), 20))
		}
		h, err := cl.Healthz(ctx)
		switch {
		case err == nil && h.Ready:
			c.log.Info("Agent ready", "node", n.Name, "duration", time.Since(start).Round(time.Millisecond))
			return nil
		case err == nil:
			last = "waiting for " + strings.Join(h.Pending, ", ")
		default:
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("node %s: the agent is not ready after %s (%s); the end of its log %s:\n%s",
				n.Name, time.Since(start).Round(time.Second), last, n.Log(), tail(n.Log(), 20))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Client is a client of node's agent, over its API socket.
func (c *Cluster) Client(node string) (*client.Client, error) {
	n, err := c.Node(node)
	if err != nil {
		return nil, err
	}
	return client.New(n.APISocket), nil
}

// KillAgent kills node's agent with SIGKILL, as a crash would, and returns
// once it is gone. What it left in the kernel (pinned maps and programs,
// routes) stays, as it does when a real agent dies.
func (c *Cluster) KillAgent(ctx context.Context, node string) error {
	return c.update(func(s *state) error {
		n, err := s.node(node)
		if err != nil {
			return err
		}
		if err := n.Agent.kill(ctx); err != nil {
			return fmt.Errorf("node %s: kill agent: %w", n.Name, err)
		}
		c.log.Info("Killed agent", "node", n.Name, "pid", n.Agent.PID)
		return nil
	})
}

// WaitAgentExit waits until node's agent exits by itself (a test fault
// point that kills it, say), as long as ctx allows; it sends no signal.
func (c *Cluster) WaitAgentExit(ctx context.Context, node string) error {
	n, err := c.Node(node)
	if err != nil {
		return err
	}
	if !n.Agent.waitGone(ctx) {
		return fmt.Errorf("node %s: the agent (pid %d) still runs: %w", node, n.Agent.PID, ctx.Err())
	}
	c.log.Info("Agent exited", "node", n.Name, "pid", n.Agent.PID)
	return nil
}

// StopAgent stops node's agent with SIGTERM (SIGKILL after 10s) and
// returns once it is gone.
func (c *Cluster) StopAgent(ctx context.Context, node string) error {
	return c.update(func(s *state) error {
		n, err := s.node(node)
		if err != nil {
			return err
		}
		if err := n.Agent.stop(ctx, stopGrace); err != nil {
			return fmt.Errorf("node %s: stop agent: %w", n.Name, err)
		}
		c.log.Info("Stopped agent", "node", n.Name, "pid", n.Agent.PID)
		return nil
	})
}

// StartAgent starts node's agent, which must not run, and waits until it
// is ready. extraArgs are flags for this start only, after the node's and
// the cluster's (a test's fault point, say).
func (c *Cluster) StartAgent(ctx context.Context, node string, extraArgs ...string) error {
	var n Node
	err := c.update(func(s *state) error {
		np, err := s.node(node)
		if err != nil {
			return err
		}
		if err := c.startAgent(s, np, extraArgs...); err != nil {
			return err
		}
		n = *np
		return nil
	})
	if err != nil {
		return err
	}
	return c.waitReady(ctx, n)
}

// RestartAgent stops node's agent (SIGTERM), starts it again and waits
// until it is ready.
func (c *Cluster) RestartAgent(ctx context.Context, node string) error {
	if err := c.StopAgent(ctx, node); err != nil {
		return err
	}
	return c.StartAgent(ctx, node)
}

// RemoveNode takes a node out of the cluster: its pods (CNI DEL while its
// agent runs, so the agent withdraws them), its agent
// (stopped, then `agent cleanup`), its Node manifest, its namespace (and so
// its link to the bridge), its cgroup, pins and directory. The other agents
// see the Node deleted.
func (c *Cluster) RemoveNode(ctx context.Context, node string) error {
	return c.update(func(s *state) error {
		n, err := s.node(node)
		if err != nil {
			return err
		}
		var errs []error
		var podIPs []netip.Addr
		kept := s.Pods[:0]
		for _, p := range s.Pods {
			if p.Node == n.Name {
				podIPs = append(podIPs, p.IPv4, p.IPv6)
			}
			if p.Node != n.Name {
				kept = append(kept, p)
				continue
			}
			// With its agent dead, a DEL could not be answered, and the
			// node's endpoints and addresses go with the node anyway.
			if err := removePod(s, p, !n.Agent.Alive()); err != nil {
				errs = append(errs, err)
				kept = append(kept, p)
			}
		}
		s.Pods = kept
		if err := s.removeManifest(nodeManifest(n.Name)); err != nil {
			errs = append(errs, err)
		}
		errs = append(errs, c.removeNode(ctx, s, *n)...)
		// Its agent is gone: the keys it published would otherwise stay
		// until their lease ends (--kvstore-lease-ttl), and the node with
		// them.
		keys := []string{"cellium/state/nodes/v1/" + n.Name}
		for _, ip := range podIPs {
			if ip.IsValid() {
				keys = append(keys, "cellium/state/ip/v1/"+ip.String())
			}
		}
		if s.crd() {
			// No kvstore keys; its pods' CelliumEndpoint objects went
			// with their CNI DEL, unless its agent was dead: then they
			// go here at once (no controller manager runs here to take
			// them with their Pods; the agents' identity-gc would after
			// two rounds without the Node).
			keys = nil
			if err := s.kubeDeleteNodeEndpoints(n.Name); err != nil {
				errs = append(errs, fmt.Errorf("node %s: %w", n.Name, err))
			}
		}
		if err := c.etcdDelete(ctx, s, keys...); err != nil {
			errs = append(errs, fmt.Errorf("node %s: delete its kvstore keys: %w", n.Name, err))
		}
		if err := errors.Join(errs...); err != nil {
			return fmt.Errorf("remove node %s: %w", n.Name, err)
		}
		s.Nodes = slices.DeleteFunc(s.Nodes, func(m Node) bool { return m.Name == node })
		c.log.Info("Removed node", "node", node)
		return nil
	})
}

// removeNode stops n's agent and removes what the node is made of:
// pins (through `agent cleanup`), namespace, cgroup, directory.
func (c *Cluster) removeNode(ctx context.Context, s *state, n Node) []error {
	var errs []error
	if err := n.Agent.stop(ctx, stopGrace); err != nil {
		errs = append(errs, fmt.Errorf("node %s: stop agent: %w", n.Name, err))
	}
	if err := c.cleanupPins(ctx, s, n); err != nil {
		errs = append(errs, fmt.Errorf("node %s: %w", n.Name, err))
	}
	if err := netnsrun.Remove(n.NetNS); err != nil {
		errs = append(errs, err)
	}
	if err := removeCgroup(ctx, n.Cgroup); err != nil {
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		if err := os.RemoveAll(n.Dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// cleanupPins runs `agent cleanup` with the node's flags, which detaches
// the agent's programs and removes its pins, in the node's namespace if it
// is still there; what it leaves in the pin directory is removed after.
func (c *Cluster) cleanupPins(ctx context.Context, s *state, n Node) error {
	pinDir := filepath.Join(s.BPFRoot, n.BPFPrefix)
	if _, err := os.Stat(pinDir); err != nil {
		return nil
	}
	argv := append([]string{s.AgentBinary, "cleanup"}, agentFlags(s, n)...)
	run := func() (string, error) {
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		cmd.Env = environ()
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	var out string
	var err error
	if netnsrun.Exists(n.NetNS) {
		out, err = netnsrun.In(n.NetNS, run)
	} else {
		// In this process's namespace: its nftables are not the node's
		// (which went with the node's namespace), so leave them alone.
		argv = append(argv, "--enable-masquerade=false")
		out, err = run()
	}
	if err != nil {
		c.log.Warn("agent cleanup failed; removing the pin directory", "node", n.Name, "error", err, "output", strings.TrimSpace(out))
	}
	if err := os.RemoveAll(pinDir); err != nil {
		return fmt.Errorf("remove BPF pin directory: %w", err)
	}
	return nil
}

// startEtcd starts etcd in the bridge namespace and waits until it is
// healthy.
func (c *Cluster) startEtcd(ctx context.Context, s *state) error {
	peer := "http://" + net.JoinHostPort(s.Gateway4.String(), "2380")
	argv := []string{s.EtcdBinary,
		"--name", s.Name,
		"--data-dir", filepath.Join(s.Dir, "etcd"),
		"--listen-client-urls", s.etcdURL(),
		"--advertise-client-urls", s.etcdURL(),
		"--listen-peer-urls", peer,
		"--initial-advertise-peer-urls", peer,
		"--initial-cluster", s.Name + "=" + peer,
	}
	p, err := startDetached(s.BridgeNetNS, argv, s.etcdLog(), c.stopWithCaller)
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	s.Etcd = p
	if err := s.save(); err != nil {
		return err
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for !c.etcdHealthy(ctx, s) {
		if !p.Alive() {
			return fmt.Errorf("etcd exited at start; the end of its log %s:\n%s", s.etcdLog(), tail(s.etcdLog(), 20))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("etcd is not healthy after %s; the end of its log %s:\n%s", time.Since(start).Round(time.Second), s.etcdLog(), tail(s.etcdLog(), 20))
		case <-time.After(50 * time.Millisecond):
		}
	}
	c.log.Info("Started etcd", "pid", p.PID, "url", s.etcdURL(), "duration", time.Since(start).Round(time.Millisecond))
	return nil
}

// etcdDelete deletes keys through etcd's JSON gateway, from the bridge
// namespace.
func (c *Cluster) etcdDelete(ctx context.Context, s *state, keys ...string) error {
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		return dialIn(ctx, s.BridgeNetNS, network, addr)
	}}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for _, k := range keys {
		body, _ := json.Marshal(map[string]string{"key": base64.StdEncoding.EncodeToString([]byte(k))})
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.etcdURL()+"/v3/kv/deleterange", bytes.NewReader(body))
		if err != nil {
			return err
		}
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("delete %s: etcd answered %s", k, resp.Status)
		}
	}
	return nil
}

// etcdHealthy asks etcd's /health from the bridge namespace.
func (c *Cluster) etcdHealthy(ctx context.Context, s *state) bool {
	if !netnsrun.Exists(s.BridgeNetNS) {
		return false
	}
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		return dialIn(ctx, s.BridgeNetNS, network, addr)
	}}
	defer tr.CloseIdleConnections()
	return answersOK(ctx, tr, s.etcdURL()+"/health", time.Second)
}

// answersOK reports whether a GET of url through tr answers 200 OK
// within timeout.
func answersOK(ctx context.Context, tr http.RoundTripper, url string, timeout time.Duration) bool {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// agentHealth asks node's agent how it is, briefly: for Status.
func agentHealth(ctx context.Context, n Node) (apiv1.Healthz, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return client.New(n.APISocket).Healthz(ctx)
}
