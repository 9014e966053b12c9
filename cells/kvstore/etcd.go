package kvstore

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/time/rate"

	"github.com/cellium/cellium/pkg/backoff"
)

// etcdClient is the Client of --kvstore=etcd. Its etcd connection is made
// by the cell's start hook (connect); before that, and while etcd cannot
// be reached, calls fail with ErrUnavailable when their context ends.
type etcdClient struct {
	log    *slog.Logger
	prefix string // "<kvstore-prefix>/"
	cli    *clientv3.Client
	limit  *rate.Limiter // nil: no etcd.qps
	// pageSize bounds the keys of one listing response (listPageSize;
	// tests make it small).
	pageSize int64

	leases  *leases
	locks   *locks
	metrics *kvMetrics

	// Set by the start hook.
	configFile string
	handshakes *handshakes // nil without TLS
	ctx        context.Context
	cancel     context.CancelFunc

	// statusBase and statusTimeout pace kvstore-status (see
	// statusInterval).
	statusBase, statusTimeout time.Duration

	mu     sync.Mutex
	status Status
	// seen is what the client has seen of the store, to tell when it is
	// replaced; replaced is closed (and made anew) when it is.
	seen     seen
	replaced chan struct{}
}

// seen is the store as the client saw it last: its cluster ID, and the
// highest revision a read returned.
type seen struct {
	epoch     uint64 // replacements seen so far
	clusterID uint64
	rev       int64
}

func newEtcdClient(log *slog.Logger, cfg Config, opts etcdOptions) *etcdClient {
	c := &etcdClient{
		log:    log,
		prefix: cfg.KVStorePrefix + "/",
		status: Status{State: StateConnecting, Endpoints: opts.endpoints, Since: time.Now()},

		pageSize:      listPageSize,
		statusBase:    statusIntervalBase,
		statusTimeout: statusTimeout,
		replaced:      make(chan struct{}),
	}
	if opts.qps > 0 {
		c.limit = rate.NewLimiter(rate.Limit(opts.qps), max(1, int(opts.qps)))
	}
	c.leases = newLeases(c, cfg.KVStoreLeaseTTL)
	c.locks = newLocks(c, defaultLockTTL)
	return c
}

func (c *etcdClient) Enabled() bool { return true }

func (c *etcdClient) Status() Status {
	c.mu.Lock()
	s := c.status
	c.mu.Unlock()
	s.Leases, s.LeasedKeys = c.leases.counts()
	return s
}

// setState records a state change and says whether it is one.
func (c *etcdClient) setState(state State, lastErr error) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	changed := c.status.State != state
	if changed {
		c.status.State, c.status.Since = state, time.Now()
	}
	if lastErr != nil {
		c.status.LastError = lastErr.Error()
	}
	return changed
}

// seenNow is what the client has seen of the store, and the channel
// closed when it is found replaced; taken before a read whose header
// observe checks.
func (c *etcdClient) seenNow() (seen, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.seen, c.replaced
}

// observe checks the header of a linearizable read made after before was
// taken: a store that is not the one the client talked to (an etcd
// restored from a backup, a member rebuilt empty) has another cluster ID,
// or a revision below one a read returned before. Watches resumed on it
// at their old revision would wait for revisions it has not reached, so
// the client says so: watches list again, and the leases are checked.
func (c *etcdClient) observe(before seen, h *etcdserverpb.ResponseHeader) {
	if h == nil {
		return
	}
	c.mu.Lock()
	if c.seen.epoch != before.epoch {
		// Sent to the store before the replacement was seen.
		c.mu.Unlock()
		return
	}
	var why string
	switch {
	case c.seen.clusterID != 0 && h.ClusterId != c.seen.clusterID:
		why = fmt.Sprintf("its cluster ID changed from %x to %x", c.seen.clusterID, h.ClusterId)
	case h.Revision < before.rev:
		why = fmt.Sprintf("its revision went back from %d to %d", before.rev, h.Revision)
	}
	if why == "" {
		c.seen.clusterID, c.seen.rev = h.ClusterId, max(c.seen.rev, h.Revision)
		c.mu.Unlock()
		return
	}
	c.seen = seen{epoch: c.seen.epoch + 1, clusterID: h.ClusterId, rev: h.Revision}
	close(c.replaced)
	c.replaced = make(chan struct{})
	c.status.LastError = "etcd was replaced: " + why
	c.mu.Unlock()
	c.log.Warn("etcd was replaced (restored from a backup, or rebuilt); listing every watched prefix again and writing the leased keys again", "reason", why)
	if c.metrics != nil {
		c.metrics.storeReplaced.Inc()
	}
	c.leases.suspect()
}

