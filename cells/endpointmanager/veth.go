package endpointmanager

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"slices"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/pkg/statefile"
)

// errNetnsGone: the endpoint's network namespace no longer exists (the
// path is gone, or nothing is mounted on it any more).
var errNetnsGone = errors.New("the network namespace is gone")

// netnsOpenTimeout bounds the opening of a netns path. The path comes
// from the caller (CNI_NETNS), and a path on a filesystem that does not
// answer could block the open for ever.
const netnsOpenTimeout = 5 * time.Second

// openNetns opens the network namespace at path, checking that it is one,
// without blocking: the path must be a regular file (a network namespace
// is one on nsfs), which is checked before it is opened, and it is opened
// non-blocking, so that a named pipe put there (also after the check)
// cannot make the open wait for a writer. A path that still does not
// answer within netnsOpenTimeout (or before ctx ends) is an error naming
// it; the open goes on in the background and its handle is closed.
func openNetns(ctx context.Context, path string) (netns.NsHandle, error) {
	ctx, cancel := context.WithTimeout(ctx, netnsOpenTimeout)
	defer cancel()
	type result struct {
		ns  netns.NsHandle
		err error
	}
	done := make(chan result, 1)
	go func() {
		ns, err := openNetnsNow(path)
		done <- result{ns, err}
	}()
	select {
	case r := <-done:
		return r.ns, r.err
	case <-ctx.Done():
		go func() {
			if r := <-done; r.err == nil {
				r.ns.Close()
			}
		}()
		return netns.None(), fmt.Errorf("netns %s did not open within %s: %w", path, netnsOpenTimeout, context.Cause(ctx))
	}
}

func openNetnsNow(path string) (netns.NsHandle, error) {
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return netns.None(), fmt.Errorf("netns %s does not exist: %w", path, errNetnsGone)
	}
	if err != nil {
		return netns.None(), fmt.Errorf("netns %s: %w", path, err)
	}
	if !fi.Mode().IsRegular() {
		return netns.None(), fmt.Errorf("netns %s is a %s, not a network namespace: %w", path, statefile.TypeName(fi.Mode()), errNetnsGone)
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return netns.None(), fmt.Errorf("netns %s does not exist: %w", path, errNetnsGone)
	}
	if err != nil {
		return netns.None(), fmt.Errorf("netns %s: %w", path, err)
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(fd, &st); err != nil {
		unix.Close(fd)
		return netns.None(), fmt.Errorf("netns %s: %w", path, err)
	}
	if st.Type != unix.NSFS_MAGIC {
		unix.Close(fd)
		return netns.None(), fmt.Errorf("netns %s is not a namespace (nothing is mounted there): %w", path, errNetnsGone)
	}
	if typ, err := unix.IoctlRetInt(fd, unix.NS_GET_NSTYPE); err != nil || typ != unix.CLONE_NEWNET {
		unix.Close(fd)
		return netns.None(), fmt.Errorf("netns %s is a namespace but not a network namespace", path)
	}
	return netns.NsHandle(fd), nil
}

// plumbing makes and checks the kernel side of endpoints: a veth pair with
// the host side in the agent's network namespace and the other in the pod's,
// the pod's address on it, a route to the router address and a default
// route through it in the pod, and on the host the router address on the
// host side and a route to the pod's address through it.
//
// The router address is on the host side of every endpoint: the host then
// answers the pod's ARP and neighbour solicitations for it, and delivers
// what the pod sends to it locally. The kernel allows the same address on
// many links, so no shared device is needed.
type plumbing struct {
	// mtu is the MTU endpoints get now (see Manager.mtu).
	mtu func() int
	// fixedMTU says mtu is --endpoint-mtu: plumb sets it on an intact veth
	// pair too. An automatic one is given only to pairs it makes: a
	// restart leaves a running pod's MTU as it is.
	fixedMTU bool
	// vethCreated runs right after a new veth pair exists: the test fault
	// point (--endpoint-test-crash-at).
	vethCreated func()
	// host is the sockets through which creations make their host sides.
	host hostNetlink
}

