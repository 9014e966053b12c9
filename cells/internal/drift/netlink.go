package drift

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	"github.com/cilium/hive/cell"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Batch is the netlink updates that queued up since the last batch.
type Batch struct {
	Links     []netlink.LinkUpdate
	Routes    []netlink.RouteUpdate
	Neighbors []netlink.NeighUpdate
	// Addrs are only for a Subscriber that asked for them (a Follower
	// does not follow addresses).
	Addrs []netlink.AddrUpdate
	// Resync: updates may have been lost before this batch (a subscription
	// failed and was made again); compare everything.
	Resync bool
}

// Follower follows the kernel's link, route and neighbour updates in a network
// namespace and hands them to Handle in batches. Run it as a job with
// Retry: a subscription that fails ends Run with its error, and the next
// Run's first batch is a Resync.
type Follower struct {
	// Netns is the path of the network namespace; "" for the agent's own.
	Netns string
	// Links, Routes and Neighbors say what to follow: devices, IPv4 and
	// IPv6 routes, neighbour and bridge FDB entries. Every device there is
	// comes first, as an update each, so that a device's state is known
	// before it changes.
	Links, Routes, Neighbors bool
	// Handle is called from Run's goroutine, one batch at a time, with
	// Run's context.
	Handle func(context.Context, Batch)
	// Log is for what the follower says (ForceSocketBuffer); nil for
	// slog's default.
	Log *slog.Logger
	// Hub shares the subscriptions; nil for the agent's.
	Hub *Hub

	// queueLimit bounds its queue in the hub (0: the hub's).
	queueLimit int

	// subscribed: a subscription was made before, so updates may have been
	// missed since it ended.
	subscribed bool
}

// updateBuffer is how many updates queue in a subscription's channel,
// between netlink's receiving goroutine and the hub's, which queues each
// for its subscribers. A channel's buffer is the agent's for good (1,024
// route updates were 384 KB); a burst waits in the subscribers' queues
// (the hub reads as fast as updates come) and in the kernel, in the
// subscription socket's receive buffer (SocketBuffer), which takes memory
// only while messages wait.
const updateBuffer = 64

// SocketBuffer is the receive buffer, in bytes, of the agent's netlink
// subscriptions (SO_RCVBUFFORCE with CAP_NET_ADMIN, else SO_RCVBUF, which
// the kernel caps at net.core.rmem_max: ForceSocketBuffer). The
// kernel's default (net.core.rmem_default, 208 KiB) holds a few hundred
// updates: a hundred pods started at once on a busy node (each ADD's veth,
// addresses and routes, five to ten updates) filled it while the reader
// waited for a core, the kernel dropped updates (ENOBUFS), and every
// subscriber started over with a listing of everything (a Resync), marked
// itself degraded and logged an error. The buffer takes memory only for
// the updates queued in it.
const SocketBuffer = 8 << 20

// ForceSocketBuffer says whether a subscription's SocketBuffer is to be
// set with SO_RCVBUFFORCE (ReceiveBufferForceSize), which needs
// CAP_NET_ADMIN: without it the option fails with EPERM, and so would
// every subscription, at each retry. It is tried once, on a socket of its
// own; without the capability the first caller's log says once, at warn,
// that SO_RCVBUF is used, capped at net.core.rmem_max, which a burst of
// updates may overflow. log may be nil (slog's default).
func ForceSocketBuffer(log *slog.Logger) bool {
	force, err := forceProbe()
	if err != nil {
		warnOnce.Do(func() {
			if log == nil {
				log = slog.Default()
			}
			log.Warn("Netlink subscriptions' receive buffers are capped at net.core.rmem_max: a burst of updates may overflow them (the kernel drops updates and the subscriptions start over)",
				"want-bytes", SocketBuffer, "error", err)
		})
	}
	return force
}

var (
	forceProbe = sync.OnceValues(probeForceSocketBuffer)
	warnOnce   sync.Once
)

// probeForceSocketBuffer tries SO_RCVBUFFORCE on a netlink socket of its
// own: false with EPERM, else true (another error is the subscription's
// to report).
func probeForceSocketBuffer() (bool, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return true, nil
	}
	defer unix.Close(fd)
	err = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, SocketBuffer)
	if errors.Is(err, unix.EPERM) {
		return false, fmt.Errorf("SO_RCVBUFFORCE: %w (needs CAP_NET_ADMIN)", err)
	}
	return true, nil
}

