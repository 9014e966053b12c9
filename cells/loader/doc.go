// Package loader is the loader cell: it loads the socket load-balancing
// programs of bpf/sock_lb.c with the lb-maps cell's maps and attaches them
// to a cgroup2 directory, --cgroup-root, so that every socket created by a
// task in that cgroup or below it is load-balanced.
//
// The contract:
//
//   - Start loads the programs with the maps of *lbmaps.Maps in place of
//     their own (taking *lbmaps.Maps is what makes the maps open first) and
//     with the Maglev table size of those maps. A program the verifier
//     refuses fails the start.
//   - Each program is attached through a bpf_link pinned at
//     <bpf-root>/<prefix>/links/<program>. A pinned link from an earlier run
//     is updated in place to the new program: the kernel swaps programs
//     atomically, so no socket ever goes unbalanced. A pin that is no
//     usable link (another attach type, another cgroup, a cgroup that is
//     gone, not a link at all) is replaced by a new link, attached before
//     the old one is detached. Pinned links of programs that no longer exist
//     are detached and removed.
//   - Stop closes the agent's handles and keeps the pins: the programs stay
//     attached and keep balancing with the pinned maps while the agent is
//     down.
//   - `agent cleanup` detaches and removes the links (the Cleanup this cell
//     contributes to the bpf-maps Cleaner), after which sockets are left
//     alone.
//   - Health is OK once every program is attached, naming the cgroup.
//
// --cgroup-root defaults to where cgroup2 is mounted, found in
// /proc/self/mountinfo at start ([Cgroup2Mount]); tests point it at a
// cgroup of their own.
package loader
