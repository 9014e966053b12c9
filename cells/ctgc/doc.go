// Package ctgc is the ct-gc cell: garbage collection of the conntrack maps
// of the ct-maps cell (cellium_ct4_tcp, cellium_ct4_any, cellium_ct6_tcp,
// cellium_ct6_any) and of the loader's NodePort NAT map
// (cellium_nodeport4_nat, when the hive has it), which the datapath fills
// and never empties itself.
//
// The contract:
//
//   - A pass walks each map with batch lookups (a chunk of entries per
//     system call) and deletes, with a batch delete per chunk, the entries
//     whose Lifetime is before ctmap.Now(), the boot-time clock the
//     datapath writes lifetimes with. Live entries are left alone. The
//     deletes of a chunk run on their own goroutine while the walk reads the
//     next chunk, and the chunks' buffers are reused from chunk to chunk:
//     a pass allocates nothing per entry. They are a walk's own, let go
//     when it ends: nothing is held between passes.
//   - The first pass after start waits until the endpoints table is
//     initialized, that is until the endpoint manager has restored the
//     endpoints of the previous run, and also deletes the entries whose
//     EndpointID is not 0 and not in the table: the connections of pods
//     deleted while the agent was down. Later passes delete by lifetime
//     only. A first pass that fails leaves the endpoint check to the next.
//   - Endpoints deleted while the agent runs: with the IPAM in the hive,
//     the GC holds released addresses (ipam.IPAM.HoldReleases); the job
//     flush-released-addresses deletes from the four conntrack maps every
//     entry with one of them as source or destination (live ones too),
//     then frees them: an address goes to no new pod before the entries
//     its old pod left are gone, which would let that pod's peers in past
//     the new pod's ingress policy. Without the IPAM, the job
//     flush-deleted-endpoints does the same for the addresses of each
//     endpoint deleted from the endpoints table. Logged at info and
//     counted (reason endpoint_deleted); a walk that fails is retried
//     after the minimum interval.
//   - The wait between passes adapts to the largest share of a map's
//     capacity a pass found expired: above a quarter, the wait shrinks in
//     proportion (to at most a quarter of itself); below 5% of every map,
//     it doubles; in between it holds; always within
//     --conntrack-gc-interval-min and --conntrack-gc-interval-max. It
//     starts from 5 minutes. Entries of endpoints that are gone do not
//     count. --conntrack-gc-interval, when not 0, fixes it. A failed pass is
//     retried after the minimum.
//   - Each pass is logged at debug with its figures, at info when it
//     deleted a large share of a map or entries of endpoints that are gone,
//     or took long. A pass (or flush) that takes long logs its progress
//     every 10 seconds. Its figures go to the cellium_ct_gc_* metrics; a
//     failed pass makes the module's health Degraded with the error until a
//     pass succeeds.
//   - The datapath may refresh an entry between the pass reading and
//     deleting it (a few milliseconds at most). The connection's next packet
//     then finds no entry and is tracked anew, as after a flush.
//   - The NAT map's entries expire by the same rule. Because a lost NAT
//     entry breaks its connection, and the datapath hands an expired
//     entry's key to a new connection, each condemned NAT entry is read
//     again just before it is deleted, alone. Flush leaves the NAT map
//     alone.
//
// [GC.Run] asks for a pass now and returns it once done, and [GC.Status]
// says what the GC is doing, with a channel that closes on change, so tests
// drive passes without sleeping:
//
//	p, err := gc.Run(ctx) // waits for the first pass, then runs one
//	fmt.Println(p.Deleted(), p.Interval)
//
// The same through the API: GET /v1/conntrack lists the entries (?family=,
// ?endpoint=, ?limit=; `agent ct list`), POST /v1/conntrack/flush deletes
// them all (`agent ct flush`), GET /v1/conntrack/gc is the status and POST
// runs a pass (`agent ct gc [--run]`).
package ctgc