// plumb makes the kernel match ep, and fills in its MACs and host ifindex.
// It is idempotent: on an endpoint that is intact it changes nothing, so a
// restore does not disturb the pod's traffic. routers are the pools'
// router addresses; host is what the host side has, read once for many
// endpoints (see readHost), or nil to read it here. podNS is ep.Netns
// opened by the caller, or netns.None() to open it here. A host side it
// makes, or finds down, stays down and without the host's routes to the
// pod, and hostUp says so: the caller brings it up and adds them
// (routeHost) once the datapath has the endpoint, its programs attached
// and its policy in the maps; before, traffic would reach the pod
// unchecked. Without withHostRoutes those routes are left out also when
// the host side is up. mtu gives the MTU of a veth pair plumb makes, or
// sets (--endpoint-mtu): it is asked only then, as it may wait for the
// node's devices.
func (p *plumbing) plumb(ep *Endpoint, podNS netns.NsHandle, routers []netip.Addr, host *hostView, withHostRoutes bool, mtu func() (int, error)) (hostUp bool, err error) {
	if podNS == netns.None() {
		if podNS, err = openNetns(context.Background(), ep.Netns); err != nil {
			return false, err
		}
		defer podNS.Close()
	}
	pod, err := netlink.NewHandleAt(podNS, unix.NETLINK_ROUTE)
	if err != nil {
		return false, fmt.Errorf("netlink in netns %s: %w", ep.Netns, err)
	}
	defer pod.Close()

	hostLink, podLink, created, err := p.ensureVeth(ep, podNS, pod, mtu)
	if err != nil {
		return false, err
	}
	if created {
		// A new link has no addresses or routes: nothing to read.
		host = &hostView{}
	} else if host == nil {
		if host, err = readHost(); err != nil {
			return false, err
		}
	}
	hostIndex := hostLink.Attrs().Index

	// Each piece is changed only when it is missing: replacing an intact
	// IPv6 address or route drops the pod's packets for a moment.
	if ep.IPv6.IsValid() {
		// The host resolves a pod's IPv6 address with a neighbour
		// solicitation from the host side's link-local address, and sends
		// none while that address is tentative: a second or two of
		// duplicate address detection after the link comes up, during which
		// traffic forwarded to the pod is dropped. The address the kernel
		// would generate, added without detection before the link is up,
		// is usable at once.
		ll := linkLocal(hostLink.Attrs().HardwareAddr)
		if !host.hasAddr(hostIndex, ll) {
			a := &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(ll, 64)), Flags: unix.IFA_F_NODAD}
			if err := netlink.AddrReplace(hostLink, a); err != nil {
				return false, fmt.Errorf("add link-local address %s to %s: %w", ll, ep.HostIfName, err)
			}
		}
	}
	// A new endpoint's host side comes up with its host routes (see
	// routeHost), once the datapath has it: its programs are attached
	// while it is down, which spares the node's RTNL lock a wait for the
	// kernel's RCU (see the loader's tc.go).
	hostUp = hostLink.Attrs().Flags&net.FlagUp != 0
	withHostRoutes = withHostRoutes && hostUp
	if podLink.Attrs().Flags&net.FlagUp == 0 {
		if err := pod.LinkSetUp(podLink); err != nil {
			return false, fmt.Errorf("set %s up in netns %s: %w", ep.IfName, ep.Netns, err)
		}
	}
	for _, ip := range ep.IPs() {
		router, ok := routerOf(ip, routers)
		if !ok {
			return false, fmt.Errorf("no router address for %s: no pod pool of its family", ip)
		}
		// A pod link made here has no addresses or routes yet: it is not
		// asked (two dumps of the pod's namespace per address).
		if created || !hasAddr(pod, podLink, ip) {
			if err := pod.AddrReplace(podLink, hostAddr(ip)); err != nil {
				return false, fmt.Errorf("add %s to %s in netns %s: %w", ip, ep.IfName, ep.Netns, err)
			}
		}
		var podRouteList []netlink.Route
		if !created {
			if podRouteList, err = pod.RouteList(podLink, family(ip)); err != nil {
				return false, fmt.Errorf("list routes in netns %s: %w", ep.Netns, err)
			}
		}
		for _, r := range podRoutes(podLink.Attrs().Index, router) {
			if hasRoute(podRouteList, r) {
				continue
			}
			if err := pod.RouteReplace(r); err != nil {
				return false, fmt.Errorf("add route %s in netns %s: %w", routeString(r), ep.Netns, err)
			}
		}
		if !host.hasAddr(hostIndex, router) {
			if err := netlink.AddrReplace(hostLink, hostAddr(router)); err != nil {
				return false, fmt.Errorf("add router address %s to %s: %w", router, ep.HostIfName, err)
			}
		}
		if r := hostRoute(hostIndex, ip); withHostRoutes && !host.hasRoute(ip, hostIndex) {
			if err := netlink.RouteReplace(r); err != nil {
				return false, fmt.Errorf("add route %s: %w", routeString(r), err)
			}
		}
	}
	ep.MAC = MAC(podLink.Attrs().HardwareAddr)
	ep.HostMAC = MAC(hostLink.Attrs().HardwareAddr)
	ep.HostIfIndex = hostIndex
	return hostUp, nil
}

