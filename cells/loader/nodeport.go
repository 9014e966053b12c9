package loader

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/vishvananda/netlink"

	"github.com/cellium/cellium/bpf"
	"github.com/cellium/cellium/cells/bpfmaps"
	"github.com/cellium/cellium/cells/ctmaps"
	"github.com/cellium/cellium/cells/devices"
	"github.com/cellium/cellium/cells/endpointmaps"
	"github.com/cellium/cellium/cells/lbmaps"
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
	return &m, nil
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
	return nil
}

func (n *nodePortPrograms) Stop(cell.HookContext) error {
	if n.coll != nil {
		n.coll.Close()
		n.coll = nil
	}
	return nil
}

// run attaches the programs to every selected device that is up whenever
// the devices table changes, and prunes the pins of the others once the
// table is initialized. A failure is retried after a second.
func (n *nodePortPrograms) run(ctx context.Context, health cell.Health) error {
	for {
		txn := n.p.DB.ReadTxn()
		devs, watch := n.p.Devices.AllWatch(txn)
		initialized, initWatch := n.p.Devices.Initialized(txn)
		var selected, tunnel []*devices.Device
		addrs := map[uint32]nodeportmap.Device4{}
		for d := range devs {
			if d.Name == routing.TunnelDevice && d.Up() {
				tunnel = append(tunnel, d)
			}
			if !d.Selected || !d.Up() {
				continue
			}
			selected = append(selected, d)
			if a, ok := nodeAddress4(d); ok {
				addrs[uint32(d.Index)] = nodeportmap.Device4{Address: lbmap.NewAddr4(a)}
			}
		}
		// The addresses first: a program must not see a device without
		// the address it sends connections to remote backends from.
		var errs []error
		if err := n.writeAddresses(addrs, initialized); err != nil {
			errs = append(errs, err)
		}
		want := map[string]bool{}
		attached := 0
		for _, d := range selected {
			for _, h := range nodePortHooks {
				want[devicePinName(d.Index, h)] = true
				how, err := n.attach(d.Index, h)
				if err != nil {
					errs = append(errs, fmt.Errorf("device %s (ifindex %d): attach the NodePort %s program: %w", d.Name, d.Index, h.name, err))
					continue
				}
				if how != "" {
					n.p.Log.Info("Attached NodePort program", "device", d.Name, "ifindex", d.Index, "hook", h.name, "link", how)
				}
			}
			attached++
		}
		// A local backend's reply to a client that is a pod of another
		// node leaves through the tunnel device, not a selected one: the
		// egress program translates it there, before encapsulation.
		for _, d := range tunnel {
			want[devicePinName(d.Index, nodePortEgress)] = true
			how, err := n.attach(d.Index, nodePortEgress)
			if err != nil {
				errs = append(errs, fmt.Errorf("tunnel device %s (ifindex %d): attach the NodePort egress program: %w", d.Name, d.Index, err))
			} else if how != "" {
				n.p.Log.Info("Attached NodePort program", "device", d.Name, "ifindex", d.Index, "hook", nodePortEgress.name, "link", how)
			}
		}
		if initialized {
			if err := n.prune(want); err != nil {
				errs = append(errs, err)
			}
		}
		var retry <-chan time.Time
		if err := errors.Join(errs...); err != nil {
			health.Degraded("NodePort programs", err)
			retry = time.After(time.Second)
		} else {
			health.OK(fmt.Sprintf("NodePort programs on %d devices", attached))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-watch:
		case <-initWatch:
		case <-retry:
		}
	}
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
