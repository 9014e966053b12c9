// Package maglev computes Maglev lookup tables (Eisenbud et al., "Maglev: A
// Fast and Reliable Software Network Load Balancer", NSDI 2016, section 3.4):
// consistent hashing that spreads a service's flows evenly over its backends
// and moves few flows when the backends change.
//
// Contract of [Table]:
//
//   - Every one of the m slots names a backend (an index into the backends
//     given), unless there are no backends: then the table is empty.
//   - Each backend gets m/n slots, rounded down or up: never one more than
//     any other.
//   - Deterministic: the same set of backends and m give the same table in
//     every process, on every machine and across agent restarts and
//     upgrades, so a restarted agent, or another node, picks the same
//     backend for a flow. The table depends only on the backends' identities,
//     not on their order in the slice.
//   - Minimal disruption: removing or adding one of n backends moves the m/n
//     slots of that backend, plus a few between the others: at the default
//     size at most 0.1·m/n more for n=10 and 1.4·m/n more for n=100
//     (measured; 1.4% of the table). Modulo hashing would move nearly all.
//
// A backend's identity must be what makes it the same backend everywhere,
// such as its address and port ("10.244.1.7:8080"), not a number allocated
// per node. m must be one of [Sizes]; [DefaultSize] (16381) keeps the
// spread even up to about 160 backends per service (1 slot is 0.6% of the
// share of each of 100 backends). The paper recommends m ≥ 100·n.
//
// A load balancer hashes a flow's 5-tuple, takes it modulo m, and sends the
// flow to the backend in that slot:
//
//	table, err := maglev.Table([]string{"10.244.1.7:8080", "10.244.2.9:8080"}, maglev.DefaultSize)
//	backend := backends[table[flowHash%uint64(len(table))]]
package maglev