// plumbNew makes the kernel side of a new endpoint, as plumb does, with
// fewer requests under the node's RTNL lock: the veth pair is made with
// MACs chosen here, and nothing is looked up that cannot exist yet. A host
// side that an earlier ADD of the container left (the agent did not finish
// it) makes the creation fail as the name is taken: it is removed then
// (removed says so), and the pair made. The host side stays down, without
// the host's routes to the pod (see routeHost).
func (p *plumbing) plumbNew(ep *Endpoint, podNS netns.NsHandle, routers []netip.Addr) (removed bool, err error) {
	mtu := p.mtu()
	nlh, raw, release, err := p.host.get()
	if err != nil {
		return false, err
	}
	defer release()
	pod, err := netlink.NewHandleAt(podNS, unix.NETLINK_ROUTE)
	if err != nil {
		return false, fmt.Errorf("netlink in netns %s: %w", ep.Netns, err)
	}
	defer pod.Close()
	hostMAC, podMAC := randomMAC(), randomMAC()
	hostIndex, podIndex, err := addVeth(raw, ep.HostIfName, hostMAC, ep.IfName, podMAC, podNS, mtu)
	if errors.Is(err, unix.EEXIST) {
		if removed, err = unplumb(ep.HostIfName); err != nil {
			return false, err
		}
		err = unix.EEXIST
		if removed {
			hostIndex, podIndex, err = addVeth(raw, ep.HostIfName, hostMAC, ep.IfName, podMAC, podNS, mtu)
		}
		if _, lerr := pod.LinkByName(ep.IfName); errors.Is(err, unix.EEXIST) && lerr == nil {
			return removed, fmt.Errorf("interface %s already exists in netns %s", ep.IfName, ep.Netns)
		}
	}
	if err != nil {
		return removed, fmt.Errorf("create veth pair %s (host) and %s (netns %s): %w", ep.HostIfName, ep.IfName, ep.Netns, err)
	}
	if p.vethCreated != nil {
		p.vethCreated()
	}
	if hostIndex == 0 || podIndex == 0 {
		// A kernel that does not echo the new link: look the pair up.
		link, err := nlh.LinkByName(ep.HostIfName)
		if err != nil {
			return removed, fmt.Errorf("look up %s: %w", ep.HostIfName, err)
		}
		hostIndex, podIndex = link.Attrs().Index, link.Attrs().ParentIndex
	}
	host := &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: hostIndex, Name: ep.HostIfName}}
	podLink := &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: podIndex, Name: ep.IfName, HardwareAddr: podMAC}}
	// See ensureVeth: the filters' qdisc, made before they are added.
	if err := addClsact(nlh, hostIndex); err != nil {
		return removed, fmt.Errorf("add a clsact qdisc to %s: %w", ep.HostIfName, err)
	}
	// As in plumb: the host side's link-local address, usable at once.
	if ep.IPv6.IsValid() {
		ll := linkLocal(hostMAC)
		a := &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(ll, 64)), Flags: unix.IFA_F_NODAD}
		if err := nlh.AddrReplace(host, a); err != nil {
			return removed, fmt.Errorf("add link-local address %s to %s: %w", ll, ep.HostIfName, err)
		}
	}
	if err := pod.LinkSetUp(podLink); err != nil {
		return removed, fmt.Errorf("set %s up in netns %s: %w", ep.IfName, ep.Netns, err)
	}
	for _, ip := range ep.IPs() {
		router, ok := routerOf(ip, routers)
		if !ok {
			return removed, fmt.Errorf("no router address for %s: no pod pool of its family", ip)
		}
		if err := pod.AddrReplace(podLink, hostAddr(ip)); err != nil {
			return removed, fmt.Errorf("add %s to %s in netns %s: %w", ip, ep.IfName, ep.Netns, err)
		}
		for _, r := range podRoutes(podLink.Attrs().Index, router) {
			if err := pod.RouteReplace(r); err != nil {
				return removed, fmt.Errorf("add route %s in netns %s: %w", routeString(r), ep.Netns, err)
			}
		}
		if err := nlh.AddrReplace(host, hostAddr(router)); err != nil {
			return removed, fmt.Errorf("add router address %s to %s: %w", router, ep.HostIfName, err)
		}
	}
	ep.MAC = MAC(podMAC)
	ep.HostMAC = MAC(hostMAC)
	ep.HostIfIndex = hostIndex
	return removed, nil
}

