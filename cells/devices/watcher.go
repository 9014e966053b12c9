package devices

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/cells/internal/drift"
)

type watcherParams struct {
	cell.In

	Config    Config
	Log       *slog.Logger
	DB        *statedb.DB
	Devices   statedb.RWTable[*Device]
	Addresses statedb.RWTable[*NodeAddress]
	Jobs      job.Group
}

// watcher keeps the tables current from netlink.
type watcher struct {
	log       *slog.Logger
	db        *statedb.DB
	devices   statedb.RWTable[*Device]
	addresses statedb.RWTable[*NodeAddress]
	sel       selector
	netnsPath string

	// devicesListed and addressesListed complete the tables' initializers:
	// consumers wait for them before they treat a missing row as absent.
	devicesListed, addressesListed func(statedb.WriteTxn)
	listedOnce                     bool
}

func registerWatcher(p watcherParams) error {
	sel, err := newSelector(p.Config)
	if err != nil {
		return err
	}
	if err := checkNetnsPath(p.Config.DevicesNetns); err != nil {
		return err
	}
	w := &watcher{
		log:       p.Log,
		db:        p.DB,
		devices:   p.Devices,
		addresses: p.Addresses,
		sel:       sel,
		netnsPath: p.Config.DevicesNetns,
	}
	txn := p.DB.WriteTxn(p.Devices, p.Addresses)
	w.devicesListed = p.Devices.RegisterInitializer(txn, "netlink-dump")
	w.addressesListed = p.Addresses.RegisterInitializer(txn, "netlink-dump")
	txn.Commit()

	// A failed subscription is retried from scratch: subscribe, list,
	// replace the tables' contents.
	p.Jobs.Add(job.OneShot("netlink", w.run,
		job.WithRetry(-1, &job.ExponentialBackoff{Min: 100 * time.Millisecond, Max: 30 * time.Second})))
	return nil
}

const (
	// updateBuffer is how many netlink updates may queue in a channel
	// while a batch is being written; a burst waits behind them in the
	// kernel, in the socket's receive buffer (drift.SocketBuffer), which
	// takes memory only while messages wait, where a channel's buffer is
	// the agent's for good.
	updateBuffer = 64
	// maxBatch bounds one write transaction, so that during a flood of
	// updates readers still see progress.
	maxBatch = 4096
	// dumpAttempts is how often a listing that the kernel interrupted
	// (because something changed meanwhile) is started again.
	dumpAttempts = 5
)

func (w *watcher) run(ctx context.Context, health cell.Health) error {
	ns := netns.None()
	if w.netnsPath != "" {
		var err error
		if ns, err = netns.GetFromPath(w.netnsPath); err != nil {
			return fmt.Errorf("open network namespace %s (--devices-netns): %w", w.netnsPath, err)
		}
		defer ns.Close()
	}

	// Subscribing before listing means nothing is missed: a change made
	// meanwhile also arrives as an update after the listing. Applying such
	// an update again is harmless, since every update carries the whole
	// state of its link or address.
	sub := &subscription{log: w.log, done: make(chan struct{})}
	defer sub.close()
	if err := sub.start(ns); err != nil {
		return err
	}
	state, err := list(ns)
	if err != nil {
		return err
	}
	// What queued up during the listing goes into the same transaction,
	// so readers never see the listing without the changes it missed.
	if err := sub.receiveBatch(ctx, state, false); err != nil {
		return err
	}
	txn := w.db.WriteTxn(w.devices, w.addresses)
	if err := state.write(txn, w.sel, w.devices, w.addresses, true); err != nil {
		txn.Abort()
		return err
	}
	w.devicesListed(txn)
	w.addressesListed(txn)
	txn.Commit()
	if !w.listedOnce {
		w.listedOnce = true
		w.warnUnmatched(state)
	}
	health.OK("Following netlink updates")

	for {
		if err := sub.receiveBatch(ctx, state, true); err != nil {
			return err
		}
		txn := w.db.WriteTxn(w.devices, w.addresses)
		if err := state.write(txn, w.sel, w.devices, w.addresses, false); err != nil {
			txn.Abort()
			return err
		}
		txn.Commit()
	}
}

// warnUnmatched warns about --devices patterns that match no device: most
// likely a typo, which would leave the node without addresses.
func (w *watcher) warnUnmatched(state *netState) {
	for _, p := range w.sel.patterns {
		matched := false
		for _, d := range state.links {
			matched = matched || globMatch(p, d.Name)
		}
		if !matched {
			w.log.Warn("--devices pattern matches no device", "pattern", p)
		}
	}
}

// list reads every link and address of ns.
func list(ns netns.NsHandle) (*netState, error) {
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink handle: %w", err)
	}
	defer h.Close()
	for range dumpAttempts - 1 {
		state, err := listOnce(h)
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			return state, err
		}
	}
	return listOnce(h)
}

