package loader

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"iter"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"

	"github.com/cellium/cellium/bpf"
	"github.com/cellium/cellium/cells/bpfmaps"
	"github.com/cellium/cellium/cells/ctmaps"
	"github.com/cellium/cellium/cells/devices"
	"github.com/cellium/cellium/cells/endpointmaps"
	"github.com/cellium/cellium/cells/lbmaps"
	"github.com/cellium/cellium/cells/metrics"
	"github.com/cellium/cellium/cells/routing"
	"github.com/cellium/cellium/pkg/lbmap"
	"github.com/cellium/cellium/pkg/netnsrun"
	"github.com/cellium/cellium/pkg/nodeportmap"
)

// The NodePort programs of bpf/nodeport.c run on the node's selected
// devices (the devices table), one pair per device: tcx ingress translates
// what outside clients send to a service frontend, tcx egress translates
// the replies back. Their links are pinned in links/devices/ as
// <ifindex>-ingress and <ifindex>-egress, so they outlive the agent and a
// restarted agent moves them to its own programs; a device that is no
// longer selected, or gone, loses its pins once the devices table is
// initialized. They need tcx (Linux 6.6+): without it the devices get no
// programs and the cell's health says so.

const deviceLinksSubdir = "devices"

func deviceLinksDir(reg *bpfmaps.Registry) string {
	return filepath.Join(linksDir(reg), deviceLinksSubdir)
}

var (
	// nodePortIngress translates what arrives on a device.
	nodePortIngress = endpointHook{"ingress", ebpf.AttachTCXIngress, netlink.HANDLE_MIN_INGRESS}
	// nodePortEgress translates the replies that leave by it.
	nodePortEgress = endpointHook{"egress", ebpf.AttachTCXEgress, netlink.HANDLE_MIN_EGRESS}
	nodePortHooks  = []endpointHook{nodePortIngress, nodePortEgress}
)

var nodePortProgramNames = map[endpointHook]string{
	nodePortIngress: bpf.NodePortProgCelliumNodeportIngress,
	nodePortEgress:  bpf.NodePortProgCelliumNodeportEgress,
}

func devicePinName(ifindex int, h endpointHook) string { return strconv.Itoa(ifindex) + "-" + h.name }

// nodePortMaps are the NodePort programs' own maps: the NAT map, which
// the programs write, and the selected devices' node addresses, which the
// NodePort job writes.
type nodePortMaps struct {
	NAT     *bpfmaps.Map[nodeportmap.Key4, nodeportmap.NAT4]
	Devices *bpfmaps.Map[uint32, nodeportmap.Device4]
	// DSR is the endpoint programs' map of the DSR connections to this
	// node's pods (the NodePort programs share dsr.h, which declares it).
	DSR *bpfmaps.Map[nodeportmap.DSRKey4, nodeportmap.DSR4]
}

// maxDevices is the size of the devices map: selected devices.
const maxDevices = 256

func newNodePortMaps(cfg Config, lc cell.Lifecycle, reg *bpfmaps.Registry) (*nodePortMaps, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	var (
		m   nodePortMaps
		err error
	)
	m.NAT, err = bpfmaps.NewMap[nodeportmap.Key4, nodeportmap.NAT4](lc, reg, bpfmaps.Spec{
		Name: nodeportmap.MapName, Type: ebpf.LRUHash, MaxEntries: cfg.LBNodePortNATMapMax,
	})
	if err != nil {
		return nil, err
	}
	m.Devices, err = bpfmaps.NewMap[uint32, nodeportmap.Device4](lc, reg, bpfmaps.Spec{
		Name: nodeportmap.DevicesMapName, Type: ebpf.Hash, MaxEntries: maxDevices,
	})
	if err != nil {
		return nil, err
	}
	m.DSR, err = bpfmaps.NewMap[nodeportmap.DSRKey4, nodeportmap.DSR4](lc, reg, bpfmaps.Spec{
		Name: nodeportmap.DSRMapName, Type: ebpf.LRUHash, MaxEntries: cfg.LBDSRMapMax,
	})
	if err != nil {
		return nil, err
	}
	return &m, nil
}

