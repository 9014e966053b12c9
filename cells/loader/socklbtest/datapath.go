package socklbtest

import (
	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/bpfmaps"
	"github.com/cellium/cellium/cells/bpfmaps/bpfmapstest"
	"github.com/cellium/cellium/cells/ctmaps"
	"github.com/cellium/cellium/cells/devices"
	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/endpointmaps"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/ipcache"
	"github.com/cellium/cellium/cells/lbmaps"
	"github.com/cellium/cellium/cells/loadbalancer"
	"github.com/cellium/cellium/cells/loader"
	"github.com/cellium/cellium/cells/policy"
	"github.com/cellium/cellium/cells/policymaps"
)

// MaglevTableSize is the Maglev table size of the datapath the harness
// builds: the smallest valid one, so that hand-built tables stay short.
const MaglevTableSize = 251

// Datapath builds, without starting it, a hive of the datapath cells
// (bpf-maps, lb-maps, ct-maps, endpoint-maps, loader, with statedb, jobs and
// health) plus extra, with the socket programs attached to e.Cgroup and
// everything pinned under bpfRoot, a path from bpfmapstest.Root. Its maps
// are small, with tables of MaglevTableSize. *maps receives the lb-maps
// cell's Maps once the hive is populated.
//
// The maps are the test's to fill by hand: the lb-maps reconciler gets an
// empty frontends table that never counts as initialized, so it writes
// nothing and never prunes what the test wrote, across restarts too. The
// endpoints table is the test's to fill as well, through *Endpoints.
//
// The settings go through the hive's flag values (Viper), not config
// overrides, so a test may still override any config type, or set other
// flags the same way.
func (e *Env) Datapath(bpfRoot string, maps **lbmaps.Maps, extra ...cell.Cell) *hive.Hive {
	cells := []cell.Cell{
		bpfmaps.Cell, lbmaps.Cell, ctmaps.Cell, endpointmaps.Cell, loader.Cell,
		handFilled, handFilledEndpoints, handFilledDevices,
		// The devices the table holds are the test's namespace's.
		cell.Provide(func() devices.Config { return devices.Config{DevicesNetns: e.NetNS} }),
		// The ipcache map alone: the endpoint programs read it, and a test
		// fills it by hand (the ipcache cell would need its sources).
		cell.Module("test-ipcache-map", "The ipcache map filled by the test", cell.Provide(ipcache.NewMap)),
		// The policy maps over policy tables no one fills: no endpoint
		// is isolated.
		policymaps.Cell,
		cell.Module("test-policy", "Empty policy tables", cell.Provide(policy.NewEntriesTable, policy.NewEnforcementTable, policy.NewPrefixesTable)),
		cell.Invoke(func(m *lbmaps.Maps) { *maps = m }),
	}
	h := celltest.New(append(cells, extra...)...)
	for flag, value := range map[string]any{
		"bpf-root":               bpfRoot,
		"cgroup-root":            e.Cgroup,
		"lb-service-map-max":     1024,
		"lb-backend-map-max":     1024,
		"lb-revnat-map-max":      1024,
		"lb-affinity-map-max":    1024,
		"lb-sock-revnat-map-max": 4096,
		"lb-maglev-table-size":   MaglevTableSize,
		"conntrack-tcp-max":      1024,
		"conntrack-any-max":      1024,
		"monitor-ringbuf-size":   1 << 16,
	} {
		h.Viper().Set(flag, value)
	}
	return h
}

// StartDatapath starts a Datapath on a BPF filesystem of the test's own,
// stops it when the test ends, and returns its maps.
func (e *Env) StartDatapath(extra ...cell.Cell) *lbmaps.Maps {
	e.t.Helper()
	var maps *lbmaps.Maps
	celltest.Start(e.t, e.Datapath(bpfmapstest.Root(e.t), &maps, extra...))
	return maps
}

// handFilled is the frontends table of a datapath without a control plane.
var handFilled = cell.Provide(func(db *statedb.DB) (statedb.RWTable[*loadbalancer.Frontend], error) {
	tbl, err := loadbalancer.NewFrontendsTable(db)
	if err != nil {
		return nil, err
	}
	txn := db.WriteTxn(tbl)
	tbl.RegisterInitializer(txn, "maps-filled-by-hand")
	txn.Commit()
	return tbl, nil
})

// Endpoints is the endpoints table of a Datapath, which the test fills as
// the endpoint manager would: rows inserted with MapStatus and
// ProgramStatus pending. Until Restored, the table is not initialized, so
// the reconcilers write what the rows say but prune nothing.
type Endpoints struct {
	DB    *statedb.DB
	Table statedb.RWTable[*endpointmanager.Endpoint]

	restored func(statedb.WriteTxn)
}

// Restored completes the table's restore, as the endpoint manager does once
// every endpoint on disk is back: from then on, the reconcilers remove what
// no row has.
func (e *Endpoints) Restored() {
	txn := e.DB.WriteTxn(e.Table)
	e.restored(txn)
	txn.Commit()
}

var handFilledEndpoints = cell.Provide(
	func(db *statedb.DB) (*Endpoints, error) {
		tbl, err := endpointmanager.NewTable(db)
		if err != nil {
			return nil, err
		}
		txn := db.WriteTxn(tbl)
		done := tbl.RegisterInitializer(txn, "endpoint-restore")
		txn.Commit()
		return &Endpoints{DB: db, Table: tbl, restored: done}, nil
	},
	func(e *Endpoints) statedb.RWTable[*endpointmanager.Endpoint] { return e.Table },
	statedb.RWTable[*endpointmanager.Endpoint].ToTable,
)

// Devices is the devices table, which a test fills by hand: the datapath
// has no devices cell, whose watcher would need a namespace's devices
// first. It starts empty and uninitialized, as the devices cell's does
// until its first listing: Listed initializes it.
type Devices struct {
	DB    *statedb.DB
	Table statedb.RWTable[*devices.Device]

	listed func(statedb.WriteTxn)
}

// Listed marks the devices table initialized.
func (d *Devices) Listed() {
	txn := d.DB.WriteTxn(d.Table)
	d.listed(txn)
	txn.Commit()
}

var handFilledDevices = cell.Provide(
	func(db *statedb.DB) (*Devices, error) {
		tbl, err := statedb.NewTable(db, devices.DevicesTableName, devices.DeviceIfIndex, devices.DeviceName, devices.DeviceSelected)
		if err != nil {
			return nil, err
		}
		txn := db.WriteTxn(tbl)
		done := tbl.RegisterInitializer(txn, "devices-listed")
		txn.Commit()
		return &Devices{DB: db, Table: tbl, listed: done}, nil
	},
	func(d *Devices) statedb.Table[*devices.Device] { return d.Table },
)
