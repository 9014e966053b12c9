package devices_test

import (
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/cellium/cellium/cells/devices"
)

// testNetns is a network namespace the test creates, and a netlink handle
// into it. Everything the test adds there goes away with the namespace.
type testNetns struct {
	// path opens the namespace: /proc/<pid>/fd/<fd> of the handle the test
	// holds, so no bind mount is left behind.
	path string
	nl   *netlink.Handle
}

func newTestNetns(t testing.TB) *testNetns {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("creating a network namespace needs root")
	}
	var (
		ns  netns.NsHandle
		err error
	)
	created := make(chan struct{})
	go func() {
		defer close(created)
		// The thread moves into the new namespace and stays locked, so Go
		// retires it when the goroutine ends instead of reusing it there.
		runtime.LockOSThread()
		if ns, err = netns.New(); err != nil {
			return
		}
		// No IPv6 link-local addresses (random, from random MACs) and no
		// duplicate address detection (tentative addresses): the tables
		// then read the same in every run. A new namespace inherits IPv4
		// settings from the host, so promotion of secondary addresses is
		// set rather than left to the host.
		for _, sysctl := range []struct{ path, value string }{
			{"ipv6/conf/default/addr_gen_mode", "1"},
			{"ipv6/conf/default/accept_dad", "0"},
			{"ipv4/conf/all/promote_secondaries", "1"},
		} {
			if err = os.WriteFile("/proc/sys/net/"+sysctl.path, []byte(sysctl.value), 0); err != nil {
				return
			}
		}
	}()
	<-created
	if errors.Is(err, os.ErrNotExist) {
		ns.Close()
		t.Skipf("IPv6 is turned off in this kernel: %v", err)
	}
	if err != nil {
		ns.Close()
		t.Fatalf("create network namespace: %v", err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		ns.Close()
		t.Fatalf("netlink handle in test namespace: %v", err)
	}
	t.Cleanup(func() {
		h.Close()
		ns.Close()
	})
	return &testNetns{path: fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), int(ns)), nl: h}
}

func (n *testNetns) link(name string) (netlink.Link, error) {
	l, err := n.nl.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("link %s: %w", name, err)
	}
	return l, nil
}

func (n *testNetns) addVeth(name, peer string) error {
	err := n.nl.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: peer})
	if err != nil {
		return fmt.Errorf("add veth %s/%s: %w", name, peer, err)
	}
	return nil
}

func (n *testNetns) setUp(name string, up bool) error {
	l, err := n.link(name)
	if err != nil {
		return err
	}
	if up {
		return n.nl.LinkSetUp(l)
	}
	return n.nl.LinkSetDown(l)
}

func (n *testNetns) rename(name, to string) error {
	l, err := n.link(name)
	if err != nil {
		return err
	}
	return n.nl.LinkSetName(l, to)
}

func (n *testNetns) delete(name string) error {
	l, err := n.link(name)
	if err != nil {
		return err
	}
	return n.nl.LinkDel(l)
}

func (n *testNetns) addAddr(name, cidr string, scope devices.Scope) error {
	return n.changeAddr(name, cidr, scope, n.nl.AddrAdd)
}

func (n *testNetns) delAddr(name, cidr string) error {
	return n.changeAddr(name, cidr, devices.ScopeGlobal, n.nl.AddrDel)
}

func (n *testNetns) changeAddr(name, cidr string, scope devices.Scope, change func(netlink.Link, *netlink.Addr) error) error {
	l, err := n.link(name)
	if err != nil {
		return err
	}
	ip, ipnet, err := net.ParseCIDR(cidr)
	if err != nil {
		return err
	}
	ipnet.IP = ip
	if err := change(l, &netlink.Addr{IPNet: ipnet, Scope: int(scope)}); err != nil {
		return fmt.Errorf("address %s on %s: %w", cidr, name, err)
	}
	return nil
}