// addVeth makes a veth pair in one request on the socket s (in the
// agent's netns): the host side hostName there and the pod side podName in
// podNS, both down, with the given MACs and MTU. The kernel echoes the new
// host side (NLM_F_ECHO), whose link is the pod side's index: it returns
// both indexes, or zeros when the kernel did not echo it.
func addVeth(s *nl.SocketHandle, hostName string, hostMAC net.HardwareAddr, podName string, podMAC net.HardwareAddr, podNS netns.NsHandle, mtu int) (hostIndex, podIndex int, err error) {
	req := nl.NewNetlinkRequest(unix.RTM_NEWLINK, unix.NLM_F_CREATE|unix.NLM_F_EXCL|unix.NLM_F_ACK|unix.NLM_F_ECHO)
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: s}
	req.AddData(nl.NewIfInfomsg(unix.AF_UNSPEC))
	req.AddData(nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(hostName)))
	req.AddData(nl.NewRtAttr(unix.IFLA_MTU, nl.Uint32Attr(uint32(mtu))))
	req.AddData(nl.NewRtAttr(unix.IFLA_ADDRESS, hostMAC))
	info := nl.NewRtAttr(unix.IFLA_LINKINFO, nil)
	info.AddRtAttr(nl.IFLA_INFO_KIND, nl.NonZeroTerminated("veth"))
	peer := info.AddRtAttr(nl.IFLA_INFO_DATA, nil).AddRtAttr(nl.VETH_INFO_PEER, nil)
	// Not up yet: the kernel configures the peer before it is one.
	nl.NewIfInfomsgChild(peer, unix.AF_UNSPEC)
	peer.AddRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(podName))
	peer.AddRtAttr(unix.IFLA_MTU, nl.Uint32Attr(uint32(mtu)))
	peer.AddRtAttr(unix.IFLA_ADDRESS, podMAC)
	peer.AddRtAttr(unix.IFLA_NET_NS_FD, nl.Uint32Attr(uint32(podNS)))
	req.AddData(info)
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWLINK)
	if err != nil || len(msgs) == 0 || len(msgs[0]) < unix.SizeofIfInfomsg {
		return 0, 0, err
	}
	hostIndex = int(nl.DeserializeIfInfomsg(msgs[0]).Index)
	attrs, err := nl.ParseRouteAttr(msgs[0][unix.SizeofIfInfomsg:])
	if err != nil {
		return 0, 0, nil
	}
	for _, a := range attrs {
		if a.Attr.Type == unix.IFLA_LINK && len(a.Value) == 4 {
			podIndex = int(nl.NativeEndian().Uint32(a.Value))
		}
	}
	return hostIndex, podIndex, nil
}

// randomMAC is a random unicast, locally administered MAC address, as the
// kernel gives a new veth.
func randomMAC() net.HardwareAddr {
	mac := make(net.HardwareAddr, 6)
	rand.Read(mac)
	mac[0] = mac[0]&^0x01 | 0x02
	return mac
}

// routeHost brings a new endpoint's host side up and adds the host's
// routes to its addresses through it: the last step of a creation, after
// which other pods and the node reach the pod.
func (p *plumbing) routeHost(ep *Endpoint) error {
	h, _, release, err := p.host.get()
	if err != nil {
		return err
	}
	defer release()
	if err := h.LinkSetUp(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: ep.HostIfIndex}}); err != nil {
		return fmt.Errorf("set %s up: %w", ep.HostIfName, err)
	}
	for _, ip := range ep.IPs() {
		r := hostRoute(ep.HostIfIndex, ip)
		if err := h.RouteReplace(r); err != nil {
			return fmt.Errorf("add route %s: %w", routeString(r), err)
		}
	}
	return nil
}