// dsrFallbacks reads the loaded NodePort programs' dsr_fallbacks: the
// connections that --lb-mode=dsr sent to a remote backend with SNAT,
// because their first packet could not take the DSR option.
type dsrFallbacks struct{ v atomic.Pointer[ebpf.Variable] }

func newDSRFallbacks() *dsrFallbacks { return &dsrFallbacks{} }

// count is the counter of the programs loaded now; 0 before they are.
func (d *dsrFallbacks) count() uint64 {
	v := d.v.Load()
	if v == nil {
		return 0
	}
	var n uint64
	if err := v.Get(&n); err != nil {
		return 0
	}
	return n
}

// newNodePortMetrics is cellium_nodeport_dsr_fallbacks_total and
// cellium_nodeport_program_passes_total.
func newNodePortMetrics(d *dsrFallbacks, passes nodePortPasses) metrics.Collectors {
	return metrics.NewCollectors(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Namespace: "cellium", Subsystem: "nodeport", Name: "dsr_fallbacks_total",
		Help: "Connections from outside that --lb-mode=dsr sent to a backend on another node with SNAT, their first packet having IPv4 options or no room for the DSR option (since the NodePort programs were loaded)",
	}, func() float64 { return float64(d.count()) }), passes)
}

// nodePortPasses counts the passes of the NodePort job that did its work
// (the devices map's addresses, the attaches, the prune of the pins of
// other devices). Only a change of what a pass reads makes one: the
// selected devices, the tunnel device, the table's initialization.
type nodePortPasses struct{ prometheus.Counter }

func newNodePortPasses() nodePortPasses {
	return nodePortPasses{prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "cellium", Subsystem: "nodeport", Name: "program_passes_total",
		Help: "Passes of the NodePort job over the selected devices (node addresses written, programs attached, other devices' pins pruned), each after a change of those devices or the tunnel device",
	})}
}

// nodePortNATMap provides the NAT map to the ct-gc cell, which deletes
// its expired entries (ctgc.NodePortNAT).
func nodePortNATMap(m *nodePortMaps) *bpfmaps.Map[nodeportmap.Key4, nodeportmap.NAT4] { return m.NAT }

type nodePortParams struct {
	cell.In

	Config    Config
	Log       *slog.Logger
	Lifecycle cell.Lifecycle
	Jobs      job.Group
	DB        *statedb.DB
	Devices   statedb.Table[*devices.Device]
	DevConfig devices.Config
	CTConfig  ctmaps.Config
	Registry  *bpfmaps.Registry
	LB        *lbmaps.Maps
	Endpoints *endpointmaps.EndpointMap
	Maps      *nodePortMaps
	Fallbacks *dsrFallbacks
	Passes    nodePortPasses
	Health    cell.Health
}

// nodePortPrograms loads the programs at start and attaches them to the
// selected devices from a job.
type nodePortPrograms struct {
	p     nodePortParams
	dir   string
	coll  *ebpf.Collection
	progs map[endpointHook]*ebpf.Program
	ids   map[endpointHook]ebpf.ProgramID
}

func registerNodePort(p nodePortParams) {
	n := &nodePortPrograms{p: p, dir: deviceLinksDir(p.Registry)}
	if !p.Config.EnableNodePort {
		p.Jobs.Add(job.OneShot("nodeport-programs", n.disabled))
		return
	}
	p.Lifecycle.Append(n)
	p.Jobs.Add(job.OneShot("nodeport-programs", n.run))
}

var _ cell.HookDescriptiveInterface = (*nodePortPrograms)(nil)

func (n *nodePortPrograms) HookInfo() string { return "NodePort programs" }

