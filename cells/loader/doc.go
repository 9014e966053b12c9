// Package loader is the loader cell: it loads the datapath's programs with
// the agent's maps and attaches them. The socket load-balancing programs of
// bpf/sock_lb.c go to a cgroup2 directory, --cgroup-root, so that every
// socket created by a task in that cgroup or below it is load-balanced. The
// endpoint programs of bpf/lxc.c go to the host side of every endpoint's
// veth pair, as tc filters: from-endpoint at its ingress (what the pod
// sends), to-endpoint at its egress (what goes into the pod).
//
// The contract, socket programs:
//
//   - Start loads the programs with the maps of *lbmaps.Maps and the event
//     ring buffer of *ctmaps.Events in place of their own (taking them is
//     what makes the maps open first) and with the Maglev table size of
//     those maps. A program the verifier refuses fails the start.
//   - Each program is attached through a bpf_link pinned at
//     <bpf-root>/<prefix>/links/<program>. A pinned link from an earlier run
//     is updated in place to the new program: the kernel swaps programs
//     atomically, so no socket ever goes unbalanced. A pin that is no
//     usable link (another attach type, another cgroup, a cgroup that is
//     gone, not a link at all) is replaced by a new link, attached before
//     the old one is detached. Pinned links of programs that no longer exist
//     are detached and removed.
//   - Health is OK once every program is attached, naming the cgroup.
//
// The contract, endpoint programs:
//
//   - A start hook loads them once per agent start, with the conntrack maps
//     and the event ring buffer of the ct-maps cell, the endpoint map of the
//     endpoint-maps cell, and the conntrack lifetimes and monitor
//     aggregation from the ct-maps cell's flags as constants.
//   - A reconciler of the endpoints table attaches them to every ready
//     endpoint that has a host interface, and writes the outcome into the
//     row's ProgramStatus (`agent endpoint list`, `agent db show
//     endpoints`); an endpoint that fails makes the loader's health
//     degraded, naming the endpoint and the ifindex, and is retried. A
//     deleted or not-ready endpoint loses its programs.
//   - Each program is a direct-action bpf filter on a clsact qdisc of the
//     host side (tc.go), replaced in place by the next run's program, so an
//     endpoint's packets always go through a program across agent
//     restarts. Filters cannot be pinned: they stay with their interface
//     while the agent is down and go with it. Not tcx links: a tcx attach
//     waits for an RCU grace period under the kernel's RTNL lock, two per
//     new pod, one after another across the node; a filter on a host side
//     that is not up yet (the endpoint manager brings a new one up once it
//     is live) waits for none.
//   - Endpoints that an agent before the filters attached through tcx
//     links pinned at <bpf-root>/<prefix>/links/endpoints/<endpoint-id>-
//     ingress and -egress keep them, updated in place to the new program;
//     a pinned link that cannot take it (the veth was recreated) is
//     replaced by a filter. Once the endpoints table is initialized, that
//     is once the endpoint manager has restored every endpoint, the links
//     of endpoints that are gone are detached.
//
// For both:
//
//   - Stop closes the agent's handles and keeps the pins: the programs stay
//     attached and keep working with the pinned maps while the agent is
//     down.
//   - `agent cleanup` detaches and removes every pinned link, and the
//     endpoint filters of the veths named as endpoints' host sides (the
//     Cleanup this cell contributes to the bpf-maps Cleaner).
//
// --cgroup-root defaults to where cgroup2 is mounted, found in
// /proc/self/mountinfo at start (cgroup2.Mount); tests point it at a
// cgroup of their own.
package loader
