// Package devcluster builds a Kubernetes-like cluster of Cellium agents on
// one machine, for people trying Cellium and for end-to-end tests, and takes
// it down again. `cellium-dev cluster` is its command line.
//
// # What a cluster is
//
// A cluster has a name ("dev" by default; tests pick their own) and a
// directory (DefaultDir(name) unless given). Up makes, in this order:
//
//   - a network namespace "cellium-<name>.bridge" holding a Linux bridge br0
//     with the cluster's gateway addresses (10.90.0.1/24, fd00:10:90::1/64)
//     and blackhole default routes: a packet that leaves a node for anywhere
//     but another node is dropped there;
//   - per node, a network namespace "cellium-<name>.node-<i>" whose eth0 is
//     one end of a veth pair whose other end is a port of br0. Node i has
//     10.90.0.(10+i) and fd00:10:90::(10+i) on eth0, a default route
//     through the bridge namespace (the node's address is the one on the
//     device holding the default route), and blackhole routes over the pod
//     ranges (10.244.0.0/16, fd00:10:244::/48) and the service ranges
//     (10.96.0.0/12, fd00:10:96::/108), so that an unrouted or untranslated
//     packet is dropped, never sent anywhere. Its pod CIDRs are
//     10.244.i.0/24 and fd00:10:244:i::/64;
//   - per node, a cgroup <cgroup2 mount>/cellium-devcluster-<name>/node-<i>:
//     the agent's --cgroup-root, so its socket load balancing applies to the
//     processes of that node's pods (Exec puts them there) and to nothing
//     else;
//   - an etcd (Debian's etcd-server) in the bridge namespace on
//     http://10.90.0.1:2379, its data in the cluster directory;
//   - a Node manifest per node (InternalIPs, spec.podCIDRs) in the shared
//     manifests directory, which every agent serves with its embedded API
//     server (--k8s-mode=embedded), so every agent sees every Node, Pod,
//     Service, Namespace and NetworkPolicy written there;
//   - an agent per node (`agent run`, flags from agentFlags), started in its
//     node's namespace in a session of its own, its log in the cluster
//     directory, its BPF objects pinned under <bpf-root>/cellium_<name>_node-<i>.
//
// Up returns once every agent is ready, or fails naming the node and the end
// of its log, after taking down what it made. The agents and etcd keep
// running after the process that called Up exits (unless
// Options.StopWithCaller): their PIDs, with their start times so that a
// reused PID is never signalled, are in <dir>/cluster.json, which every
// change rewrites atomically and which Load reads back.
//
// # Pods
//
// AddPod and AddPodSpec make a pod: a network namespace
// "cellium-<name>.pod.<pod>" ("...pod.<namespace>.<pod>" outside the
// default namespace), a Pod manifest (its namespace, the node, the labels,
// the container ports) in the manifests directory, and a CNI ADD through
// libcni with the node's configuration and the cellium-cni plugin. It
// returns once the node's agent has the pod's endpoint with its labels.
// Pods are named by their Ref: NAME in the default namespace,
// NAMESPACE/NAME elsewhere. SetPodLabels changes a pod's labels through its
// manifest, as a label change through the API server; Namespace manifests
// give namespaces their labels. Start and Exec run a command in the pod's
// network namespace and in its node's cgroup, so the node agent's socket
// load balancing applies as it would to a container. DeletePod is the CNI
// DEL and removes the rest.
//
// # Outside
//
// AddOutside makes a namespace "cellium-<name>.outside" on the bridge that
// is no node (10.90.0.200, fd00:10:90::200, no route to the pods): a
// server there stands for the world outside the cluster, which pods reach
// through their node's masquerade. Down removes it.
//
// # Down
//
// Down stops the agents (SIGTERM, SIGKILL after 10s) and etcd, kills what
// else runs in the cluster's namespaces and node cgroups (what an Up that
// died had not recorded yet, processes of Exec), runs `agent cleanup` for
// each node's pinned programs and maps, and removes the namespaces,
// cgroups, pin directories and the cluster directory. It works on a cluster that Up left
// half made and is idempotent; what it cannot remove it reports, keeping
// cluster.json so that Down can be run again.
//
// Several clusters of different names coexist: every namespace, cgroup, pin
// directory and path carries the name.
//
//	c, err := devcluster.Up(ctx, devcluster.Options{Name: "dev", Nodes: 3})
//	a, err := c.AddPod(ctx, "node-1", "a", map[string]string{"app": "a"})
//	out, err := c.Exec(ctx, "a", "cat", "/proc/net/dev")
//	err = c.Down(ctx)
package devcluster
