package drift

import (
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Kinds says which netlink updates a subscriber follows.
type Kinds struct {
	// Links: devices; Addrs: IPv4 and IPv6 addresses; Routes: IPv4 and
	// IPv6 routes; Neighbors: neighbour and bridge FDB entries.
	Links, Addrs, Routes, Neighbors bool
}

// Hub shares the agent's netlink subscriptions: one per network namespace
// and kind of update, however many cells follow it, each update received
// and parsed once and handed to every subscriber of its kind. Each
// subscription's receiver is a goroutine whose stack stays at 128 KB for
// good (netlink's NetlinkSocket.Receive keeps its 64 KB buffer on the
// stack), and each parses every update the kernel sends, pods' routes
// among them. A subscription is opened by the first subscriber (in its
// job, never in a constructor) and closed when the last one leaves.
//
// Each subscriber has a queue of its own, so a slow one holds no other
// back: the hub reads the socket as fast as updates come. A queue that
// grows past its bound is dropped and its subscriber is told to start
// over (Batch.Resync); a subscription that ends (the kernel dropped
// updates, ENOBUFS) ends every subscriber's updates with its error.
type Hub struct {
	// socketBuffer is the subscriptions' receive buffer (0: SocketBuffer).
	socketBuffer int
	// force, if set, says whether to force it (else ForceSocketBuffer).
	force *bool

	mu   sync.Mutex
	subs map[hubKey]*shared
}

// queueLimit is how many updates wait for a subscriber before the hub
// drops them and tells it to start over: more than a hundred pods' ADDs
// bring (each a veth pair, its addresses and routes), and a bound on what
// a stuck subscriber holds.
const queueLimit = 16384

// hub is the agent's: the cells that follow netlink share it.
var hub = &Hub{}

// hubKey names a subscription: a network namespace, by its device and
// inode, and the kind of update.
type hubKey struct {
	dev, ino uint64
	kind     kind
}

type kind int

const (
	kindLinks kind = iota
	kindAddrs
	kindRoutes
	kindNeighbors
)

func (k kind) String() string {
	return [...]string{"link", "address", "route", "neighbour"}[k]
}

// shared is one netlink subscription and its subscribers.
type shared struct {
	key hubKey
	// done ends netlink's subscription; exited is closed once its
	// channel is, netlink's receiving goroutine gone.
	done, exited chan struct{}
	// pending is how many updates wait in the channel (for tests).
	pending func() int
	// log is the first subscriber's, for netlink's reports.
	log *slog.Logger

	// subs are the subscribers, read by the dispatcher without a lock,
	// replaced (copied) under mu.
	subs atomic.Pointer[[]*Subscriber]

	mu    sync.Mutex
	ended bool
	err   error // netlink's last report, to say why updates ended
	// closed: done is closed (h.mu held).
	closed bool
}

// Subscriber is one follower's share of the hub's subscriptions: updates
// of the kinds it asked for queue for it from the moment Subscribe
// returns.
type Subscriber struct {
	hub    *Hub
	shares []*shared
	// routes keeps a route update for this subscriber; nil keeps all.
	routes func(netlink.RouteUpdate) bool
	ready  chan struct{}

	mu sync.Mutex
	// limit bounds the queue (0: the hub's).
	limit  int
	q      Batch
	queued int
	// lost: the queue overflowed and was dropped; the next Take says
	// Resync.
	lost bool
	// err: a subscription ended; Take returns it once the queue is empty.
	err error
}

// Subscribe subscribes to the kinds of updates in the network namespace
// at netnsPath ("" for the agent's own), opening the subscriptions that
// are not open yet. routes, if not nil, keeps only the route updates it
// returns true for (the others are not queued). log is for
// ForceSocketBuffer. Close the Subscriber when done.
//
// Updates the kernel sent before Subscribe returned may still be queued
// after it (the hub had not read them yet): a subscriber that lists what
// is there after subscribing, then applies its queued updates in order,
// converges on the kernel's state.
func (h *Hub) Subscribe(netnsPath string, kinds Kinds, routes func(netlink.RouteUpdate) bool, log *slog.Logger) (*Subscriber, error) {
	path := netnsPath
	if path == "" {
		path = "/proc/self/ns/net"
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return nil, fmt.Errorf("network namespace %s: %w", path, err)
	}
	s := &Subscriber{hub: h, routes: routes, ready: make(chan struct{}, 1)}
	var want []kind
	for k, on := range map[kind]bool{kindLinks: kinds.Links, kindAddrs: kinds.Addrs, kindRoutes: kinds.Routes, kindNeighbors: kinds.Neighbors} {
		if on {
			want = append(want, k)
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, k := range want {
		key := hubKey{dev: st.Dev, ino: st.Ino, kind: k}
		sh := h.subs[key]
		if sh == nil {
			var err error
			if sh, err = h.open(key, netnsPath, log); err != nil {
				// Outside h.mu: leaving may close a subscription, which
				// waits for its dispatcher, which takes h.mu.
				h.mu.Unlock()
				s.Close()
				h.mu.Lock()
				return nil, err
			}
			if h.subs == nil {
				h.subs = map[hubKey]*shared{}
			}
			h.subs[key] = sh
		}
		sh.add(s)
		s.shares = append(s.shares, sh)
	}
	return s, nil
}

// open subscribes to the updates of key's kind in the namespace at
// netnsPath and starts handing them out.
func (h *Hub) open(key hubKey, netnsPath string, log *slog.Logger) (*shared, error) {
	ns := netns.None()
	if netnsPath != "" {
		var err error
		if ns, err = netns.GetFromPath(netnsPath); err != nil {
			return nil, fmt.Errorf("open network namespace %s: %w", netnsPath, err)
		}
		// The subscription's socket keeps the namespace.
		defer ns.Close()
	}
	if log == nil {
		log = slog.Default()
	}
	sh := &shared{key: key, done: make(chan struct{}), exited: make(chan struct{}), log: log}
	size := h.socketBuffer
	if size == 0 {
		size = SocketBuffer
	}
	var force bool
	if h.force != nil {
		force = *h.force
	} else {
		force = ForceSocketBuffer(log)
	}
	var err error
	switch key.kind {
	case kindLinks:
		ch := make(chan netlink.LinkUpdate, updateBuffer)
		sh.pending = func() int { return len(ch) }
		if err = netlink.LinkSubscribeWithOptions(ch, sh.done, netlink.LinkSubscribeOptions{Namespace: &ns, ErrorCallback: sh.onError,
			ReceiveBufferSize: size, ReceiveBufferForceSize: force}); err == nil {
			go dispatch(h, sh, ch, nil, func(b *Batch, u netlink.LinkUpdate) { b.Links = append(b.Links, u) })
		}
	case kindAddrs:
		ch := make(chan netlink.AddrUpdate, updateBuffer)
		sh.pending = func() int { return len(ch) }
		if err = netlink.AddrSubscribeWithOptions(ch, sh.done, netlink.AddrSubscribeOptions{Namespace: &ns, ErrorCallback: sh.onError,
			ReceiveBufferSize: size, ReceiveBufferForceSize: force}); err == nil {
			go dispatch(h, sh, ch, nil, func(b *Batch, u netlink.AddrUpdate) { b.Addrs = append(b.Addrs, u) })
		}
	case kindRoutes:
		ch := make(chan netlink.RouteUpdate, updateBuffer)
		sh.pending = func() int { return len(ch) }
		if err = netlink.RouteSubscribeWithOptions(ch, sh.done, netlink.RouteSubscribeOptions{Namespace: &ns, ErrorCallback: sh.onError,
			ReceiveBufferSize: size, ReceiveBufferForceSize: force}); err == nil {
			go dispatch(h, sh, ch, func(s *Subscriber, u netlink.RouteUpdate) bool { return s.routes == nil || s.routes(u) },
				func(b *Batch, u netlink.RouteUpdate) { b.Routes = append(b.Routes, u) })
		}
	case kindNeighbors:
		ch := make(chan netlink.NeighUpdate, updateBuffer)
		sh.pending = func() int { return len(ch) }
		if err = netlink.NeighSubscribeWithOptions(ch, sh.done, netlink.NeighSubscribeOptions{Namespace: &ns, ErrorCallback: sh.onError,
			ReceiveBufferSize: size, ReceiveBufferForceSize: force}); err == nil {
			go dispatch(h, sh, ch, nil, func(b *Batch, u netlink.NeighUpdate) { b.Neighbors = append(b.Neighbors, u) })
		}
	}
	if err != nil {
		return nil, fmt.Errorf("subscribe to netlink %s updates: %w", key.kind, err)
	}
	return sh, nil
}

// dispatch hands every update of ch to the subscribers of sh that keep
// it (keep nil: all of them) until netlink closes ch, then ends their
// updates.
func dispatch[U any](h *Hub, sh *shared, ch <-chan U, keep func(*Subscriber, U) bool, add func(*Batch, U)) {
	for u := range ch {
		for _, s := range sh.subscribers() {
			if keep == nil || keep(s, u) {
				s.push(func(b *Batch) { add(b, u) })
			}
		}
	}
	sh.end(h)
}

func (sh *shared) subscribers() []*Subscriber {
	if p := sh.subs.Load(); p != nil {
		return *p
	}
	return nil
}

// add makes s a subscriber; if the subscription has ended, s's updates
// end at once.
func (sh *shared) add(s *Subscriber) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	subs := append(slices.Clip(sh.subscribers()), s)
	sh.subs.Store(&subs)
	if sh.ended {
		s.fail(sh.endErr())
	}
}

// remove removes s and says how many subscribers are left.
func (sh *shared) remove(s *Subscriber) int {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	subs := slices.DeleteFunc(slices.Clone(sh.subscribers()), func(x *Subscriber) bool { return x == s })
	sh.subs.Store(&subs)
	return len(subs)
}

// onError keeps netlink's last report, to say why updates ended, and
// logs it (a dump interrupted, a message netlink could not decode and
// dropped, the receive that failed); closing the subscription makes its
// receive fail, which is not one, and neither is a message of another
// socket, which netlink drops.
func (sh *shared) onError(err error) {
	select {
	case <-sh.done:
		return
	default:
	}
	if FromOtherSocket(err) {
		sh.log.Debug("Netlink message from another socket dropped", "kind", sh.key.kind.String(), "error", err)
		return
	}
	sh.log.Warn("Netlink subscription error", "kind", sh.key.kind.String(), "error", err)
	sh.mu.Lock()
	sh.err = err
	sh.mu.Unlock()
}

// end: netlink closed the subscription's channel. Its subscribers' updates
// end, and a new subscriber gets a new subscription.
func (sh *shared) end(h *Hub) {
	h.mu.Lock()
	if h.subs[sh.key] == sh {
		delete(h.subs, sh.key)
	}
	h.mu.Unlock()
	sh.mu.Lock()
	sh.ended = true
	err := sh.endErr()
	for _, s := range sh.subscribers() {
		s.fail(err)
	}
	sh.mu.Unlock()
	close(sh.exited)
}

// endErr says why the updates ended; sh.mu is held.
func (sh *shared) endErr() error {
	if sh.err != nil {
		return fmt.Errorf("netlink %s updates ended: %w", sh.key.kind, sh.err)
	}
	return fmt.Errorf("netlink %s updates ended", sh.key.kind)
}

// push queues an update (add appends it) unless the queue is over limit,
// then drops the queue and marks it lost.
func (s *Subscriber) push(add func(*Batch)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lost || s.err != nil {
		return
	}
	limit := queueLimit
	if s.limit > 0 {
		limit = s.limit
	}
	if s.queued >= limit {
		s.q, s.queued, s.lost = Batch{}, 0, true
	} else {
		add(&s.q)
		s.queued++
	}
	s.signal()
}

func (s *Subscriber) setLimit(limit int) {
	s.mu.Lock()
	s.limit = limit
	s.mu.Unlock()
}

func (s *Subscriber) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil {
		s.err = err
	}
	s.signal()
}

func (s *Subscriber) signal() {
	select {
	case s.ready <- struct{}{}:
	default:
	}
}

// Ready receives when Take has something: updates, a Resync or the end.
func (s *Subscriber) Ready() <-chan struct{} { return s.ready }

// Take returns the updates queued so far, at most max of them (in order,
// for each kind), without waiting. After the queue overflowed it returns
// a Batch with Resync and nothing else: updates were lost before those
// queued from now on. Once a subscription has ended and its updates are
// taken, it returns the error that says why.
func (s *Subscriber) Take(max int) (Batch, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lost {
		s.lost = false
		return Batch{Resync: true}, nil
	}
	if s.queued == 0 {
		return Batch{}, s.err
	}
	var b Batch
	n := max
	b.Links, s.q.Links = split(s.q.Links, &n)
	b.Addrs, s.q.Addrs = split(s.q.Addrs, &n)
	b.Routes, s.q.Routes = split(s.q.Routes, &n)
	b.Neighbors, s.q.Neighbors = split(s.q.Neighbors, &n)
	s.queued -= max - n
	if s.queued > 0 || s.err != nil {
		s.signal()
	}
	return b, nil
}

// split takes up to *n elements off the front of q, counting them off
// *n. What is left is copied to a new array, or nil, so that a burst's
// backing array does not stay with the queue.
func split[U any](q []U, n *int) (taken, left []U) {
	if len(q) <= *n {
		*n -= len(q)
		return q, nil
	}
	taken, left = q[:*n:*n], append([]U(nil), q[*n:]...)
	*n = 0
	return taken, left
}

// Close leaves the hub's subscriptions; the last subscriber of one closes
// it and waits until netlink's receiving goroutine has ended (the hub
// reads its channel to the end, so it is never left blocked sending).
func (s *Subscriber) Close() {
	var closing []*shared
	s.hub.mu.Lock()
	for _, sh := range s.shares {
		if sh.remove(s) == 0 && !sh.closed {
			sh.closed = true
			if s.hub.subs[sh.key] == sh {
				delete(s.hub.subs, sh.key)
			}
			closing = append(closing, sh)
		}
	}
	s.shares = nil
	s.hub.mu.Unlock()
	for _, sh := range closing {
		close(sh.done)
		<-sh.exited
	}
}

// numOpen is how many subscriptions the hub has open.
func (h *Hub) numOpen() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.subs)
}

// Subscribe subscribes to the agent's hub (Hub.Subscribe): the cells that
// follow netlink without a Follower (the devices watcher, the local node)
// share its subscriptions with the Followers.
func Subscribe(netnsPath string, kinds Kinds, routes func(netlink.RouteUpdate) bool, log *slog.Logger) (*Subscriber, error) {
	return hub.Subscribe(netnsPath, kinds, routes, log)
}
