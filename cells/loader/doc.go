// Package loader is the loader cell: it loads the datapath's programs with
// the agent's maps and attaches them. The socket load-balancing programs of
// bpf/sock_lb.c go to a cgroup2 directory, --cgroup-root, so that every
// socket created by a task in that cgroup or below it is load-balanced. The
// endpoint programs of bpf/lxc.c go to the host side of every endpoint's
// veth pair: from-endpoint at its tcx ingress (what the pod sends),
// to-endpoint at its tcx egress (what goes into the pod).
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
//   - Each program is attached through a tcx link pinned at
//     <bpf-root>/<prefix>/links/endpoints/<endpoint-id>-ingress and
//     -egress. As with the socket programs, a pinned link is updated in
//     place to the new run's program, so an endpoint's packets always go
//     through a program across agent restarts; a link on another interface
//     (the endpoint's veth was recreated) is replaced. Once the endpoints
//     table is initialized, that is once the endpoint manager has restored
//     every endpoint, the links of endpoints that are gone are detached.
//   - On kernels without tcx (before 6.6) the programs are direct-action
//     bpf filters on a clsact qdisc instead, replaced in place by the next
//     run; they cannot be pinned, and go with their interface.
//
// For both:
//
//   - Stop closes the agent's handles and keeps the pins: the programs stay
//     attached and keep working with the pinned maps while the agent is
//     down.
//   - `agent cleanup` detaches and removes every pinned link (the Cleanup
//     this cell contributes to the bpf-maps Cleaner).
//
// --cgroup-root defaults to where cgroup2 is mounted, found in
// /proc/self/mountinfo at start (cgroup2.Mount); tests point it at a
// cgroup of their own.
package loader
