package loader_test

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/vishvananda/netlink"

	"github.com/cellium/cellium/bpf"
	"github.com/cellium/cellium/cells/bpfmaps/bpfmapstest"
	"github.com/cellium/cellium/cells/devices"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/internal/logtest"
	"github.com/cellium/cellium/cells/lbmaps"
	"github.com/cellium/cellium/cells/loader/socklbtest"
	"github.com/cellium/cellium/cells/routing"
	"github.com/cellium/cellium/pkg/nettest"
	"github.com/cellium/cellium/pkg/nodeportmap"
	"github.com/cellium/cellium/pkg/polltest"
)

// nodePortHooks are the device hooks: pin suffix, attach type and program.
var nodePortHooks = []struct {
	name, program string
	attach        ebpf.AttachType
}{
	{"ingress", bpf.NodePortProgCelliumNodeportIngress, ebpf.AttachTCXIngress},
	{"egress", bpf.NodePortProgCelliumNodeportEgress, ebpf.AttachTCXEgress},
}

// addDevice makes a veth pair in the test's namespace, which the devices
// table describes, and returns the ifindex of one end there.
func addDevice(t *testing.T, env *socklbtest.Env) (string, int) {
	t.Helper()
	name := fmt.Sprintf("npdev%06x", rand.Uint32()&0xffffff)
	return name, addDeviceNamed(t, env, name)
}

// addDeviceNamed is addDevice with the name name.
func addDeviceNamed(t *testing.T, env *socklbtest.Env, name string) int {
	t.Helper()
	var index int
	err := nettest.Do(env.NetNS, func() error {
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}
		if err := netlink.LinkAdd(veth); err != nil {
			return err
		}
		l, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		index = l.Attrs().Index
		return netlink.LinkSetUp(l)
	})
	if err != nil {
		t.Fatal(err)
	}
	return index
}

// waitPin waits until pin exists.
func waitPin(t *testing.T, pin string) {
	t.Helper()
	polltest.Until(t, "pin "+pin, 10*time.Second, 10*time.Millisecond, func() (bool, string) {
		_, err := os.Stat(pin)
		return err == nil, fmt.Sprint(err)
	})
}

func putDevice(t *testing.T, d *socklbtest.Devices, name string, index int, selected bool) {
	t.Helper()
	putDeviceAddr(t, d, name, index, selected, deviceAddr(index))
}

// putDeviceAddr is putDevice with the IPv4 address addr.
func putDeviceAddr(t *testing.T, d *socklbtest.Devices, name string, index int, selected bool, addr netip.Addr) {
	t.Helper()
	txn := d.DB.WriteTxn(d.Table)
	dev := &devices.Device{Index: index, Name: name, Type: "veth", Flags: net.FlagUp, Selected: selected,
		Addrs: []devices.DeviceAddress{
			{Addr: netip.MustParseAddr("fd00:90::11"), PrefixLen: 64, Scope: devices.ScopeGlobal},
			{Addr: addr, PrefixLen: 24, Scope: devices.ScopeGlobal},
		}}
	if _, _, err := d.Table.Insert(txn, dev); err != nil {
		t.Fatal(err)
	}
	txn.Commit()
}

// modifyDevice changes the row of the device ifindex with fn.
func modifyDevice(t *testing.T, d *socklbtest.Devices, ifindex int, fn func(*devices.Device)) {
	t.Helper()
	txn := d.DB.WriteTxn(d.Table)
	old, _, found := d.Table.Get(txn, devices.DeviceIfIndex.Query(ifindex))
	if !found {
		txn.Abort()
		t.Fatalf("no device %d in the devices table", ifindex)
	}
	dev := *old
	fn(&dev)
	if _, _, err := d.Table.Insert(txn, &dev); err != nil {
		t.Fatal(err)
	}
	txn.Commit()
}

// deviceAddr is the IPv4 address the test gives the device ifindex.
func deviceAddr(ifindex int) netip.Addr { return netip.AddrFrom4([4]byte{10, 90, 0, byte(ifindex)}) }

