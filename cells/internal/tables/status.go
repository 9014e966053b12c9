// Package tables holds helpers that the cells' StateDB tables share.
package tables

import (
	"fmt"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"github.com/cilium/statedb/reconciler"
)

// StatusIndex indexes a reconciled table by the kind of its objects'
// reconciliation status, so "what is not in the kernel yet?" is a query:
// `db/list --index=status <table> Error`.
func StatusIndex[Obj any](status func(Obj) reconciler.Status) statedb.Index[Obj, reconciler.StatusKind] {
	return statedb.Index[Obj, reconciler.StatusKind]{
		Name:       "status",
		FromObject: func(o Obj) index.KeySet { return index.NewKeySet(status(o).Kind.Key()) },
		FromKey:    reconciler.StatusKind.Key,
		FromString: func(s string) (index.Key, error) {
			for _, k := range []reconciler.StatusKind{
				reconciler.StatusKindPending, reconciler.StatusKindRefreshing,
				reconciler.StatusKindDone, reconciler.StatusKindError,
			} {
				if k.String() == s {
					return k.Key(), nil
				}
			}
			return nil, fmt.Errorf("invalid status %q: want Pending, Refreshing, Done or Error", s)
		},
	}
}
