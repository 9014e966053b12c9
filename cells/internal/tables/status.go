// Package tables holds helpers that the cells' StateDB tables share.
package tables

import (
	"fmt"
	"strings"

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
		FromString: func(s string) (index.Key, error) { return statusKey(s, allKinds) },
	}
}

// UnsettledStatusIndex is StatusIndex for a large table whose rows are
// nearly all Done once reconciled: it holds only the rows that are not
// (Pending, Refreshing or Error), the ones a query by status is for. Each
// indexed row costs an index entry, about 90 bytes; with 50,000 Services
// every frontend in it was 4.5 MB, for a query nobody makes (every row
// not listed is Done). Asking it for Done is an error that says so.
func UnsettledStatusIndex[Obj any](status func(Obj) reconciler.Status) statedb.Index[Obj, reconciler.StatusKind] {
	return statedb.Index[Obj, reconciler.StatusKind]{
		Name: "status",
		FromObject: func(o Obj) index.KeySet {
			kind := status(o).Kind
			if kind == reconciler.StatusKindDone {
				return index.EmptyKeySet
			}
			return index.NewKeySet(kind.Key())
		},
		FromKey: reconciler.StatusKind.Key,
		FromString: func(s string) (index.Key, error) {
			if s == reconciler.StatusKindDone.String() {
				return nil, fmt.Errorf("the status index holds only rows that are not Done (every other row is): want Pending, Refreshing or Error")
			}
			return statusKey(s, unsettledKinds)
		},
	}
}

var (
	allKinds = []reconciler.StatusKind{
		reconciler.StatusKindPending, reconciler.StatusKindRefreshing,
		reconciler.StatusKindDone, reconciler.StatusKindError,
	}
	unsettledKinds = []reconciler.StatusKind{
		reconciler.StatusKindPending, reconciler.StatusKindRefreshing, reconciler.StatusKindError,
	}
)

// statusKey is the key of the status kind named s, one of kinds.
func statusKey(s string, kinds []reconciler.StatusKind) (index.Key, error) {
	for _, k := range kinds {
		if k.String() == s {
			return k.Key(), nil
		}
	}
	names := make([]string, len(kinds))
	for i, k := range kinds {
		names[i] = k.String()
	}
	last := len(names) - 1
	return nil, fmt.Errorf("invalid status %q: want %s or %s", s, strings.Join(names[:last], ", "), names[last])
}