// hostView is what the host has on the endpoints' host sides: addresses
// by ifindex, and routes to single addresses without gateway. Reading it
// is a dump of every address and route of the host, so a restore reads it
// once, not once per endpoint.
type hostView struct {
	addrs  map[int][]netip.Addr
	routes map[netip.Addr][]int
}

func readHost() (*hostView, error) {
	v := &hostView{addrs: map[int][]netip.Addr{}, routes: map[netip.Addr][]int{}}
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("list the host's addresses: %w", err)
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			v.addrs[a.LinkIndex] = append(v.addrs[a.LinkIndex], ip.Unmap())
		}
	}
	routes, err := netlink.RouteList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("list the host's routes: %w", err)
	}
	for _, r := range routes {
		if r.Dst == nil || r.Gw != nil {
			continue
		}
		ones, bits := r.Dst.Mask.Size()
		if ip, ok := netip.AddrFromSlice(r.Dst.IP); ok && ones == bits {
			ip = ip.Unmap()
			v.routes[ip] = append(v.routes[ip], r.LinkIndex)
		}
	}
	return v, nil
}

func (v *hostView) hasAddr(ifindex int, ip netip.Addr) bool {
	return slices.Contains(v.addrs[ifindex], ip)
}

func (v *hostView) hasRoute(dst netip.Addr, ifindex int) bool {
	return slices.Contains(v.routes[dst], ifindex)
}

// ensureVeth returns the endpoint's veth pair, making it if it is missing,
// with the MTU mtu gives. An intact pair keeps its MTU unless it is
// --endpoint-mtu (fixedMTU), and then mtu is not asked. A host side whose
// peer is not the pod's interface is what an interrupted creation leaves:
// it is replaced.
func (p *plumbing) ensureVeth(ep *Endpoint, podNS netns.NsHandle, pod *netlink.Handle, mtuOf func() (int, error)) (host, podLink netlink.Link, created bool, err error) {
	host, err = netlink.LinkByName(ep.HostIfName)
	switch {
	case err == nil:
		podLink, perr := pod.LinkByName(ep.IfName)
		if perr == nil && paired(host, podLink) {
			if p.fixedMTU {
				mtu, err := mtuOf()
				if err != nil {
					return nil, nil, false, err
				}
				if err := p.ensureMTU(host, podLink, pod, mtu); err != nil {
					return nil, nil, false, err
				}
			}
			return host, podLink, false, nil
		}
		if err := netlink.LinkDel(host); err != nil {
			return nil, nil, false, fmt.Errorf("remove %s, whose peer is not %s in netns %s: %w", ep.HostIfName, ep.IfName, ep.Netns, err)
		}
	case !isNotFound(err):
		return nil, nil, false, fmt.Errorf("look up %s: %w", ep.HostIfName, err)
	}
	if _, err := pod.LinkByName(ep.IfName); err == nil {
		return nil, nil, false, fmt.Errorf("interface %s already exists in netns %s", ep.IfName, ep.Netns)
	}
	mtu, err := mtuOf()
	if err != nil {
		return nil, nil, false, err
	}
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: ep.HostIfName, MTU: mtu},
		PeerName:      ep.IfName,
		PeerNamespace: netlink.NsFd(podNS),
		PeerMTU:       uint32(mtu),
	}
	if err := netlink.LinkAdd(veth); err != nil {
		return nil, nil, false, fmt.Errorf("create veth pair %s (host) and %s (netns %s): %w", ep.HostIfName, ep.IfName, ep.Netns, err)
	}
	if p.vethCreated != nil {
		p.vethCreated()
	}
	if host, err = netlink.LinkByName(ep.HostIfName); err != nil {
		return nil, nil, false, fmt.Errorf("look up %s: %w", ep.HostIfName, err)
	}
	// The endpoint's programs are filters on a clsact qdisc of the host
	// side (cells/loader/tc.go). The first filter of a hook waits for a
	// grace period of the kernel's RCU, with the node's RTNL lock held,
	// unless one has passed since the qdisc was made: made here, one has
	// by the time the loader adds them.
	if err := AddClsact(host.Attrs().Index); err != nil {
		return nil, nil, false, fmt.Errorf("add a clsact qdisc to %s: %w", ep.HostIfName, err)
	}
	if podLink, err = pod.LinkByName(ep.IfName); err != nil {
		return nil, nil, false, fmt.Errorf("look up %s in netns %s: %w", ep.IfName, ep.Netns, err)
	}
	return host, podLink, true, nil
}

