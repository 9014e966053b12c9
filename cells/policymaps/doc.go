// Package policymaps keeps the datapath's network policy maps
// (bpf/include/policy.h, layout in pkg/policymap) equal to the policy
// cell's tables: "policy-entries" into the shared trie cellium_policy,
// "policy-enforcement" into cellium_policy_enforcement, "policy-prefixes"
// (ipBlock prefixes and their IDs) into cellium_policy_prefix. The endpoint
// programs of bpf/lxc.c read them for every new connection.
// --policy-map-test-crash-after, hidden, kills the agent after its Nth map
// write (cells/internal/faultpoint), for crash tests.
//
// The contract:
//
//   - The maps are declared through the bpf-maps registry, pinned, and kept
//     while the agent is down and while it restarts: the datapath goes on
//     enforcing the policy it had.
//   - One generic reconciler per table. An entry's Update writes the trie
//     keys of its port range (pkg/policymap.KeysOf) that the map does not
//     hold already, and an enforcement row's its flags if they differ: it
//     looks each key up first, so that a restart with unchanged tables
//     rewrites nothing (cellium_policy_map_writes_total counts every write).
//   - Delete removes an entry's keys that no other entry of the endpoint
//     still needs (two port ranges may share a block).
//   - Prune removes what no row wants, and only once the table is
//     initialized (the policy cell's restore and first computation), never
//     the policy of an endpoint about to be restored.
//   - A write the full trie refuses (--policy-map-max entries) fails the
//     entry (its status in `agent db show policy-entries`), counts in
//     cellium_policy_map_full_total, and puts the endpoint's health scope
//     "policy-maps.endpoint-<id>" in Degraded, naming the endpoint, until all
//     its entries are written. The datapath then holds only part of that
//     endpoint's allows: it denies more than the policy says, never more
//     than the policy allows, since enforcement is a map of its own that
//     cannot be full.
//   - An endpoint's enforcement and its allows change in order (order.go):
//     a direction's isolation is written only once none of the endpoint's
//     entries is Pending (its allows are in), nor any prefix (the ipBlock
//     IDs its allows name), and allows it no longer needs are removed only
//     once its isolation is off in the map (held until the enforcement's
//     write, which removes them). A row that moved on while its isolation
//     waited is not written (the newer one is); an entry's Delete judges
//     the hold by the enforcement row of its own transaction, and the
//     entries' prune holds keys as that Delete does (a restart finds the
//     map isolated where the row says open). An agent killed at any point
//     leaves every endpoint enforcing its old or its new policy for its
//     pairs, never dropping a pair both allow. A prefix no row wants is
//     likewise kept while any endpoint's isolation is to turn off. Only the
//     enforcement's reconciler waits, for the entries' and the prefixes',
//     which never wait.
//   - The refresh rewrites a key that went missing behind the agent's back,
//     logs what it put back and counts it in cellium_policy_map_repairs_total.
package policymaps