func (n *nodePortPrograms) Start(cell.HookContext) error {
	spec, err := bpf.LoadNodePort()
	if err != nil {
		return err
	}
	replacements := n.p.LB.EBPF()
	replacements[n.p.Endpoints.Name()] = n.p.Endpoints.EBPF()
	replacements[n.p.Maps.NAT.Name()] = n.p.Maps.NAT.EBPF()
	replacements[n.p.Maps.Devices.Name()] = n.p.Maps.Devices.EBPF()
	replacements[n.p.Maps.DSR.Name()] = n.p.Maps.DSR.EBPF()
	for name, m := range replacements {
		ms, ok := spec.Maps[name]
		if !ok {
			return fmt.Errorf("the NodePort programs have no map %s", name)
		}
		ms.MaxEntries = m.MaxEntries()
	}
	size := spec.Variables[bpf.NodePortVarMaglevTableSize]
	if size == nil {
		return fmt.Errorf("the NodePort programs have no variable %s", bpf.NodePortVarMaglevTableSize)
	}
	if err := size.Set(uint32(n.p.LB.Maglev4.TableSize())); err != nil {
		return fmt.Errorf("set %s: %w", bpf.NodePortVarMaglevTableSize, err)
	}
	mode := spec.Variables[bpf.NodePortVarLbMode]
	if mode == nil {
		return fmt.Errorf("the NodePort programs have no variable %s", bpf.NodePortVarLbMode)
	}
	if err := mode.Set(n.p.Config.lbModeConstant()); err != nil {
		return fmt.Errorf("set %s: %w", bpf.NodePortVarLbMode, err)
	}
	// The NAT entries live as long as the conntrack entries would.
	for name, value := range n.p.CTConfig.LifetimeConstants() {
		v := spec.Variables[name]
		if v == nil {
			return fmt.Errorf("the NodePort programs have no constant %s", name)
		}
		if err := v.Set(value); err != nil {
			return fmt.Errorf("set %s: %w", name, err)
		}
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{MapReplacements: replacements})
	if err != nil {
		if ve, ok := errors.AsType[*ebpf.VerifierError](err); ok {
			n.p.Log.Error("The verifier refused a NodePort program", "log", fmt.Sprintf("%+v", ve))
		}
		return fmt.Errorf("load the NodePort programs: %w", err)
	}
	n.progs, n.ids = map[endpointHook]*ebpf.Program{}, map[endpointHook]ebpf.ProgramID{}
	for h, name := range nodePortProgramNames {
		prog := coll.Programs[name]
		info, err := prog.Info()
		if err != nil {
			coll.Close()
			return fmt.Errorf("NodePort program %s: %w", name, err)
		}
		id, _ := info.ID()
		n.progs[h], n.ids[h] = prog, id
	}
	n.coll = coll
	n.p.Fallbacks.v.Store(coll.Variables[bpf.NodePortVarDsrFallbacks])
	return nil
}

func (n *nodePortPrograms) Stop(cell.HookContext) error {
	n.p.Fallbacks.v.Store(nil)
	if n.coll != nil {
		n.coll.Close()
		n.coll = nil
	}
	return nil
}

// nodePortDevice is what run derives from one device row: all a pass
// looks at.
type nodePortDevice struct {
	index int
	name  string
	// addr is the node address (nodeAddress4), invalid without one.
	addr netip.Addr
}

// nodePortInputs are the inputs of a pass: the selected devices that are
// up, the tunnel device if up, and whether the devices table is
// initialized. A pass with the same inputs as the last successful one has
// nothing to do.
type nodePortInputs struct {
	selected    []nodePortDevice
	tunnel      []nodePortDevice
	initialized bool
}

func (a nodePortInputs) equal(b nodePortInputs) bool {
	return a.initialized == b.initialized && slices.Equal(a.selected, b.selected) && slices.Equal(a.tunnel, b.tunnel)
}

// nodePortWatches are what run waits on for the next change of its
// inputs.
type nodePortWatches struct {
	selected, tunnel, init <-chan struct{}
}

