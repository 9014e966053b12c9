package endpointmanager

import (
	"errors"
	"fmt"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// hostNetlink is the netlink sockets, in the agent's network namespace,
// through which every creation makes its host side: the veth pair, the
// qdisc, the host side's addresses, and once the endpoint is live its
// link up and the host's routes to the pod. They are opened by the first
// creation and shared by all: netlink's package functions open a socket
// for every request and close it after (a socket, bind, getsockname and
// close, the kernel's socket made and freed, and the runtime's poller
// registration), which was eight of the ten sockets an ADD opened (the
// programs' two filters are added through them too). The
// library takes a shared socket's lock for each request, and the kernel
// answers a request on the sending thread under its RTNL lock, which the
// requests would wait for anyway; replies to another request (of one that
// timed out) are skipped by their sequence number.
//
// The agent's stop closes them once the creations that hold them are
// done (the last release closes them), so that no request runs on a
// closed socket; get refuses after the stop.
type hostNetlink struct {
	mu sync.Mutex
	// h sends the library's requests; raw those built here (addVeth).
	h   *netlink.Handle
	raw *nl.SocketHandle
	// users counts the gets not yet released; stopped is set by close.
	users   int
	stopped bool
	// opened counts the times the sockets were opened, for tests.
	opened int
}

// errHostNetlinkStopped is get's error after the agent's stop.
var errHostNetlinkStopped = errors.New("host netlink sockets: the endpoint manager has stopped")

// get returns the sockets, opened at the first call, and the release the
// caller calls when done with them; after close, an error.
func (n *hostNetlink) get() (*netlink.Handle, *nl.SocketHandle, func(), error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.stopped {
		return nil, nil, nil, errHostNetlinkStopped
	}
	if n.h == nil {
		if err := n.open(); err != nil {
			return nil, nil, nil, err
		}
	}
	n.users++
	var once sync.Once
	return n.h, n.raw, func() { once.Do(n.release) }, nil
}

func (n *hostNetlink) release() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.users--
	if n.stopped && n.users == 0 {
		n.closeSockets()
	}
}

// open opens the sockets; n.mu is held.
func (n *hostNetlink) open() error {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("netlink socket: %w", err)
	}
	s, err := nl.GetNetlinkSocketAt(netns.None(), netns.None(), unix.NETLINK_ROUTE)
	if err != nil {
		h.Close()
		return fmt.Errorf("netlink socket: %w", err)
	}
	// As the library's own sockets per request: a request that the
	// kernel does not answer fails instead of holding the socket.
	timeout := netlink.GetSocketTimeout()
	if err := h.SetSocketTimeout(timeout); err != nil {
		h.Close()
		s.Close()
		return fmt.Errorf("netlink socket timeout: %w", err)
	}
	tv := unix.NsecToTimeval(timeout.Nanoseconds())
	if err := s.SetSendTimeout(&tv); err == nil {
		err = s.SetReceiveTimeout(&tv)
	}
	if err != nil {
		h.Close()
		s.Close()
		return fmt.Errorf("netlink socket timeout: %w", err)
	}
	n.h, n.raw = h, &nl.SocketHandle{Socket: s}
	n.opened++
	return nil
}

// close stops the sockets: get refuses from now on, and they are closed
// now or by the last release of those in use.
func (n *hostNetlink) close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.stopped {
		return
	}
	n.stopped = true
	if n.users == 0 {
		n.closeSockets()
	}
}

// closeSockets closes the sockets if open; n.mu is held.
func (n *hostNetlink) closeSockets() {
	if n.h != nil {
		n.h.Close()
		n.raw.Close()
		n.h, n.raw = nil, nil
	}
}