// AddClsact adds a clsact qdisc to interface ifindex unless it has one:
// the endpoints' programs are tc filters on it (cells/loader/tc.go).
func AddClsact(ifindex int) error { return addClsact(nil, ifindex) }

// addClsact is AddClsact through h (nil: a socket of its own).
func addClsact(h *netlink.Handle, ifindex int) error {
	if h == nil {
		h = &netlink.Handle{}
	}
	err := h.QdiscAdd(&netlink.Clsact{QdiscAttrs: netlink.QdiscAttrs{
		LinkIndex: ifindex, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT,
	}})
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return err
	}
	return nil
}

func (p *plumbing) ensureMTU(host, podLink netlink.Link, pod *netlink.Handle, mtu int) error {
	if host.Attrs().MTU != mtu {
		if err := netlink.LinkSetMTU(host, mtu); err != nil {
			return fmt.Errorf("set MTU of %s: %w", host.Attrs().Name, err)
		}
	}
	if podLink.Attrs().MTU != mtu {
		if err := pod.LinkSetMTU(podLink, mtu); err != nil {
			return fmt.Errorf("set MTU of %s: %w", podLink.Attrs().Name, err)
		}
	}
	return nil
}

// paired says whether host and pod are the two ends of one veth pair: a
// veth's link index is its peer's ifindex.
func paired(host, pod netlink.Link) bool {
	return host.Type() == "veth" && pod.Type() == "veth" &&
		host.Attrs().ParentIndex == pod.Attrs().Index && pod.Attrs().ParentIndex == host.Attrs().Index
}

func isNotFound(err error) bool {
	_, ok := errors.AsType[netlink.LinkNotFoundError](err)
	return ok
}

// unplumb removes the host side of a veth pair, and with it the pod side,
// their addresses and the routes through them. removed is false when there
// was nothing to remove.
func unplumb(hostIfName string) (removed bool, err error) {
	link, err := netlink.LinkByName(hostIfName)
	if isNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("look up %s: %w", hostIfName, err)
	}
	if err := netlink.LinkDel(link); err != nil && !errors.Is(err, unix.ENODEV) {
		return false, fmt.Errorf("remove %s: %w", hostIfName, err)
	}
	return true, nil
}

func routerOf(ip netip.Addr, routers []netip.Addr) (netip.Addr, bool) {
	for _, r := range routers {
		if r.Is4() == ip.Is4() {
			return r, true
		}
	}
	return netip.Addr{}, false
}

// hostAddr is ip alone: /32 or /128, so that no prefix route comes with it.
// IPv6 addresses skip duplicate address detection, which would keep them
// unusable for a second.
func hostAddr(ip netip.Addr) *netlink.Addr {
	a := &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(ip, ip.BitLen()))}
	if ip.Is6() {
		a.Flags = unix.IFA_F_NODAD
	}
	return a
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// linkLocal is the EUI-64 link-local address of a MAC (RFC 4291), the one
// the kernel generates for a link.
func linkLocal(mac net.HardwareAddr) netip.Addr {
	var a [16]byte
	a[0], a[1] = 0xfe, 0x80
	if len(mac) == 6 {
		a[8], a[9], a[10] = mac[0]^0x02, mac[1], mac[2]
		a[11], a[12] = 0xff, 0xfe
		a[13], a[14], a[15] = mac[3], mac[4], mac[5]
	}
	return netip.AddrFrom16(a)
}

// podRoutes are the pod's routes: the router on the link, and the default
// route through it.
func podRoutes(linkIndex int, router netip.Addr) []*netlink.Route {
	any := netip.PrefixFrom(netip.IPv4Unspecified(), 0)
	if router.Is6() {
		any = netip.PrefixFrom(netip.IPv6Unspecified(), 0)
	}
	return []*netlink.Route{
		{LinkIndex: linkIndex, Dst: prefixNet(netip.PrefixFrom(router, router.BitLen())), Scope: linkScope(router)},
		{LinkIndex: linkIndex, Dst: prefixNet(any), Gw: router.AsSlice()},
	}
}

// hostRoute is the host's route to a pod address, through its host side.
func hostRoute(linkIndex int, ip netip.Addr) *netlink.Route {
	return &netlink.Route{LinkIndex: linkIndex, Dst: prefixNet(netip.PrefixFrom(ip, ip.BitLen())), Scope: linkScope(ip)}
}

