package devices

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
	// state of its link or address. The subscriptions are the agent's
	// shared ones (drift.Subscribe): routing follows the same links.
	sub, err := drift.Subscribe(w.netnsPath, drift.Kinds{Links: true, Addrs: true}, nil, w.log)
	if err != nil {
		return err
	}
	defer sub.Close()
	state, err := list(ns)
	if err != nil {
		return err
	}
	// What queued up during the listing goes into the same transaction,
	// so readers never see the listing without the changes it missed.
	if err := apply(sub, state); err != nil {
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
		select {
		case <-ctx.Done():
			return nil
		case <-sub.Ready():
		}
		if err := apply(sub, state); err != nil {
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

// apply applies the updates queued for sub to state, up to maxBatch. It
// fails once a subscription has ended, or if updates were dropped while
// this watcher was busy (the run starts over with a new listing).
func apply(sub *drift.Subscriber, state *netState) error {
	b, err := sub.Take(maxBatch)
	if err != nil {
		return err
	}
	if b.Resync {
		return errors.New("netlink updates dropped while the devices watcher was busy: listing again")
	}
	for _, u := range b.Links {
		if u.Header.Type == unix.RTM_DELLINK {
			state.deleteLink(int(u.Index))
		} else {
			state.setLink(u.Link)
		}
	}
	for _, u := range b.Addrs {
		a, valid := deviceAddress(u.LinkAddress, u.Flags, u.Scope)
		switch {
		case !valid:
		case u.NewAddr:
			state.setAddr(u.LinkIndex, a)
		default:
			state.deleteAddr(u.LinkIndex, a)
		}
	}
	return nil
}