// inputs reads the inputs of a pass and what to wait on for their next
// change: the selected devices and the tunnel device (through the
// selected and name indexes, so the veths of pods, never selected, do not
// wake the job), and the table's initialization until it is done.
func (n *nodePortPrograms) inputs(txn statedb.ReadTxn) (nodePortInputs, nodePortWatches) {
	var (
		in nodePortInputs
		w  nodePortWatches
	)
	var sel, tun iter.Seq2[*devices.Device, statedb.Revision]
	sel, w.selected = n.p.Devices.ListWatch(txn, devices.DeviceSelected.Query(true))
	for d := range sel {
		if !d.Up() {
			continue
		}
		a, _ := nodeAddress4(d)
		in.selected = append(in.selected, nodePortDevice{index: d.Index, name: d.Name, addr: a})
	}
	tun, w.tunnel = n.p.Devices.ListWatch(txn, devices.DeviceName.Query(routing.TunnelDevice))
	for d := range tun {
		if d.Up() {
			in.tunnel = append(in.tunnel, nodePortDevice{index: d.Index, name: d.Name})
		}
	}
	in.initialized, w.init = n.p.Devices.Initialized(txn)
	if in.initialized {
		// Once initialized, the channel stays closed: waiting on it
		// would spin.
		w.init = nil
	}
	return in, w
}

// run attaches the programs to every selected device that is up whenever
// the selected devices or the tunnel device change, and prunes the pins of
// the others once the table is initialized. Changes of other devices (the
// veths of pods) do not wake it, and a wake-up with the inputs of the last
// successful pass does nothing. A failure is retried after a second.
func (n *nodePortPrograms) run(ctx context.Context, health cell.Health) error {
	var (
		last   nodePortInputs
		ran    bool
		failed bool
	)
	for {
		txn := n.p.DB.ReadTxn()
		in, w := n.inputs(txn)
		if !ran || failed || !in.equal(last) {
			err := n.pass(in)
			if err != nil {
				health.Degraded("NodePort programs", err)
			} else {
				health.OK(fmt.Sprintf("NodePort programs on %d devices", len(in.selected)))
			}
			last, ran, failed = in, true, err != nil
		} else {
			n.p.Log.Debug("NodePort devices unchanged, no pass", "revision", n.p.Devices.Revision(txn))
		}
		var retry <-chan time.Time
		if failed {
			retry = time.After(time.Second)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-w.selected:
		case <-w.tunnel:
		case <-w.init:
		case <-retry:
		}
	}
}

