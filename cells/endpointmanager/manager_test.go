package endpointmanager_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/pkg/nettest"
)

// A created endpoint has its addresses in the pod, routes through the
// router address, which the pod reaches, and a state file; deleting it
// removes all of that and releases the addresses.
func TestCreateAndDelete(t *testing.T) {
	tn := newTestNet(t)
	n := tn.start(t, nodeOpts{})
	p := newPod(t)

	ep := n.create(t, p)
	if ep.ID != 1 || ep.IPv4 != nth(tn.v4, 1) || ep.IPv6 != nth(tn.v6, 1) || ep.State != endpointmanager.Ready ||
		ep.HostIfName != endpointmanager.HostIfName(p.id) || len(ep.MAC) != 6 || ep.HostIfIndex == 0 {
		t.Fatalf("created endpoint = %+v", ep)
	}
	if _, problems, err := n.mgr.Check(context.Background(), endpointmanager.Selector{ContainerID: p.id}); err != nil || len(problems) > 0 {
		t.Fatalf("check of a new endpoint = %v, %v; want no problems", problems, err)
	}
	for _, dst := range []string{router(tn.v4).String(), router(tn.v6).String()} {
		if err := nettest.Ping(p.ns.Path(), mustAddr(dst), 5*time.Second); err != nil {
			t.Errorf("pod to its router: %v", err)
		}
	}
	host, err := netlink.LinkByName(ep.HostIfName)
	if err != nil || host.Attrs().MTU != 1500 || host.Attrs().Flags&net.FlagUp == 0 {
		t.Fatalf("host side %s: %v, %v; want an up link with MTU 1500", ep.HostIfName, host, err)
	}
	var file struct {
		Phase string `json:"phase"`
		IPv4  string `json:"ipv4"`
	}
	stateFile := filepath.Join(n.stateDir, "endpoints", "1", "endpoint.json")
	if data, err := os.ReadFile(stateFile); err != nil || json.Unmarshal(data, &file) != nil || file.Phase != "ready" || file.IPv4 != ep.IPv4.String() {
		t.Fatalf("state file %s: %s, %v", stateFile, data, err)
	}
	n.waitAllocations(t, ep.IPv4.String()+" "+p.id+" in-use", ep.IPv6.String()+" "+p.id+" in-use")

	d, err := n.mgr.Delete(context.Background(), endpointmanager.Selector{ContainerID: p.id})
	if err != nil || d.Endpoint == nil || len(d.Released) != 2 {
		t.Fatalf("delete = %+v, %v; want the endpoint and its two addresses", d, err)
	}
	if _, err := netlink.LinkByName(ep.HostIfName); err == nil {
		t.Errorf("host side %s still exists after delete", ep.HostIfName)
	}
	err = p.ns.Do(func(ns.NetNS) error { _, err := netlink.LinkByName("eth0"); return err })
	if err == nil {
		t.Errorf("eth0 still exists in the pod after delete")
	}
	if _, err := os.Stat(filepath.Dir(stateFile)); !os.IsNotExist(err) {
		t.Errorf("state directory after delete: %v, want it removed", err)
	}
	n.waitAllocations(t)
	if ids := n.endpointIDs(); len(ids) != 0 {
		t.Errorf("endpoints after delete: %v", ids)
	}
	if _, err := n.mgr.Delete(context.Background(), endpointmanager.Selector{ContainerID: p.id}); !errors.Is(err, endpointmanager.ErrNotFound) {
		t.Errorf("second delete = %v, want ErrNotFound", err)
	}
}

func TestCreateEndpointIDsAndAddressesAreDistinct(t *testing.T) {
	tn := newTestNet(t)
	n := tn.start(t, nodeOpts{})
	seen := map[string]bool{}
	for i := range 3 {
		ep := n.create(t, newPod(t))
		if ep.ID != uint16(i+1) {
			t.Errorf("endpoint %d got ID %d", i, ep.ID)
		}
		for _, k := range []string{strconv.Itoa(int(ep.ID)), ep.IPv4.String(), ep.IPv6.String(), ep.HostIfName} {
			if seen[k] {
				t.Errorf("%s given twice", k)
			}
			seen[k] = true
		}
	}
}
