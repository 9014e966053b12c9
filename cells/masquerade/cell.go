package masquerade

import (
	"context"
	"fmt"
	"iter"
	"log/slog"
	"net/netip"
	"slices"
	"strings"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/google/nftables"
	"github.com/spf13/pflag"
	"github.com/vishvananda/netns"

	"github.com/cellium/cellium/cells/devices"
	"github.com/cellium/cellium/cells/health"
	"github.com/cellium/cellium/cells/internal/drift"
	"github.com/cellium/cellium/cells/internal/tables"
	"github.com/cellium/cellium/cells/metrics"
	"github.com/cellium/cellium/cells/nodes"
)

// Cell masquerades pod traffic that leaves the cluster: from the nodes
// table and its flags it computes the table "masquerade" (this node's pod
// prefixes, and the prefixes that keep the pods' addresses), which a
// reconciler writes into the agent's nftables table inet cellium.
var Cell = cell.Module(
	"masquerade",
	"Pod egress masquerade through nftables",

	cell.Config(defaultConfig),
	cell.ProvidePrivate(newTable, job.Registry.NewGroup, newKernelCell, newRepairs),
	cell.Provide(statedb.RWTable[*Prefix].ToTable, readinessWait, repairMetrics),
	cell.Invoke(newDesired, registerReconciler),
)

// Config is the masquerade cell's configuration.
type Config struct {
	// EnableMasquerade: pod traffic to outside the cluster leaves with the
	// node's address.
	EnableMasquerade bool
	// NativeRoutingCIDR are more destinations that keep the pods' address.
	NativeRoutingCIDR []string
}

var defaultConfig = Config{EnableMasquerade: true}

func (def Config) Flags(flags *pflag.FlagSet) {
	flags.Bool("enable-masquerade", def.EnableMasquerade,
		"Masquerade pod traffic to destinations outside the pod CIDRs and node addresses of the cluster (and --native-routing-cidr) with the node's address (nftables table inet cellium)")
	flags.StringSlice("native-routing-cidr", def.NativeRoutingCIDR,
		"CIDRs pods reach without masquerade besides the cluster's pods and nodes, e.g. 10.0.0.0/8,fd00::/8")
}

