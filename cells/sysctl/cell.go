package sysctl

import (
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/spf13/pflag"
)

// Cell provides the sysctl table and reconciles it into /proc/sys.
var Cell = cell.Module(
	"sysctl",
	"Kernel parameters reconciled into proc sys",

	cell.Config(defaultConfig),
	cell.Config(defaultForwardingConfig),
	cell.Provide(newTable, statedb.RWTable[*Sysctl].ToTable),
	cell.ProvidePrivate(job.Registry.NewGroup),
	cell.Invoke(registerReconciler, requestForwarding),
)

// Config is the sysctl cell's configuration.
type Config struct {
	// ProcFS is where procfs is mounted; tests point it at a directory.
	ProcFS string
}

var defaultConfig = Config{ProcFS: "/proc"}

func (def Config) Flags(flags *pflag.FlagSet) {
	flags.String("proc-fs", def.ProcFS, "Mount point of procfs, whose sys/ the agent writes kernel parameters to")
}

// ForwardingConfig turns on IP forwarding, which routing pod traffic needs.
type ForwardingConfig struct {
	EnableIPForwarding bool
}

var defaultForwardingConfig = ForwardingConfig{EnableIPForwarding: true}

func (def ForwardingConfig) Flags(flags *pflag.FlagSet) {
	flags.Bool("enable-ip-forwarding", def.EnableIPForwarding, "Set net.ipv4.ip_forward and net.ipv6.conf.all.forwarding to 1")
}

// forwarding are the parameters --enable-ip-forwarding sets. IPv6 is
// optional: a kernel booted with IPv6 off has no such parameter.
var forwarding = []*Sysctl{
	{Name: "net.ipv4.ip_forward", Value: "1"},
	{Name: "net.ipv6.conf.all.forwarding", Value: "1", Optional: true},
}

func requestForwarding(fwd ForwardingConfig, lc cell.Lifecycle, db *statedb.DB, tbl statedb.RWTable[*Sysctl]) {
	if fwd.EnableIPForwarding {
		lc.Append(cell.Hook{OnStart: (&desired{db, tbl, forwarding}).insert})
	}
}

// desired inserts sysctl rows at start.
type desired struct {
	db   *statedb.DB
	tbl  statedb.RWTable[*Sysctl]
	rows []*Sysctl
}

func (d *desired) insert(cell.HookContext) error {
	txn := d.db.WriteTxn(d.tbl)
	defer txn.Abort()
	for _, s := range d.rows {
		s = s.clone()
		s.Status = reconciler.StatusPending()
		if _, _, err := d.tbl.Insert(txn, s); err != nil {
			return err
		}
	}
	txn.Commit()
	return nil
}