// nodeAddresses are the entries of the NodePort programs' devices map.
func nodeAddresses(t *testing.T, root string) map[uint32]netip.Addr {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(root, "cellium", nodeportmap.DevicesMapName), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	got := map[uint32]netip.Addr{}
	var (
		ifindex uint32
		dev     nodeportmap.Device4
	)
	it := m.Iterate()
	for it.Next(&ifindex, &dev) {
		got[ifindex] = dev.Address.Addr()
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return got
}

// waitDeviceLinks waits until the pins of ifindex's device links are there
// (want) or gone, and checks that present ones are tcx links on that
// device running the NodePort programs.
func waitDeviceLinks(t *testing.T, root string, ifindex int, want bool) {
	t.Helper()
	for _, h := range nodePortHooks {
		pin := filepath.Join(root, "cellium", "links", "devices", strconv.Itoa(ifindex)+"-"+h.name)
		polltest.Until(t, fmt.Sprintf("pin %s present = %v", pin, want), 10*time.Second, 10*time.Millisecond, func() (bool, string) {
			_, err := os.Stat(pin)
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				t.Fatal(err)
			}
			return (err == nil) == want, fmt.Sprintf("present = %v", err == nil)
		})
		if !want {
			continue
		}
		lnk, err := link.LoadPinnedLink(pin, nil)
		if err != nil {
			t.Fatal(err)
		}
		info, err := lnk.Info()
		lnk.Close()
		if err != nil {
			t.Fatal(err)
		}
		tcx := info.TCX()
		if tcx == nil || int(tcx.Ifindex) != ifindex || ebpf.AttachType(tcx.AttachType) != h.attach {
			t.Fatalf("pin %s: %v link %+v, want tcx %s on ifindex %d", pin, info.Type, tcx, h.attach, ifindex)
		}
		prog, err := ebpf.NewProgramFromID(info.Program)
		if err != nil {
			t.Fatal(err)
		}
		pinfo, err := prog.Info()
		prog.Close()
		if err != nil {
			t.Fatal(err)
		}
		if pinfo.Name != h.program {
			t.Errorf("pin %s runs program %q, want %q", pin, pinfo.Name, h.program)
		}
	}
}