// prefixes parses --native-routing-cidr.
func (cfg Config) prefixes() ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range cfg.NativeRoutingCIDR {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("invalid --native-routing-cidr %q: want a CIDR such as 10.0.0.0/8 or fd00::/8", s)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

type waitOut struct {
	cell.Out
	Wait health.Wait `group:"readiness-waits"`
}

// readinessWait holds readiness back until the masquerade rules for the
// nodes known at start are in the kernel.
func readinessWait(db *statedb.DB, tbl statedb.RWTable[*Prefix]) waitOut {
	return waitOut{Wait: health.Reconciled("masquerade-written", db, tbl.ToTable(), (*Prefix).status).Wait}
}

// kernelCell is the Kernel in the namespace of --devices-netns (the
// agent's own by default), opened at start.
type kernelCell struct {
	*Kernel
	ns netns.NsHandle
}

func newKernelCell(lc cell.Lifecycle, cfg devices.Config) *kernelCell {
	k := &kernelCell{ns: -1}
	lc.Append(cell.Hook{
		OnStart: func(cell.HookContext) error {
			if cfg.DevicesNetns == "" {
				k.Kernel = NewKernel(-1)
				return nil
			}
			ns, err := netns.GetFromPath(cfg.DevicesNetns)
			if err != nil {
				return fmt.Errorf("--devices-netns %s: %w", cfg.DevicesNetns, err)
			}
			k.ns, k.Kernel = ns, NewKernel(int(ns))
			return nil
		},
		OnStop: func(cell.HookContext) error {
			if k.ns >= 0 {
				k.ns.Close()
			}
			return nil
		},
	})
	return k
}

type desiredParams struct {
	cell.In

	Config Config
	Log    *slog.Logger
	DB     *statedb.DB
	Nodes  statedb.Table[*nodes.Node]
	Table  statedb.RWTable[*Prefix]
	Jobs   job.Group
}

func newDesired(p desiredParams) error {
	native, err := p.Config.prefixes()
	if err != nil {
		return err
	}
	txn := p.DB.WriteTxn(p.Table)
	done := p.Table.RegisterInitializer(txn, "masquerade-desired")
	txn.Commit()
	p.Jobs.Add(job.OneShot("desired", func(ctx context.Context, h cell.Health) error {
		if !p.Config.EnableMasquerade {
			wtxn := p.DB.WriteTxn(p.Table)
			done(wtxn)
			wtxn.Commit()
			h.OK("Disabled (--enable-masquerade=false): no nftables table")
			return nil
		}
		h.OK("Waiting for the nodes table")
		if err := tables.WaitInitialized(ctx, p.DB, p.Nodes); err != nil {
			return nil // stopping
		}
		for {
			all, changed := p.Nodes.AllWatch(p.DB.ReadTxn())
			want := Desired(all, native)
			wtxn := p.DB.WriteTxn(p.Table)
			write(wtxn, p.Table, want)
			if done != nil {
				done(wtxn)
				done = nil
			}
			wtxn.Commit()
			src, excl := count(want)
			if src == 0 {
				h.OK("No pod CIDR on this node yet: nothing to masquerade (the table stays, its sets empty)")
			} else {
				h.OK(fmt.Sprintf("Masquerading %d pod prefixes, %d destinations excluded", src, excl))
			}
			select {
			case <-changed:
			case <-ctx.Done():
				return nil
			}
		}
	}))
	return nil
}

func count(rows []*Prefix) (src, excl int) {
	for _, r := range rows {
		if r.Role == RoleSource {
			src++
		} else {
			excl++
		}
	}
	return
}

// Desired are the rows for the cluster's nodes: this node's pod CIDRs are
// sources; every node's pod CIDRs and addresses, and native, are excluded.
func Desired(all iter.Seq2[*nodes.Node, statedb.Revision], native []netip.Prefix) []*Prefix {
	rows := map[string]*Prefix{}
	add := func(role Role, p netip.Prefix, reason string) {
		k := string(role) + "/" + p.String()
		r := rows[k]
		if r == nil {
			r = &Prefix{Role: role, Prefix: p}
			rows[k] = r
		}
		r.Reasons = append(r.Reasons, reason)
	}
	for n := range all {
		for _, c := range n.PodCIDRs {
			if n.Local {
				add(RoleSource, c.Masked(), "pod CIDR of this node ("+n.Name+")")
			}
			add(RoleExcluded, c.Masked(), "pod CIDR of "+n.Name)
		}
		for _, a := range n.Addresses {
			add(RoleExcluded, netip.PrefixFrom(a.IP, a.IP.BitLen()), "address of "+n.Name)
		}
	}
	for _, p := range native {
		add(RoleExcluded, p, "--native-routing-cidr")
	}
	out := make([]*Prefix, 0, len(rows))
	for _, r := range rows {
		slices.Sort(r.Reasons)
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b *Prefix) int {
		return strings.Compare(string(a.Role)+"/"+a.Prefix.String(), string(b.Role)+"/"+b.Prefix.String())
	})
	return out
}

// write makes the table hold want: a row that is already the same is left
// alone (and not reconciled again).
func write(txn statedb.WriteTxn, tbl statedb.RWTable[*Prefix], want []*Prefix) {
	keep := map[string]bool{}
	for _, w := range want {
		k := string(w.Role) + "/" + w.Prefix.String()
		keep[k] = true
		if old, _, found := tbl.Get(txn, ByRolePrefix.Query(k)); found && slices.Equal(old.Reasons, w.Reasons) {
			continue
		}
		n := w.Clone()
		n.Status = reconciler.StatusPending()
		tbl.Insert(txn, n)
	}
	for r := range tbl.All(txn) {
		if !keep[string(r.Role)+"/"+r.Prefix.String()] {
			tbl.Delete(txn, r)
		}
	}
}

// RulesetOf is what the rows ask of the kernel, masquerade enabled.
func RulesetOf(rows iter.Seq2[*Prefix, statedb.Revision]) Ruleset {
	r := Ruleset{Enabled: true}
	for p := range rows {
		w := &r.V4
		if p.Prefix.Addr().Is6() {
			w = &r.V6
		}
		if p.Role == RoleSource {
			w.Source = append(w.Source, p.Prefix)
		} else {
			w.Excluded = append(w.Excluded, p.Prefix)
		}
	}
	return r
}

