package kvstore

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/cilium/hive/cell"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// maxKeysPerLease bounds the keys on one lease: etcd applies a put with a
// lease in time linear in the keys already on it.
const maxKeysPerLease = 1000

// leases are the agent's etcd leases and the keys written on them. A key
// goes on the open lease until it holds maxKeys keys, then a new one is
// granted. The values are kept, so that when a lease is lost (it expired
// during an outage, or someone revoked it) the run job writes its keys
// again on a fresh lease.
type leases struct {
	c       *etcdClient
	ttl     time.Duration
	maxKeys int

	mu   sync.Mutex
	open *lease
	all  map[clientv3.LeaseID]*lease
	keys map[string]*leasedKey
	// lost are keys whose lease was lost, to be written again.
	lost    map[string]struct{}
	trigger chan struct{}
	// check asks the run job to check the leases exist.
	check chan struct{}
	// granting is held while a lease is granted.
	granting chan struct{}
}

type lease struct {
	id     clientv3.LeaseID
	keys   int
	cancel context.CancelFunc
}

type leasedKey struct {
	value []byte
	lease *lease // nil while it waits to be written again
}

func newLeases(c *etcdClient, ttl time.Duration) *leases {
	return &leases{
		c:       c,
		ttl:     ttl,
		maxKeys: maxKeysPerLease,
		all:     map[clientv3.LeaseID]*lease{},
		keys:    map[string]*leasedKey{},
		lost:    map[string]struct{}{},
		trigger: make(chan struct{}, 1),

		check:    make(chan struct{}, 1),
		granting: make(chan struct{}, 1),
	}
}

func (ls *leases) counts() (leases, keys int) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return len(ls.all), len(ls.keys)
}

// write runs op, which writes key on the lease it is given and says
// whether the key is now on it, and records the key. A key already on a
// live lease stays on it.
func (ls *leases) write(ctx context.Context, key string, value []byte, op func(clientv3.LeaseID) (bool, error)) error {
	l, reserved, err := ls.acquire(ctx, key)
	if err != nil {
		return err
	}
	ok, err := op(l.id)
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if err != nil || !ok {
		if reserved {
			l.keys--
		}
		return err
	}
	if old := ls.keys[key]; old != nil && old.lease != nil && old.lease != l {
		old.lease.keys--
	}
	ls.keys[key] = &leasedKey{value: value, lease: l}
	delete(ls.lost, key)
	return nil
}

// acquire is the lease for key: its own if it has a live one, else a slot
// on the open lease (reserved says so), granting a new lease when the open
// one is full or gone.
func (ls *leases) acquire(ctx context.Context, key string) (l *lease, reserved bool, err error) {
	ls.mu.Lock()
	if k := ls.keys[key]; k != nil && k.lease != nil {
		ls.mu.Unlock()
		return k.lease, false, nil
	}
	if l := ls.reserve(); l != nil {
		ls.mu.Unlock()
		return l, true, nil
	}
	ls.mu.Unlock()

	// One grant at a time: the first writes after a start (or after the
	// open lease filled up) all find no open lease, and would each open
	// one. Those that waited take a slot on the lease just granted.
	select {
	case ls.granting <- struct{}{}:
	case <-ctx.Done():
		return nil, false, ctx.Err()
	}
	defer func() { <-ls.granting }()
	ls.mu.Lock()
	if l := ls.reserve(); l != nil {
		ls.mu.Unlock()
		return l, true, nil
	}
	ls.mu.Unlock()

	resp, err := ls.c.cli.Grant(ctx, int64(ls.ttl.Seconds()))
	if err != nil {
		return nil, false, err
	}
	kctx, cancel := context.WithCancel(ls.c.ctx)
	alive, err := ls.c.cli.KeepAlive(kctx, resp.ID)
	if err != nil {
		cancel()
		return nil, false, err
	}
	l = &lease{id: resp.ID, keys: 1, cancel: cancel}
	ls.mu.Lock()
	ls.all[l.id] = l
	ls.open = l
	ls.mu.Unlock()
	go ls.keepAlive(kctx, l, alive)
	return l, true, nil
}