// wait takes a request from the etcd.qps budget.
func (c *etcdClient) wait(ctx context.Context) error {
	if c.cli == nil {
		<-ctx.Done()
		return fmt.Errorf("%w: not connected: %w", ErrUnavailable, ctx.Err())
	}
	if c.limit != nil {
		if err := c.limit.Wait(ctx); err != nil {
			return fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
	}
	return nil
}

// wrap gives an etcd error the kind callers test for: a call that did not
// get through before its context ended is ErrUnavailable.
func wrap(op, key string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) || errors.Is(err, ErrUnavailable) {
		if errors.Is(err, ErrUnavailable) {
			return fmt.Errorf("kvstore %s %s: %w", op, key, err)
		}
		return fmt.Errorf("kvstore %s %s: %w: %w", op, key, ErrUnavailable, err)
	}
	return fmt.Errorf("kvstore %s %s: %w", op, key, err)
}

func (c *etcdClient) Get(ctx context.Context, key string) (_ []byte, _ bool, err error) {
	defer c.metrics.observe("get", time.Now(), &err)
	if err := c.wait(ctx); err != nil {
		return nil, false, wrap("get", key, err)
	}
	resp, err := c.cli.Get(ctx, c.prefix+key)
	if err != nil {
		return nil, false, wrap("get", key, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, false, nil
	}
	return resp.Kvs[0].Value, true, nil
}

func (c *etcdClient) List(ctx context.Context, prefix string) (_ []KeyValue, err error) {
	defer c.metrics.observe("list", time.Now(), &err)
	if err := c.wait(ctx); err != nil {
		return nil, wrap("list", prefix, err)
	}
	var out []KeyValue
	_, err = c.listPages(ctx, c.prefix+prefix, func(kvs []*mvccpb.KeyValue) {
		for _, kv := range kvs {
			out = append(out, KeyValue{
				Key:         strings.TrimPrefix(string(kv.Key), c.prefix),
				Value:       kv.Value,
				ModRevision: kv.ModRevision,
				Lease:       kv.Lease,
			})
		}
	})
	if err != nil {
		return nil, wrap("list", prefix, err)
	}
	return out, nil
}

// listPageSize is how many keys one listing response holds at most: a
// prefix of a million keys is a thousand responses, not one.
const listPageSize = 1000

// listPages lists the keys under the etcd prefix full in pages of
// c.pageSize keys, handing each page to fn: the first page is a
// linearizable read, and the others are read at its revision, so the
// pages together are one consistent listing (a revision compacted
// meanwhile fails it with etcd's ErrCompacted). It returns the first
// page's header: the listing's revision.
func (c *etcdClient) listPages(ctx context.Context, full string, fn func([]*mvccpb.KeyValue)) (*etcdserverpb.ResponseHeader, error) {
	end := clientv3.GetPrefixRangeEnd(full)
	from := full
	var header *etcdserverpb.ResponseHeader
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(c.pageSize)}
		if header != nil {
			opts = append(opts, clientv3.WithRev(header.Revision))
		}
		resp, err := c.cli.Get(ctx, from, opts...)
		if err != nil {
			return nil, err
		}
		if header == nil {
			header = resp.Header
		}
		fn(resp.Kvs)
		if !resp.More || len(resp.Kvs) == 0 {
			return header, nil
		}
		// Keys come in order: the next page starts just after the last.
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

func (c *etcdClient) CreateOnly(ctx context.Context, key string, value []byte, opts ...WriteOption) (_ bool, err error) {
	defer c.metrics.observe("create", time.Now(), &err)
	o := writeOpts(opts)
	if err := c.wait(ctx); err != nil {
		return false, wrap("create", key, err)
	}
	k := c.prefix + key
	if !o.leased {
		resp, err := c.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
			Then(clientv3.OpPut(k, string(value))).Commit()
		if err != nil {
			return false, wrap("create", key, err)
		}
		return resp.Succeeded, nil
	}
	created := false
	err = c.leases.write(ctx, key, value, func(lease clientv3.LeaseID) (bool, error) {
		resp, err := c.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
			Then(clientv3.OpPut(k, string(value), clientv3.WithLease(lease))).Commit()
		if err != nil {
			return false, err
		}
		created = resp.Succeeded
		return created, nil
	})
	return created, wrap("create", key, err)
}

func (c *etcdClient) UpdateIfDifferent(ctx context.Context, key string, value []byte, opts ...WriteOption) (_ bool, err error) {
	defer c.metrics.observe("update", time.Now(), &err)
	o := writeOpts(opts)
	if err := c.wait(ctx); err != nil {
		return false, wrap("update", key, err)
	}
	k := c.prefix + key
	changed := false
	update := func(lease clientv3.LeaseID) (bool, error) {
		put := clientv3.OpPut(k, string(value))
		if lease != clientv3.NoLease {
			put = clientv3.OpPut(k, string(value), clientv3.WithLease(lease))
		}
		// One round trip: write unless the key holds value on this lease.
		resp, err := c.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.Value(k), "=", string(value)),
				clientv3.Compare(clientv3.LeaseValue(k), "=", lease)).
			Else(put).Commit()
		if err != nil {
			return false, err
		}
		changed = !resp.Succeeded
		return true, nil
	}
	if o.leased {
		err = c.leases.write(ctx, key, value, update)
	} else {
		_, err = update(clientv3.NoLease)
	}
	return changed, wrap("update", key, err)
}

