package ipcache

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"

	"github.com/cilium/ebpf"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/cellium/cellium/cells/health"
	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/pkg/ipcachemap"
)

// registerReconciler writes each entry's winning claim into the map.
func registerReconciler(p reconciler.Params, tbl statedb.RWTable[*Entry], m *Map) error {
	_, err := reconciler.Register(
		p, tbl,
		(*Entry).Clone,
		func(e *Entry, s reconciler.Status) *Entry { e.Status = s; return e },
		func(e *Entry) reconciler.Status { return e.Status },
		&ops{m: m},
		nil,
	)
	return err
}

// ValueOf is the map value of a claim.
func ValueOf(c Claim) ipcachemap.Value {
	v := ipcachemap.Value{Identity: uint32(c.Identity), Flags: c.Flags}
	v.SetTunnelEndpoint(c.HostIP)
	return v
}

type ops struct{ m *Map }

func (o *ops) Update(_ context.Context, _ statedb.ReadTxn, _ statedb.Revision, e *Entry) error {
	want := ValueOf(e.Winner())
	// An entry already right is not written again (a restart rewrites
	// nothing that did not change).
	if have, err := o.m.Lookup(ipcachemap.KeyOf(e.Prefix)); err == nil && have == want {
		return nil
	}
	if err := o.m.Put(ipcachemap.KeyOf(e.Prefix), want); err != nil {
		return fmt.Errorf("ipcache %s: %w", e.Prefix, err)
	}
	return nil
}

func (o *ops) Delete(_ context.Context, _ statedb.ReadTxn, _ statedb.Revision, e *Entry) error {
	if err := o.m.Delete(ipcachemap.KeyOf(e.Prefix)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("ipcache %s: %w", e.Prefix, err)
	}
	return nil
}

// Prune removes the map's entries of prefixes the table does not have.
func (o *ops) Prune(_ context.Context, _ statedb.ReadTxn, entries iter.Seq2[*Entry, statedb.Revision]) error {
	want := map[ipcachemap.Key]bool{}
	for e := range entries {
		want[ipcachemap.KeyOf(e.Prefix)] = true
	}
	return o.m.Prune(func(k ipcachemap.Key) bool { return want[k] }, nil)
}

// SyncedBarrier is the readiness barrier that waits until the map holds
// what every source claims: restored, local endpoints, node addresses and,
// with a kvstore, its first listing. Once etcd has failed to answer it
// waits no more for the listing, only until the map holds every entry the
// table has (the restored entries stay: the table is not initialized).
const SyncedBarrier = "ipcache-synced"

func syncedBarrier(db *statedb.DB, tbl statedb.RWTable[*Entry], kv kvstore.Client, log *slog.Logger) health.WaitOut {
	return health.WaitOut{Wait: kvstore.ReconciledUnlessUnreachable(SyncedBarrier, db, tbl.ToTable(), func(e *Entry) reconciler.Status { return e.Status }, kv, log)}
}
