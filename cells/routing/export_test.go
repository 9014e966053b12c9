package routing

import "github.com/cilium/statedb"

// RefreshAll has the reconcilers compare every row with the kernel again,
// as the agent does after it lost netlink updates.
func RefreshAll(db *statedb.DB, routes statedb.Table[*Route], neighbors statedb.Table[*Neighbor], fdb statedb.Table[*FDBEntry]) {
	r := &router{db: db, routes: routes.(statedb.RWTable[*Route]), neighbors: neighbors.(statedb.RWTable[*Neighbor]), fdb: fdb.(statedb.RWTable[*FDBEntry])}
	r.refresh(func(string) bool { return true })
}