// pass writes the node addresses of the selected devices, attaches the
// programs to them and the egress program to the tunnel device, and once
// the devices table is initialized prunes what other devices have.
func (n *nodePortPrograms) pass(in nodePortInputs) error {
	n.p.Passes.Inc()
	addrs := map[uint32]nodeportmap.Device4{}
	for _, d := range in.selected {
		if d.addr.IsValid() {
			addrs[uint32(d.index)] = nodeportmap.Device4{Address: lbmap.NewAddr4(d.addr)}
		}
	}
	// The addresses first: a program must not see a device without
	// the address it sends connections to remote backends from.
	var errs []error
	if err := n.writeAddresses(addrs, in.initialized); err != nil {
		errs = append(errs, err)
	}
	want := map[string]bool{}
	for _, d := range in.selected {
		for _, h := range nodePortHooks {
			want[devicePinName(d.index, h)] = true
			how, err := n.attach(d.index, h)
			if err != nil {
				errs = append(errs, fmt.Errorf("device %s (ifindex %d): attach the NodePort %s program: %w", d.name, d.index, h.name, err))
				continue
			}
			if how != "" {
				n.p.Log.Info("Attached NodePort program", "device", d.name, "ifindex", d.index, "hook", h.name, "link", how)
			}
		}
	}
	// A local backend's reply to a client that is a pod of another
	// node leaves through the tunnel device, not a selected one: the
	// egress program translates it there, before encapsulation.
	for _, d := range in.tunnel {
		want[devicePinName(d.index, nodePortEgress)] = true
		how, err := n.attach(d.index, nodePortEgress)
		if err != nil {
			errs = append(errs, fmt.Errorf("tunnel device %s (ifindex %d): attach the NodePort egress program: %w", d.name, d.index, err))
		} else if how != "" {
			n.p.Log.Info("Attached NodePort program", "device", d.name, "ifindex", d.index, "hook", nodePortEgress.name, "link", how)
		}
	}
	if in.initialized {
		if err := n.prune(want); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// disabled detaches what an agent with --enable-nodeport left.
func (n *nodePortPrograms) disabled(_ context.Context, health cell.Health) error {
	if err := n.prune(nil); err != nil {
		health.Degraded("Disabled (--enable-nodeport=false), but detaching the NodePort programs failed", err)
		return err
	}
	health.OK("Disabled (--enable-nodeport=false): no programs on the devices")
	return nil
}

// nodeAddress4 is the device's first global IPv4 address, which the
// NodePort programs send connections to remote backends from.
func nodeAddress4(d *devices.Device) (netip.Addr, bool) {
	for _, a := range d.Addrs {
		if a.Addr.Is4() && a.Scope == devices.ScopeGlobal && !a.Secondary {
			return a.Addr, true
		}
	}
	return netip.Addr{}, false
}

// writeAddresses makes the devices map hold want; entries of other devices
// go once the devices table is initialized.
func (n *nodePortPrograms) writeAddresses(want map[uint32]nodeportmap.Device4, initialized bool) error {
	m := n.p.Maps.Devices
	var errs []error
	for ifindex, dev := range want {
		if err := m.Put(ifindex, dev); err != nil {
			errs = append(errs, fmt.Errorf("write the node address of ifindex %d: %w", ifindex, err))
		}
	}
	if !initialized {
		return errors.Join(errs...)
	}
	var stale []uint32
	var (
		ifindex uint32
		dev     nodeportmap.Device4
	)
	it := m.EBPF().Iterate()
	for it.Next(&ifindex, &dev) {
		if _, ok := want[ifindex]; !ok {
			stale = append(stale, ifindex)
		}
	}
	if err := it.Err(); err != nil {
		errs = append(errs, err)
	}
	for _, ifindex := range stale {
		if err := m.Delete(ifindex); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// attach makes the link pinned for the device at hook h run the hook's
// program, and says how, as endpointLinks.attach does.
func (n *nodePortPrograms) attach(ifindex int, h endpointHook) (string, error) {
	if err := os.MkdirAll(n.dir, 0o700); err != nil {
		return "", fmt.Errorf("create the device link directory: %w", err)
	}
	prog, progID := n.progs[h], n.ids[h]
	pin := filepath.Join(n.dir, devicePinName(ifindex, h))
	old, err := link.LoadPinnedLink(pin, nil)
	switch {
	case err == nil:
		defer old.Close()
		why, current := unusableTCX(old, h, ifindex)
		if why == "" {
			if current == progID {
				return "", nil
			}
			if err := old.Update(prog); err == nil {
				return "updated", nil
			}
		}
	case !errors.Is(err, fs.ErrNotExist):
		n.p.Log.Warn("Replacing a pin that is no usable link", "pin", pin, "error", err)
	}
	var lnk link.Link
	err = n.inDevicesNetns(func() (err error) {
		lnk, err = link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: prog, Attach: h.attach})
		return err
	})
	if errors.Is(err, ebpf.ErrNotSupported) {
		return "", fmt.Errorf("NodePort from outside needs tcx (Linux 6.6+): %w", err)
	}
	if err != nil {
		return "", err
	}
	defer lnk.Close()
	if err := pinReplacing(lnk, pin); err != nil {
		return "", err
	}
	if old == nil {
		return "attached", nil
	}
	if err := old.Detach(); err != nil {
		n.p.Log.Warn("Detach a replaced device link", "pin", pin, "error", err)
	}
	return "replaced", nil
}

// prune detaches the links of devices that are gone or no longer
// selected.
func (n *nodePortPrograms) prune(want map[string]bool) error {
	return pruneLinks(n.dir, want, func(what string) {
		n.p.Log.Info("Detached the NodePort program of a device that is no longer selected", "link", what)
	})
}

// inDevicesNetns runs fn in the namespace whose devices the devices table
// holds (--devices-netns, for tests), where their ifindexes mean them.
func (n *nodePortPrograms) inDevicesNetns(fn func() error) error {
	path := n.p.DevConfig.DevicesNetns
	if path == "" {
		return fn()
	}
	return netnsrun.Do(path, fn)
}