// maxBatch bounds one batch, so that a flood of updates is handled in
// steps.
const maxBatch = 4096

// Run subscribes and hands batches to Handle until ctx ends.
func (f *Follower) Run(ctx context.Context, health cell.Health) error {
	h := f.Hub
	if h == nil {
		h = hub
	}
	sub, err := h.Subscribe(f.Netns, Kinds{Links: f.Links, Routes: f.Routes, Neighbors: f.Neighbors}, nil, f.Log)
	if err != nil {
		return err
	}
	defer sub.Close()
	if f.queueLimit > 0 {
		sub.setLimit(f.queueLimit)
	}
	// The devices there are listed after subscribing, so a change made
	// meanwhile also arrives as an update after the listing.
	listed, err := f.list()
	if err != nil {
		return err
	}
	if f.subscribed {
		f.Handle(ctx, Batch{Resync: true})
	}
	f.subscribed = true
	if len(listed) > 0 {
		f.Handle(ctx, Batch{Links: listed})
	}
	health.OK("Following netlink updates")
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-sub.Ready():
		}
		b, err := sub.Take(maxBatch)
		switch {
		case err != nil:
			return err
		case b.Resync:
			// This follower fell behind and its queue was dropped: it
			// starts over as after a subscription that failed, the
			// updates from now on queued behind its listing.
			if f.Log != nil {
				f.Log.Warn("Netlink updates dropped while this follower was busy: comparing everything again")
			}
			if listed, err = f.list(); err != nil {
				return err
			}
			f.Handle(ctx, b)
			if len(listed) > 0 {
				f.Handle(ctx, Batch{Links: listed})
			}
		case len(b.Links)+len(b.Routes)+len(b.Neighbors) > 0:
			f.Handle(ctx, b)
		}
	}
}

// list lists the devices, if the follower follows them.
func (f *Follower) list() ([]netlink.LinkUpdate, error) {
	if !f.Links {
		return nil, nil
	}
	ns := netns.None()
	if f.Netns != "" {
		var err error
		if ns, err = netns.GetFromPath(f.Netns); err != nil {
			return nil, fmt.Errorf("open network namespace %s: %w", f.Netns, err)
		}
		defer ns.Close()
	}
	return listLinks(ns)
}

// listLinks lists the devices of ns as updates, as the kernel would send
// them.
//
// The subscription does not list them itself (netlink's ListExisting):
// that sends the dump request to the subscription socket's own address,
// which carries the multicast group, and as root the kernel then also
// delivers the request to every other subscriber of the group in the
// namespace. Those (the devices watcher's, any other program's) receive a
// message whose sender is not the kernel, and netlink reports it as "Wrong
// sender portid".
func listLinks(ns netns.NsHandle) ([]netlink.LinkUpdate, error) {
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink handle: %w", err)
	}
	defer h.Close()
	var links []netlink.Link
	for range dumpAttempts {
		if links, err = h.LinkList(); !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	updates := make([]netlink.LinkUpdate, 0, len(links))
	for _, l := range links {
		a := l.Attrs()
		var u netlink.LinkUpdate
		u.Header.Type = unix.RTM_NEWLINK
		u.Index = int32(a.Index)
		u.Flags = a.RawFlags
		u.Link = l
		updates = append(updates, u)
	}
	return updates, nil
}

// FromOtherSocket says whether err, as a netlink subscription's
// ErrorCallback gets it, reports a message whose sender is not the kernel:
// another socket's message to the multicast group (a program listing
// through its subscription as root, see listLinks). netlink drops it and
// goes on, so it is no failure of the subscription. netlink has no error
// value for it, only this text (vishvananda/netlink v1.3.1, link_linux.go,
// addr_linux.go, route_linux.go, neigh_linux.go).
func FromOtherSocket(err error) bool {
	return strings.HasPrefix(err.Error(), "Wrong sender portid ")
}

// dumpAttempts is how often a listing that the kernel interrupted (because
// something changed meanwhile) is started again.
const dumpAttempts = 5