func (c *etcdClient) Delete(ctx context.Context, key string) (err error) {
	defer c.metrics.observe("delete", time.Now(), &err)
	if err := c.wait(ctx); err != nil {
		return wrap("delete", key, err)
	}
	c.leases.forget(key)
	_, err = c.cli.Delete(ctx, c.prefix+key)
	return wrap("delete", key, err)
}

func (c *etcdClient) Txn(ctx context.Context, branches ...Branch) (_ int, err error) {
	defer c.metrics.observe("txn", time.Now(), &err)
	what := "transaction"
	var leased *Op
	for _, b := range branches {
		for i, op := range b.Then {
			if what == "transaction" {
				what = op.key
			}
			if !op.leased {
				continue
			}
			if leased != nil && leased.key != op.key {
				return -1, fmt.Errorf("kvstore txn %s: leased writes of two keys (%s, %s)", what, leased.key, op.key)
			}
			leased = &b.Then[i]
		}
	}
	if err := c.wait(ctx); err != nil {
		return -1, wrap("txn", what, err)
	}
	applied := -1
	commit := func(lease clientv3.LeaseID) (bool, error) {
		// Branch i is tried in the Else of branch i-1: one request.
		var resp *clientv3.TxnResponse
		var err error
		if len(branches) > 0 {
			first := branches[0]
			txn := c.cli.Txn(ctx).If(c.cmps(first.If)...).Then(c.ops(first.Then, lease)...)
			if len(branches) > 1 {
				txn = txn.Else(c.nested(branches[1:], lease))
			}
			if resp, err = txn.Commit(); err != nil {
				return false, err
			}
			applied = branchApplied(resp.Succeeded, resp.Responses, 0, len(branches))
		}
		return applied >= 0, nil
	}
	if leased != nil {
		err = c.leases.write(ctx, leased.key, leased.value, commit)
	} else {
		_, err = commit(clientv3.NoLease)
	}
	if err != nil {
		return -1, wrap("txn", what, err)
	}
	if applied >= 0 {
		for _, op := range branches[applied].Then {
			if !op.leased {
				// Deleted, or no longer leased: not written again when its
				// old lease is lost.
				c.leases.forget(op.key)
			}
		}
	}
	return applied, nil
}

// nested is branches as one etcd op: the first branch's compares and
// writes, with the rest nested in its else.
func (c *etcdClient) nested(branches []Branch, lease clientv3.LeaseID) clientv3.Op {
	var els []clientv3.Op
	if len(branches) > 1 {
		els = []clientv3.Op{c.nested(branches[1:], lease)}
	}
	return clientv3.OpTxn(c.cmps(branches[0].If), c.ops(branches[0].Then, lease), els)
}

