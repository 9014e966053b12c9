// Package kvstore is the cluster's shared store: etcd with --kvstore=etcd,
// nothing by default (one node needs no shared store).
//
// The contract:
//
//   - The cell always provides a [Client]. Disabled, Enabled() is false and
//     every call returns [ErrDisabled]; cells that can work node-locally
//     check Enabled once and choose.
//   - Nothing waits for etcd at start: the start hook makes the client,
//     which dials in the background, and the job kvstore-status reports
//     connecting, connected or quorum-lost (with the endpoints and the
//     last error) in the module's health and in [Client.Status]. The agent
//     never exits because of etcd; calls made while it is away fail with
//     [ErrUnavailable] when their context ends.
//   - Keys are relative to --kvstore-prefix. [Client.Watch] lists, marks the
//     end of the listing with EventListed (the moment a consumer's table
//     initializer is done), then follows changes; when the watch breaks,
//     or the store is found replaced (another cluster ID, or a revision
//     below one read before: a restore, a member rebuilt empty), it lists
//     again and sends what changed meanwhile, deletes of the keys that went
//     included. It keeps a fingerprint of each value it sent, not the
//     value: its consumer holds the one copy. Retries (a failed listing, a
//     broken watch, a lost lease's rewrite) back off from 100ms to 10s with
//     each wait drawn from half its step to the whole, so that agents that
//     lost etcd together do not all come back at one instant.
//   - [Client.List] and Watch's listings read a prefix in pages of 1000
//     keys, all at the first page's revision: one consistent listing, not
//     one response of every key.
//   - Leased keys live on the agent's leases, at most 1000 keys each (etcd
//     applies a put with a lease in time linear in the keys on it). When a
//     lease is lost, the job kvstore-lease-rewrite writes its keys again on
//     a new lease; when the store is replaced, the leases it does not
//     know are lost the same way. Concurrent writes share the lease being
//     granted.
//   - [Client.Txn] is a compare-and-swap over several keys in one round
//     trip: the writes of the first branch whose conditions hold, on
//     single keys or on every key under a prefix.
//   - Locks are etcd mutexes on a session with a 25 s TTL, so a dead
//     agent's locks expire; one process serialises its own holders of a
//     lock, and kvstore-locks-gc releases a lock held here for longer than
//     2 minutes, logging which.
//
// A cell that publishes and follows keys:
//
//	func (p *publisher) run(ctx context.Context, _ cell.Health) error {
//		if _, err := p.kv.UpdateIfDifferent(ctx, "state/ip/v1/10.0.0.7", value, kvstore.Leased()); err != nil {
//			return err // retried by the job
//		}
//		for ev := range p.kv.Watch(ctx, "state/ip/v1/") {
//			switch ev.Kind {
//			case kvstore.EventUpsert: // ev.Key, ev.Value
//			case kvstore.EventDelete:
//			case kvstore.EventListed: // mark the table initializer done
//			}
//		}
//		return nil
//	}
package kvstore