func listOnce(h *netlink.Handle) (*netState, error) {
	links, err := h.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	addrs, err := h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("list addresses: %w", err)
	}
	state := newNetState()
	for _, l := range links {
		state.setLink(l)
	}
	for _, a := range addrs {
		if da, ok := deviceAddress(*a.IPNet, a.Flags, a.Scope); ok {
			state.appendAddr(a.LinkIndex, da)
		}
	}
	return state, nil
}

// subscription is a pair of netlink subscriptions, to links and to
// addresses.
type subscription struct {
	log          *slog.Logger
	done         chan struct{}
	links        chan netlink.LinkUpdate
	addrs        chan netlink.AddrUpdate
	mu           sync.Mutex
	linkErr      error
	addrErr      error
	linksStarted bool
	addrsStarted bool
}

func (s *subscription) start(ns netns.NsHandle) error {
	s.links = make(chan netlink.LinkUpdate, updateBuffer)
	s.addrs = make(chan netlink.AddrUpdate, updateBuffer)
	err := netlink.LinkSubscribeWithOptions(s.links, s.done, netlink.LinkSubscribeOptions{
		Namespace:     &ns,
		ErrorCallback: func(err error) { s.onError(&s.linkErr, err) },
		// A burst of pods' veths must not overflow it (drift.SocketBuffer).
		ReceiveBufferSize: drift.SocketBuffer, ReceiveBufferForceSize: drift.ForceSocketBuffer(s.log),
	})
	if err != nil {
		return fmt.Errorf("subscribe to netlink link updates: %w", err)
	}
	s.linksStarted = true
	err = netlink.AddrSubscribeWithOptions(s.addrs, s.done, netlink.AddrSubscribeOptions{
		Namespace:         &ns,
		ErrorCallback:     func(err error) { s.onError(&s.addrErr, err) },
		ReceiveBufferSize: drift.SocketBuffer, ReceiveBufferForceSize: drift.ForceSocketBuffer(s.log),
	})
	if err != nil {
		return fmt.Errorf("subscribe to netlink address updates: %w", err)
	}
	s.addrsStarted = true
	return nil
}

// onError records err for when the updates stop. netlink calls it from its
// receiving goroutine, both for errors it skips and for the one that ends
// the subscription.
func (s *subscription) onError(into *error, err error) {
	select {
	case <-s.done:
		// Closing the subscription fails its receive: expected.
		return
	default:
	}
	if drift.FromOtherSocket(err) {
		// A message another socket sent to the multicast group, not the
		// kernel's: netlink drops it and goes on. A program listing through
		// its subscription (netlink's ListExisting) as root does this.
		s.log.Debug("Netlink message from another socket dropped", "error", err)
		return
	}
	s.mu.Lock()
	*into = err
	s.mu.Unlock()
	s.log.Warn("Netlink subscription error", "error", err)
}

// close ends both subscriptions and waits for their goroutines, which
// may be blocked sending an update.
func (s *subscription) close() {
	close(s.done)
	if s.linksStarted {
		for range s.links {
		}
	}
	if s.addrsStarted {
		for range s.addrs {
		}
	}
}

// receiveBatch applies queued updates to state, up to maxBatch. With wait
// it first waits for one. It fails once either subscription has ended.
func (s *subscription) receiveBatch(ctx context.Context, state *netState, wait bool) error {
	n := 0
	if wait {
		var err error
		select {
		case <-ctx.Done():
			return ctx.Err()
		case u, ok := <-s.links:
			err = s.applyLink(state, u, ok)
		case u, ok := <-s.addrs:
			err = s.applyAddr(state, u, ok)
		}
		if err != nil {
			return err
		}
		n++
	}
	for ; n < maxBatch; n++ {
		var err error
		select {
		case u, ok := <-s.links:
			err = s.applyLink(state, u, ok)
		case u, ok := <-s.addrs:
			err = s.applyAddr(state, u, ok)
		default:
			return nil
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (s *subscription) applyLink(state *netState, u netlink.LinkUpdate, ok bool) error {
	if !ok {
		return s.ended("link", &s.linkErr)
	}
	if u.Header.Type == unix.RTM_DELLINK {
		state.deleteLink(int(u.Index))
	} else {
		state.setLink(u.Link)
	}
	return nil
}

func (s *subscription) applyAddr(state *netState, u netlink.AddrUpdate, ok bool) error {
	if !ok {
		return s.ended("address", &s.addrErr)
	}
	a, valid := deviceAddress(u.LinkAddress, u.Flags, u.Scope)
	switch {
	case !valid:
	case u.NewAddr:
		state.setAddr(u.LinkIndex, a)
	default:
		state.deleteAddr(u.LinkIndex, a)
	}
	return nil
}

func (s *subscription) ended(kind string, errp *error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if *errp == nil {
		return fmt.Errorf("netlink %s updates ended", kind)
	}
	return fmt.Errorf("netlink %s updates ended: %w", kind, *errp)
}