// branchApplied is the index of the branch a response applied, from
// branch i on: a failed compare's response holds its else, the next
// branch's transaction.
func branchApplied(succeeded bool, responses []*etcdserverpb.ResponseOp, i, n int) int {
	if succeeded {
		return i
	}
	if i+1 >= n || len(responses) != 1 || responses[0].GetResponseTxn() == nil {
		return -1
	}
	inner := responses[0].GetResponseTxn()
	return branchApplied(inner.Succeeded, inner.Responses, i+1, n)
}

func (c *etcdClient) cmps(conds []Cond) []clientv3.Cmp {
	cmps := make([]clientv3.Cmp, len(conds))
	for i, cond := range conds {
		k := c.prefix + cond.key
		switch cond.kind {
		case condAbsent:
			cmps[i] = clientv3.Compare(clientv3.CreateRevision(k), "=", 0)
		case condValue:
			cmps[i] = clientv3.Compare(clientv3.Value(k), "=", string(cond.value))
		case condValueNot:
			cmps[i] = clientv3.Compare(clientv3.Value(k), "!=", string(cond.value))
		case condModRevision:
			cmps[i] = clientv3.Compare(clientv3.ModRevision(k), "=", cond.rev)
		}
		if cond.prefix {
			// Over a range, a compare holds when it holds for every key in
			// it; for an empty range a creation revision of 0 holds and a
			// value never does.
			cmps[i] = cmps[i].WithPrefix()
		}
	}
	return cmps
}

func (c *etcdClient) ops(ops []Op, lease clientv3.LeaseID) []clientv3.Op {
	out := make([]clientv3.Op, len(ops))
	for i, op := range ops {
		switch {
		case op.delete:
			out[i] = clientv3.OpDelete(c.prefix + op.key)
		case op.leased:
			out[i] = clientv3.OpPut(c.prefix+op.key, string(op.value), clientv3.WithLease(lease))
		default:
			out[i] = clientv3.OpPut(c.prefix+op.key, string(op.value))
		}
	}
	return out
}

func (c *etcdClient) Lock(ctx context.Context, key string) (_ Unlocker, err error) {
	defer c.metrics.observe("lock", time.Now(), &err)
	if err := c.wait(ctx); err != nil {
		return nil, wrap("lock", key, err)
	}
	u, err := c.locks.lock(ctx, key, false)
	return u, wrap("lock", key, err)
}

func (c *etcdClient) TryLock(ctx context.Context, key string) (Unlocker, error) {
	if err := c.wait(ctx); err != nil {
		return nil, wrap("lock", key, err)
	}
	u, err := c.locks.lock(ctx, key, true)
	if errors.Is(err, ErrLocked) {
		return nil, fmt.Errorf("kvstore lock %s: %w", key, ErrLocked)
	}
	return u, wrap("lock", key, err)
}

// Watch: see Client. One goroutine per call: list, then watch from the
// listing's revision; any break in the watch (compaction, lost leader,
// closed stream) lists again and reports what changed meanwhile.
func (c *etcdClient) Watch(ctx context.Context, prefix string) <-chan Event {
	ch := make(chan Event, 128)
	go c.watch(ctx, prefix, ch)
	return ch
}

func (c *etcdClient) watch(ctx context.Context, prefix string, ch chan<- Event) {
	defer close(ch)
	send := func(ev Event) bool {
		select {
		case ch <- ev:
			return true
		case <-ctx.Done():
			return false
		}
	}
	known := &sentValues{seed: maphash.MakeSeed(), sums: map[string]uint64{}}
	retry := newBackoff()
	for ctx.Err() == nil {
		if err := c.wait(ctx); err != nil {
			return
		}
		before, replaced := c.seenNow()
		var kvs []*mvccpb.KeyValue
		header, err := c.listPages(ctx, c.prefix+prefix, func(page []*mvccpb.KeyValue) { kvs = append(kvs, page...) })
		if err != nil {
			if ctx.Err() == nil {
				c.log.Debug("kvstore watch: listing failed, retrying", "prefix", prefix, "error", err)
				retry.Sleep(ctx)
			}
			continue
		}
		c.observe(before, header)
		events := known.relist(c.prefix, kvs)
		kvs = nil
		for _, ev := range events {
			if !send(ev) {
				return
			}
		}
		retry.Reset()

		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		wch := c.cli.Watch(wctx, c.prefix+prefix, clientv3.WithPrefix(), clientv3.WithRev(header.Revision+1))
		reason := c.follow(prefix, wch, replaced, known, send)
		cancel()
		if reason == "" || ctx.Err() != nil {
			return
		}
		if c.metrics != nil {
			c.metrics.relists.WithLabelValues(reason).Inc()
		}
		if reason != relistReplaced {
			retry.Sleep(ctx)
		}
	}
}