// linkScope is the scope of a route to a neighbour; IPv6 has no scopes on
// routes.
func linkScope(ip netip.Addr) netlink.Scope {
	if ip.Is4() {
		return netlink.SCOPE_LINK
	}
	return netlink.SCOPE_UNIVERSE
}

func family(ip netip.Addr) int {
	if ip.Is4() {
		return netlink.FAMILY_V4
	}
	return netlink.FAMILY_V6
}

// verify lists how the kernel differs from ep; nothing when it is intact.
func verify(ep *Endpoint, routers []netip.Addr) []string {
	podNS, err := openNetns(context.Background(), ep.Netns)
	if err != nil {
		return []string{err.Error()}
	}
	defer podNS.Close()
	pod, err := netlink.NewHandleAt(podNS, unix.NETLINK_ROUTE)
	if err != nil {
		return []string{fmt.Sprintf("netlink in netns %s: %v", ep.Netns, err)}
	}
	defer pod.Close()

	view, err := readHost()
	if err != nil {
		return []string{err.Error()}
	}
	var problems []string
	host, err := netlink.LinkByName(ep.HostIfName)
	if err != nil {
		return []string{fmt.Sprintf("host interface %s: %v", ep.HostIfName, err)}
	}
	podLink, err := pod.LinkByName(ep.IfName)
	if err != nil {
		return []string{fmt.Sprintf("interface %s in netns %s: %v", ep.IfName, ep.Netns, err)}
	}
	if !paired(host, podLink) {
		problems = append(problems, fmt.Sprintf("%s and %s in netns %s are not the two ends of a veth pair", ep.HostIfName, ep.IfName, ep.Netns))
	}
	for _, l := range []netlink.Link{host, podLink} {
		if l.Attrs().Flags&net.FlagUp == 0 {
			problems = append(problems, fmt.Sprintf("interface %s is down", l.Attrs().Name))
		}
	}
	if !slices.Equal(podLink.Attrs().HardwareAddr, net.HardwareAddr(ep.MAC)) {
		problems = append(problems, fmt.Sprintf("interface %s has MAC %s, want %s", ep.IfName, podLink.Attrs().HardwareAddr, ep.MAC))
	}
	for _, ip := range ep.IPs() {
		router, ok := routerOf(ip, routers)
		if !ok {
			problems = append(problems, fmt.Sprintf("no router address for %s: no pod pool of its family", ip))
			continue
		}
		if !hasAddr(pod, podLink, ip) {
			problems = append(problems, fmt.Sprintf("%s in netns %s does not have address %s", ep.IfName, ep.Netns, ip))
		}
		if !view.hasAddr(host.Attrs().Index, router) {
			problems = append(problems, fmt.Sprintf("%s does not have the router address %s", ep.HostIfName, router))
		}
		podRouteList, _ := pod.RouteList(podLink, family(ip))
		for _, want := range podRoutes(podLink.Attrs().Index, router) {
			if !hasRoute(podRouteList, want) {
				problems = append(problems, fmt.Sprintf("netns %s has no route %s", ep.Netns, routeString(want)))
			}
		}
		if !view.hasRoute(ip, host.Attrs().Index) {
			problems = append(problems, fmt.Sprintf("the host has no route %s", routeString(hostRoute(host.Attrs().Index, ip))))
		}
	}
	return problems
}

func hasAddr(h *netlink.Handle, link netlink.Link, ip netip.Addr) bool {
	addrs, err := h.AddrList(link, family(ip))
	if err != nil {
		return false
	}
	for _, a := range addrs {
		if got, ok := netip.AddrFromSlice(a.IP); ok && got.Unmap() == ip {
			return true
		}
	}
	return false
}

func hasRoute(routes []netlink.Route, want *netlink.Route) bool {
	for _, r := range routes {
		dst := r.Dst
		if dst == nil {
			dst = want.Dst // the default route may come back without a destination
			if ones, _ := want.Dst.Mask.Size(); ones != 0 {
				continue
			}
		}
		if r.LinkIndex == want.LinkIndex && dst.String() == want.Dst.String() && r.Gw.Equal(want.Gw) {
			return true
		}
	}
	return false
}

func routeString(r *netlink.Route) string {
	if r.Gw != nil {
		return fmt.Sprintf("%s via %s", r.Dst, r.Gw)
	}
	return fmt.Sprintf("%s dev #%d", r.Dst, r.LinkIndex)
}
