package devcluster

import (
	"context"
	"net/netip"
	"sync"
	"time"
)

// Status is what runs of a cluster, and how it is.
type Status struct {
	Name    string    `json:"name"`
	Dir     string    `json:"dir"`
	Phase   Phase     `json:"phase"`
	Created time.Time `json:"created"`
	// ManifestsDir is the directory every agent serves.
	ManifestsDir string     `json:"manifestsDir"`
	Etcd         EtcdStatus `json:"etcd"`
	// IdentityMode is kvstore or crd (Options.IdentityMode).
	IdentityMode string `json:"identityMode"`
	// KubeAPI is the cluster's kube-apiserver, in crd mode.
	KubeAPI *KubeAPIStatus `json:"kubeAPI,omitempty"`
	// Relay is hubble-relay, when StartRelay started it.
	Relay *RelayStatus `json:"relay,omitempty"`
	Nodes []NodeStatus `json:"nodes"`
	Pods  []Pod        `json:"pods"`
}

// EtcdStatus is the cluster's etcd.
type EtcdStatus struct {
	URL     string `json:"url"`
	PID     int    `json:"pid"`
	Running bool   `json:"running"`
	Healthy bool   `json:"healthy"`
}

// KubeAPIStatus is the cluster's kube-apiserver (crd mode).
type KubeAPIStatus struct {
	// URL is where it serves, in NetNS, the bridge namespace.
	URL     string `json:"url"`
	NetNS   string `json:"netns"`
	PID     int    `json:"pid"`
	Running bool   `json:"running"`
	Ready   bool   `json:"ready"`
	// Kubeconfig is the administrator's (system:masters), for kubectl in
	// the bridge namespace; AgentKubeconfig the agents' (deploy/rbac.yaml's
	// ServiceAccount).
	Kubeconfig      string `json:"kubeconfig"`
	AgentKubeconfig string `json:"agentKubeconfig"`
}

// RelayStatus is the cluster's hubble-relay.
type RelayStatus struct {
	// Address is where it serves, in the bridge namespace.
	Address string `json:"address"`
	PID     int    `json:"pid"`
	Running bool   `json:"running"`
}

// NodeStatus is a node and its agent.
type NodeStatus struct {
	Node
	// Running says the agent's process runs.
	Running bool `json:"running"`
	// Ready is the agent's own readiness (GET /v1/healthz).
	Ready bool `json:"ready"`
	// Pending names what a running agent that is not ready waits for.
	Pending []string `json:"pending,omitempty"`
	// Error says why the agent's readiness is unknown.
	Error string `json:"error,omitempty"`
}

// Status asks every agent and etcd how they are.
func (c *Cluster) Status(ctx context.Context) Status {
	s := c.snapshot()
	st := Status{
		Name: s.Name, Dir: s.Dir, Phase: s.Phase, Created: s.Created, ManifestsDir: s.manifestsDir(),
		Etcd:  EtcdStatus{URL: s.etcdURL(), PID: s.Etcd.PID, Running: s.Etcd.Alive()},
		Nodes: make([]NodeStatus, len(s.Nodes)),
		Pods:  append([]Pod{}, s.Pods...),
	}
	st.IdentityMode = IdentityKVStore
	if s.crd() {
		st.IdentityMode = IdentityCRD
		st.KubeAPI = &KubeAPIStatus{URL: s.kubeAPIURL(), NetNS: s.BridgeNetNS, PID: s.KubeAPI.PID, Running: s.KubeAPI.Alive(),
			Kubeconfig: s.adminKubeconfig(), AgentKubeconfig: s.agentKubeconfig()}
	}
	if s.Relay.PID != 0 {
		st.Relay = &RelayStatus{Address: netip.AddrPortFrom(s.Gateway4, RelayPort).String(), PID: s.Relay.PID, Running: s.Relay.Alive()}
	}
	var wg sync.WaitGroup
	if st.Etcd.Running {
		wg.Go(func() { st.Etcd.Healthy = c.etcdHealthy(ctx, s) })
	}
	if st.KubeAPI != nil && st.KubeAPI.Running {
		wg.Go(func() { st.KubeAPI.Ready = kubeAPIReady(ctx, s) })
	}
	for i, n := range s.Nodes {
		ns := &st.Nodes[i]
		ns.Node, ns.Running = n, n.Agent.Alive()
		if !ns.Running {
			continue
		}
		wg.Go(func() {
			h, err := agentHealth(ctx, n)
			if err != nil {
				ns.Error = err.Error()
				return
			}
			ns.Ready, ns.Pending = h.Ready, h.Pending
		})
	}
	wg.Wait()
	return st
}
