package tables

import (
	"context"
	"fmt"
	"strings"

	"github.com/cilium/statedb"
)

// WaitInitialized waits until every initializer of tbl is done. When ctx
// ends first, the error names the initializers still pending.
func WaitInitialized[Obj any](ctx context.Context, db *statedb.DB, tbl statedb.Table[Obj]) error {
	for {
		txn := db.ReadTxn()
		init, watch := tbl.Initialized(txn)
		if init {
			return nil
		}
		select {
		case <-watch:
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s (table %s): %w",
				strings.Join(tbl.PendingInitializers(txn), ", "), tbl.Name(), context.Cause(ctx))
		}
	}
}