// reserve takes a slot on the open lease, if it has one; ls.mu is held.
func (ls *leases) reserve() *lease {
	if ls.open == nil || ls.open.keys >= ls.maxKeys {
		return nil
	}
	ls.open.keys++
	return ls.open
}

// keepAlive drains the lease's keep-alive answers; the channel closes when
// the lease is gone (or the agent stops).
func (ls *leases) keepAlive(ctx context.Context, l *lease, alive <-chan *clientv3.LeaseKeepAliveResponse) {
	for range alive {
	}
	if ctx.Err() != nil {
		return
	}
	ls.lose(l)
}

// lose moves the keys of a lease that is gone to the lost keys, and has
// the run job write them again.
func (ls *leases) lose(l *lease) {
	ls.mu.Lock()
	if ls.all[l.id] != l {
		ls.mu.Unlock()
		return
	}
	delete(ls.all, l.id)
	if ls.open == l {
		ls.open = nil
	}
	n := 0
	for key, k := range ls.keys {
		if k.lease == l {
			k.lease = nil
			ls.lost[key] = struct{}{}
			n++
		}
	}
	ls.mu.Unlock()
	// Its keep-alive goroutine ends without reporting it again.
	l.cancel()
	if ls.c.metrics != nil {
		ls.c.metrics.leasesLost.Inc()
	}
	ls.c.log.Warn("kvstore lease lost; writing its keys again on a new lease", "lease", int64(l.id), "keys", n)
	select {
	case ls.trigger <- struct{}{}:
	default:
	}
}

// suspect has the run job ask etcd whether the leases still exist: a
// replaced store has none of them, and their keep-alives would tell only
// at their next renewal, a third of the TTL later.
func (ls *leases) suspect() {
	select {
	case ls.check <- struct{}{}:
	default:
	}
}

// dropGone loses the leases etcd does not know; it says whether it could
// ask about each.
func (ls *leases) dropGone(ctx context.Context) bool {
	ls.mu.Lock()
	all := slices.Collect(maps.Values(ls.all))
	ls.mu.Unlock()
	for _, l := range all {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		resp, err := ls.c.cli.TimeToLive(cctx, l.id)
		cancel()
		switch {
		case errors.Is(err, rpctypes.ErrLeaseNotFound) || (err == nil && resp.TTL <= 0):
			ls.lose(l)
		case err != nil:
			ls.c.log.Debug("Checking a kvstore lease failed; will retry", "lease", int64(l.id), "error", err)
			return false
		}
	}
	return true
}

// forget stops tracking key (it was deleted).
func (ls *leases) forget(key string) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if k := ls.keys[key]; k != nil {
		if k.lease != nil {
			k.lease.keys--
		}
		delete(ls.keys, key)
		delete(ls.lost, key)
	}
}

// run writes the keys of lost leases again until the agent stops.
func (ls *leases) run(ctx context.Context, _ cell.Health) error {
	b := newBackoff()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ls.check:
			for ctx.Err() == nil && !ls.dropGone(ctx) {
				b.Sleep(ctx)
			}
			b.Reset()
		case <-ls.trigger:
		}
		for ctx.Err() == nil {
			if ls.rewrite(ctx) {
				b.Reset()
				break
			}
			b.Sleep(ctx)
		}
	}
}

// rewrite writes every lost key again and says whether all went through.
func (ls *leases) rewrite(ctx context.Context) bool {
	ls.mu.Lock()
	pending := make(map[string][]byte, len(ls.lost))
	for key := range ls.lost {
		pending[key] = ls.keys[key].value
	}
	ls.mu.Unlock()
	written := 0
	for key, value := range pending {
		ls.mu.Lock()
		_, still := ls.lost[key]
		ls.mu.Unlock()
		if !still { // deleted, or written by its owner meanwhile
			continue
		}
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := ls.c.UpdateIfDifferent(wctx, key, value, Leased())
		cancel()
		if err != nil {
			ls.c.log.Debug("Writing a key of a lost lease again failed; will retry", "key", key, "error", err)
			return false
		}
		written++
	}
	if written > 0 {
		ls.c.log.Info("kvstore keys of lost leases written again", "keys", written)
	}
	return true
}