// TestNodePortDevicePrograms: the NodePort programs go onto selected
// devices, not onto the others, stay attached through a restart, and come
// off a device that is no longer selected, off every device with
// --enable-nodeport=false, and with `agent cleanup`.
func TestNodePortDevicePrograms(t *testing.T) {
	env := socklbtest.New(t)
	root := bpfmapstest.Root(t)
	selectedName, selected := addDevice(t, env)
	otherName, other := addDevice(t, env)
	tunnel := addDeviceNamed(t, env, routing.TunnelDevice)

	var (
		rec    = logtest.NewRecorder(hivetest.Logger(t).Handler())
		passes func() float64
	)
	start := func(enabled bool) (*socklbtest.Devices, func()) {
		var (
			devs *socklbtest.Devices
			maps *lbmaps.Maps
		)
		h := env.Datapath(root, &maps, cell.Invoke(func(d *socklbtest.Devices, m celltest.Metrics) {
			devs = d
			passes = func() float64 {
				v, _ := m.Value(t, "cellium_nodeport_program_passes_total")
				return v
			}
		}))
		h.Viper().Set("enable-nodeport", enabled)
		stop := startLogging(t, h, slog.New(rec))
		return devs, stop
	}

	devs, stop := start(true)
	putDevice(t, devs, selectedName, selected, true)
	putDevice(t, devs, otherName, other, false)
	devs.Listed()
	waitDeviceLinks(t, root, selected, true)
	waitDeviceLinks(t, root, other, false)
	// The tunnel device, never selected, gets the egress program alone.
	tunnelPin := filepath.Join(root, "cellium", "links", "devices", strconv.Itoa(tunnel)+"-")
	putDevice(t, devs, routing.TunnelDevice, tunnel, false)
	waitPin(t, tunnelPin+"egress")
	if _, err := os.Stat(tunnelPin + "ingress"); err == nil {
		t.Errorf("the tunnel device has an ingress program")
	}
	if got, want := nodeAddresses(t, root), map[uint32]netip.Addr{uint32(selected): deviceAddr(selected)}; !reflect.DeepEqual(got, want) {
		t.Errorf("node addresses of the devices map: %v, want %v (the selected device's IPv4 address)", got, want)
	}

	// Devices that are not selected (a pod's new veth, a change of one)
	// do not make the job redo its work, nor does a change of the tunnel
	// device that leaves what the job uses of it alone (its MTU); the
	// selected device's new address does, once.
	passesBefore := passes()
	vethName, veth := addDevice(t, env)
	putDevice(t, devs, vethName, veth, false)
	putDeviceAddr(t, devs, otherName, other, false, netip.MustParseAddr("10.90.1.1"))
	modifyDevice(t, devs, tunnel, func(d *devices.Device) { d.MTU = 1400 })
	rev := devs.Table.Revision(devs.DB.ReadTxn())
	celltest.Eventually(t, "the NodePort job to have read the tunnel device's change", func() (bool, string) {
		return rec.Find("NodePort devices unchanged, no pass", "revision", strconv.FormatUint(rev, 10)) != nil, "no such log line"
	})
	if n := passes() - passesBefore; n != 0 {
		t.Errorf("%v passes of the NodePort job for changes of unselected devices and the tunnel device's MTU, want none", n)
	}
	newAddr := netip.MustParseAddr("10.90.2.1")
	putDeviceAddr(t, devs, selectedName, selected, true, newAddr)
	celltest.Eventually(t, "the selected device's new address in the devices map", func() (bool, string) {
		got := nodeAddresses(t, root)
		return got[uint32(selected)] == newAddr, fmt.Sprint(got)
	})
	if n := passes() - passesBefore; n != 1 {
		t.Errorf("%v passes of the NodePort job after the selected device's address changed, want 1", n)
	}
	putDevice(t, devs, selectedName, selected, true)
	celltest.Eventually(t, "the selected device's address back in the devices map", func() (bool, string) {
		got := nodeAddresses(t, root)
		return got[uint32(selected)] == deviceAddr(selected), fmt.Sprint(got)
	})
	before := deviceLinkIDs(t, root, selected)
	stop()

	// A restarted agent moves the pinned links to its programs: the same
	// links, so the device is never without them.
	devs, stop = start(true)
	putDevice(t, devs, selectedName, selected, true)
	putDevice(t, devs, otherName, other, false)
	devs.Listed()
	waitDeviceLinks(t, root, selected, true)
	if after := deviceLinkIDs(t, root, selected); after != before {
		t.Errorf("links after the restart %v, want the same as before %v", after, before)
	}

	putDevice(t, devs, selectedName, selected, false)
	waitDeviceLinks(t, root, selected, false)
	if got := nodeAddresses(t, root); len(got) != 0 {
		t.Errorf("node addresses of the devices map with no device selected: %v", got)
	}
	putDevice(t, devs, selectedName, selected, true)
	waitDeviceLinks(t, root, selected, true)
	stop()

	// --enable-nodeport=false takes them off.
	_, stop = start(false)
	waitDeviceLinks(t, root, selected, false)
	if n := tcxPrograms(t, env, selected); n != 0 {
		t.Errorf("%d tcx programs on the device with --enable-nodeport=false, want none", n)
	}
	stop()

	// `agent cleanup` detaches them.
	devs, stop = start(true)
	putDevice(t, devs, selectedName, selected, true)
	devs.Listed()
	waitDeviceLinks(t, root, selected, true)
	stop()
	if n := tcxPrograms(t, env, selected); n != 2 {
		t.Errorf("%d tcx programs on the device while the agent is down, want its 2", n)
	}
	text, _ := agentCleanup(t, env, root)
	if want := filepath.Join("links", "devices", strconv.Itoa(selected)+"-ingress"); !strings.Contains(text, want) {
		t.Errorf("cleanup report does not mention %s:\n%s", want, text)
	}
	if n := tcxPrograms(t, env, selected); n != 0 {
		t.Errorf("%d tcx programs on the device after cleanup, want none", n)
	}
}

// tcxPrograms counts the tcx programs, both directions, on the device
// ifindex of the test's namespace.
func tcxPrograms(t *testing.T, env *socklbtest.Env, ifindex int) int {
	t.Helper()
	n := 0
	err := nettest.Do(env.NetNS, func() error {
		for _, h := range nodePortHooks {
			res, err := link.QueryPrograms(link.QueryOptions{Target: ifindex, Attach: h.attach})
			if err != nil {
				return err
			}
			n += len(res.Programs)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// deviceLinkIDs are the IDs of the links pinned for ifindex's device.
func deviceLinkIDs(t *testing.T, root string, ifindex int) [2]link.ID {
	t.Helper()
	var ids [2]link.ID
	for i, h := range nodePortHooks {
		lnk, err := link.LoadPinnedLink(filepath.Join(root, "cellium", "links", "devices", strconv.Itoa(ifindex)+"-"+h.name), nil)
		if err != nil {
			t.Fatal(err)
		}
		info, err := lnk.Info()
		lnk.Close()
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = info.ID
	}
	return ids
}