// Why a watch lists again.
const (
	relistBroken    = "broken"
	relistCompacted = "compacted"
	relistReplaced  = "store-replaced"
)

// follow sends the events of wch, keeping known up to date, until the
// watch breaks or the store is found replaced (it says which), or send
// fails ("").
func (c *etcdClient) follow(prefix string, wch clientv3.WatchChan, replaced <-chan struct{}, known *sentValues, send func(Event) bool) string {
	for {
		var wr clientv3.WatchResponse
		var ok bool
		select {
		case wr, ok = <-wch:
		case <-replaced:
			return relistReplaced
		}
		if !ok {
			return relistBroken
		}
		if err := wr.Err(); err != nil {
			if wr.CompactRevision != 0 {
				c.log.Warn("kvstore watch fell behind a compaction; listing again", "prefix", prefix, "error", err)
				return relistCompacted
			}
			c.log.Debug("kvstore watch broken, listing again", "prefix", prefix, "error", err)
			return relistBroken
		}
		for _, ev := range wr.Events {
			key := strings.TrimPrefix(string(ev.Kv.Key), c.prefix)
			e := Event{Kind: EventUpsert, Key: key, Value: ev.Kv.Value, CreateRevision: ev.Kv.CreateRevision}
			if ev.Type == clientv3.EventTypeDelete {
				e = Event{Kind: EventDelete, Key: key}
				delete(known.sums, key)
			} else {
				known.sums[key] = known.sum(ev.Kv.Value)
			}
			if !send(e) {
				return ""
			}
		}
	}
}

// sentValues is what a watch has sent its consumer: each key present and
// a 64-bit fingerprint of its value (seeded anew for each watch), not the
// value itself: the consumer holds the one copy of each value it keeps.
type sentValues struct {
	seed maphash.Seed
	sums map[string]uint64
}

func (s *sentValues) sum(value []byte) uint64 { return maphash.Bytes(s.seed, value) }

// relist compares a new listing with what the watch had sent: the events
// that bring its consumer up to date (changed or new keys, then deleted
// ones, then EventListed), and it records the new state. Keys sent before
// with the same value are not sent again.
func (s *sentValues) relist(prefix string, kvs []*mvccpb.KeyValue) []Event {
	listed := make(map[string]uint64, len(kvs))
	var events []Event
	for _, kv := range kvs {
		key := strings.TrimPrefix(string(kv.Key), prefix)
		sum := s.sum(kv.Value)
		listed[key] = sum
		if old, ok := s.sums[key]; ok && old == sum {
			continue
		}
		events = append(events, Event{Kind: EventUpsert, Key: key, Value: kv.Value, CreateRevision: kv.CreateRevision})
	}
	for _, key := range slices.Sorted(maps.Keys(s.sums)) {
		if _, ok := listed[key]; !ok {
			events = append(events, Event{Kind: EventDelete, Key: key})
		}
	}
	s.sums = listed
	return append(events, Event{Kind: EventListed})
}

func writeOpts(opts []WriteOption) writeOptions {
	var o writeOptions
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// Bounds of the waits between retries.
const (
	backoffMin = 100 * time.Millisecond
	backoffMax = 10 * time.Second
)

// newBackoff is the wait between retries of a watch's listing and of the
// lost leases' writes: from 100ms doubling to 10s, each wait drawn at
// random between half its step and the whole (a Jittered of half the
// bounds), so that agents that lost etcd together (an outage, a leader
// election) come back to list and rewrite at different instants.
func newBackoff() *backoff.Jittered {
	return &backoff.Jittered{Min: backoffMin / 2, Max: backoffMax / 2}
}