// ops write the whole table's ruleset for any change: the ruleset is
// small, and one comparison with the kernel for a batch keeps the writes
// to what differs.
type ops struct {
	enabled bool
	k       *kernelCell
	tbl     statedb.Table[*Prefix]
	log     *slog.Logger
	repairs *drift.Repairs
}

// sync makes the kernel match the rows. repair: the rows did not change
// (a prune, a refresh), so whatever had to be written had been changed
// behind the agent's back.
func (o *ops) sync(txn statedb.ReadTxn, repair bool) error {
	want := RulesetOf(o.tbl.All(txn))
	want.Enabled = o.enabled
	changed, err := o.k.Sync(want)
	if repair && o.enabled && len(changed) > 0 {
		o.repairs.Repaired("nft", strings.Join(changed, "; "))
		return err
	}
	for _, c := range changed {
		o.log.Info("nftables", "changed", c)
	}
	return err
}

func (o *ops) Update(_ context.Context, txn statedb.ReadTxn, _ statedb.Revision, p *Prefix) error {
	return o.sync(txn, drift.IsRepair(p.Status))
}

func (o *ops) Delete(_ context.Context, txn statedb.ReadTxn, _ statedb.Revision, _ *Prefix) error {
	return o.sync(txn, false)
}

// Prune removes what the agent's table holds that the rows do not ask for,
// and the table itself with no rows (masquerade disabled). It also puts
// back what was removed from the table, or the table itself: it runs
// periodically and after every nftables change that may have touched it.
func (o *ops) Prune(_ context.Context, txn statedb.ReadTxn, _ iter.Seq2[*Prefix, statedb.Revision]) error {
	return o.sync(txn, true)
}

func (o *ops) UpdateBatch(_ context.Context, txn statedb.ReadTxn, batch []reconciler.BatchEntry[*Prefix]) {
	repair := true
	for i := range batch {
		repair = repair && drift.IsRepair(batch[i].Object.Status)
	}
	err := o.sync(txn, repair)
	for i := range batch {
		batch[i].Result = err
	}
}

func (o *ops) DeleteBatch(_ context.Context, txn statedb.ReadTxn, batch []reconciler.BatchEntry[*Prefix]) {
	err := o.sync(txn, false)
	for i := range batch {
		batch[i].Result = err
	}
}

// newRepairs counts what the masquerade cell puts back in the kernel.
func newRepairs(log *slog.Logger) *drift.Repairs { return drift.NewRepairs(log, "masquerade") }

func repairMetrics(r *drift.Repairs) metrics.Collectors { return r.Collectors() }

func registerReconciler(p reconciler.Params, cfg Config, devCfg devices.Config, log *slog.Logger, k *kernelCell, tbl statedb.RWTable[*Prefix], repairs *drift.Repairs) error {
	o := &ops{enabled: cfg.EnableMasquerade, k: k, tbl: tbl, log: log, repairs: repairs}
	rec, err := reconciler.Register(p, tbl, (*Prefix).Clone,
		func(x *Prefix, s reconciler.Status) *Prefix { x.Status = s; return x },
		(*Prefix).status, o, o, reconciler.WithName("nftables"))
	if err != nil || !cfg.EnableMasquerade {
		return err
	}
	// A change to the agent's table (`nft delete table inet cellium`, a
	// rule or set removed) has the reconciler prune, which compares the
	// whole table with the rows and puts back what differs.
	f := &drift.NFTables{Netns: devCfg.DevicesNetns, Family: nftables.TableFamilyINet, Table: TableName, Changed: rec.Prune}
	p.JobGroup.Add(job.OneShot("nftables-changes", f.Run, drift.Retry))
	return nil
}

// Remove deletes the agent's nftables table in the namespace of cfg, for
// `agent cleanup`: the datapath keeps masquerading while the agent is
// down, until this runs. It returns one line per object removed.
func Remove(cfg devices.Config) ([]string, error) {
	fd := -1
	if cfg.DevicesNetns != "" {
		ns, err := netns.GetFromPath(cfg.DevicesNetns)
		if err != nil {
			return nil, fmt.Errorf("--devices-netns %s: %w", cfg.DevicesNetns, err)
		}
		defer ns.Close()
		fd = int(ns)
	}
	removed, err := NewKernel(fd).Remove()
	if err != nil || !removed {
		return nil, err
	}
	return []string{"removed nftables table inet " + TableName}, nil
}
