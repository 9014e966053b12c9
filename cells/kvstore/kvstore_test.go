package kvstore

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cellium/cellium/cells/health"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/pkg/etcdtest"
	"github.com/cellium/cellium/pkg/polltest"
)

// startClient runs the kvstore cell against endpoint under a prefix of its
// own and returns its Client.
func startClient(t *testing.T, endpoint, prefix string, tweak func(*etcdClient)) *etcdClient {
	t.Helper()
	var c Client
	h := celltest.New(Cell, cell.Invoke(func(cl Client) {
		c = cl
		if tweak != nil {
			tweak(cl.(*etcdClient))
		}
	}))
	hive.AddConfigOverride(h, func(cfg *Config) {
		cfg.KVStore = "etcd"
		cfg.KVStoreOpt = []string{"etcd.address=" + endpoint}
		cfg.KVStorePrefix = prefix
		cfg.KVStoreLeaseTTL = 5 * time.Second
	})
	celltest.Start(t, h)
	return c.(*etcdClient)
}

// rawClient is a plain etcd client: "another agent", or an operator.
func rawClient(t *testing.T, endpoint string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// watchState keeps state from the events of ch as a watch's consumer
// would; next applies the next event to state and returns it.
func watchState(t *testing.T, ctx context.Context, ch <-chan Event) (state map[string]string, next func() Event) {
	state = map[string]string{}
	next = func() Event {
		t.Helper()
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatal("watch channel closed")
			}
			switch ev.Kind {
			case EventUpsert:
				state[ev.Key] = string(ev.Value)
			case EventDelete:
				delete(state, ev.Key)
			}
			return ev
		case <-ctx.Done():
			t.Fatalf("no event; the consumer has %v", state)
		}
		return Event{}
	}
	return state, next
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestOperations(t *testing.T) {
	etcd := etcdtest.Start(t)
	c := startClient(t, etcd.Endpoint(), "t1", nil)
	ctx := ctxT(t)

	created, err := c.CreateOnly(ctx, "state/a", []byte("1"))
	if err != nil || !created {
		t.Fatalf("CreateOnly new key = %v, %v", created, err)
	}
	if created, err := c.CreateOnly(ctx, "state/a", []byte("2")); err != nil || created {
		t.Fatalf("CreateOnly existing key = %v, %v; want false, nil", created, err)
	}
	if v, found, err := c.Get(ctx, "state/a"); err != nil || !found || string(v) != "1" {
		t.Fatalf("Get = %q, %v, %v; want 1", v, found, err)
	}
	if _, found, err := c.Get(ctx, "state/none"); err != nil || found {
		t.Fatalf("Get of a missing key = found %v, %v", found, err)
	}
	if changed, err := c.UpdateIfDifferent(ctx, "state/a", []byte("1")); err != nil || changed {
		t.Fatalf("UpdateIfDifferent with the same value = %v, %v; want no write", changed, err)
	}
	if changed, err := c.UpdateIfDifferent(ctx, "state/a", []byte("3")); err != nil || !changed {
		t.Fatalf("UpdateIfDifferent with a new value = %v, %v", changed, err)
	}
	kvs, err := c.List(ctx, "state/")
	if err != nil || len(kvs) != 1 || kvs[0].Key != "state/a" || string(kvs[0].Value) != "3" {
		t.Fatalf("List = %+v, %v", kvs, err)
	}
	// The key is stored under the prefix.
	raw, err := rawClient(t, etcd.Endpoint()).Get(ctx, "t1/state/a")
	if err != nil || len(raw.Kvs) != 1 {
		t.Fatalf("raw get t1/state/a = %v, %v", raw, err)
	}
	delIfRev := func(rev int64) Branch {
		return Branch{If: []Cond{ModRevisionIs("state/a", rev)}, Then: []Op{Del("state/a")}}
	}
	if i, err := c.Txn(ctx, delIfRev(kvs[0].ModRevision-1)); err != nil || i != -1 {
		t.Fatalf("Txn delete with a stale revision = %v, %v", i, err)
	}
	if i, err := c.Txn(ctx, delIfRev(kvs[0].ModRevision)); err != nil || i != 0 {
		t.Fatalf("Txn delete at the key's revision = %v, %v", i, err)
	}
	if err := c.Delete(ctx, "state/a"); err != nil {
		t.Fatalf("Delete of a missing key: %v", err)
	}
	var got strings.Builder
	for _, op := range []string{"get", "list", "create", "update", "txn", "delete"} {
		var m dto.Metric
		if err := c.metrics.duration.WithLabelValues(op, "ok").(prometheus.Metric).Write(&m); err != nil || m.GetHistogram().GetSampleCount() == 0 {
			fmt.Fprintf(&got, "%s: %v; ", op, err)
		}
	}
	if got.Len() > 0 {
		t.Fatalf("operation latency not recorded: %s", got.String())
	}
}

// TestTxn: a transaction applies the writes of its first branch whose
// conditions hold, all of them or none, on conditions over single keys and
// over every key under a prefix; its leased write lives on the agent's
// leases like any other.
func TestTxn(t *testing.T) {
	etcd := etcdtest.Start(t)
	c := startClient(t, etcd.Endpoint(), "tx", nil)
	ctx := ctxT(t)
	// The identity allocator's two transactions: create a number with the
	// first value key of a set, or join the number every value key names.
	create := func(n, node string) (int, error) {
		return c.Txn(ctx, Branch{
			If:   []Cond{Absent("state/id/" + n), NoneUnder("state/value/web/")},
			Then: []Op{Put("state/id/"+n, []byte("web")), Put("state/value/web/"+node, []byte(n), Leased())},
		})
	}
	join := func(n, node string) (int, error) {
		put := []Op{Put("state/value/web/"+node, []byte(n), Leased())}
		return c.Txn(ctx,
			Branch{If: []Cond{ValueIs("state/id/"+n, []byte("web")), NoneUnder("state/value/web/")}, Then: put},
			Branch{If: []Cond{ValueIs("state/id/"+n, []byte("web")), EveryValueUnder("state/value/web/", []byte(n))}, Then: put})
	}
	if i, err := create("300", "a"); err != nil || i != 0 {
		t.Fatalf("Txn on an empty prefix = %v, %v", i, err)
	}
	// The prefix now holds a key: a second creation, even of another
	// number, writes nothing.
	if i, err := create("301", "b"); err != nil || i != -1 {
		t.Fatalf("Txn with a key under the prefix = %v, %v; want not applied", i, err)
	}
	if _, found, _ := c.Get(ctx, "state/id/301"); found {
		t.Fatal("a transaction that was not applied wrote one of its keys")
	}
	kvs, err := c.List(ctx, "state/value/web/")
	if err != nil || len(kvs) != 1 || kvs[0].Lease == 0 || string(kvs[0].Value) != "300" {
		t.Fatalf("leased write of the transaction: %+v, %v", kvs, err)
	}
	// Joining: the second branch applies (there is a value key, naming
	// the same number); a number no value key names is refused.
	if i, err := join("300", "b"); err != nil || i != 1 {
		t.Fatalf("join 300 = %v, %v; want the second branch", i, err)
	}
	if _, err := c.UpdateIfDifferent(ctx, "state/id/302", []byte("web")); err != nil {
		t.Fatal(err)
	}
	if i, err := join("302", "c"); err != nil || i != -1 {
		t.Fatalf("join a number the value keys do not name = %v, %v", i, err)
	}
	if st := c.Status(); st.LeasedKeys != 2 {
		t.Fatalf("leased keys %d, want 2", st.LeasedKeys)
	}
	// With no value key left, the first branch applies.
	for _, k := range []string{"state/value/web/a", "state/value/web/b"} {
		if err := c.Delete(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	if i, err := join("302", "c"); err != nil || i != 0 {
		t.Fatalf("join with no value key = %v, %v; want the first branch", i, err)
	}
	two := Branch{Then: []Op{Put("state/x", nil, Leased()), Put("state/y", nil, Leased())}}
	if _, err := c.Txn(ctx, two); err == nil || !strings.Contains(err.Error(), "leased writes of two keys") {
		t.Fatalf("leased writes of two keys in one Txn: %v", err)
	}
}

func TestLeasedKeysSpreadOverLeases(t *testing.T) {
	etcd := etcdtest.Start(t)
	c := startClient(t, etcd.Endpoint(), "t2", func(c *etcdClient) { c.leases.maxKeys = 3 })
	ctx := ctxT(t)
	for i := range 7 {
		if _, err := c.UpdateIfDifferent(ctx, fmt.Sprintf("state/k%d", i), []byte("v"), Leased()); err != nil {
			t.Fatal(err)
		}
	}
	kvs, err := c.List(ctx, "state/")
	if err != nil {
		t.Fatal(err)
	}
	perLease := map[int64]int{}
	for _, kv := range kvs {
		if kv.Lease == 0 {
			t.Fatalf("key %s has no lease", kv.Key)
		}
		perLease[kv.Lease]++
	}
	if len(perLease) != 3 {
		t.Fatalf("7 keys at 3 per lease on %d leases, want 3: %v", len(perLease), perLease)
	}
	for l, n := range perLease {
		if n > 3 {
			t.Fatalf("lease %x holds %d keys, more than 3", l, n)
		}
	}
	if st := c.Status(); st.Leases != 3 || st.LeasedKeys != 7 {
		t.Fatalf("Status leases=%d keys=%d, want 3 and 7", st.Leases, st.LeasedKeys)
	}
	// Rewriting a key keeps it on its lease.
	before := kvs[0]
	if _, err := c.UpdateIfDifferent(ctx, before.Key, []byte("w"), Leased()); err != nil {
		t.Fatal(err)
	}
	kvs, _ = c.List(ctx, before.Key)
	if kvs[0].Lease != before.Lease {
		t.Fatalf("rewritten key moved from lease %x to %x", before.Lease, kvs[0].Lease)
	}
}

// TestConcurrentFirstWritesShareALease: the first leased writes after a
// start, made all at once (as the cells write their keys after a crash
// restart), go on one lease, not one lease each.
func TestConcurrentFirstWritesShareALease(t *testing.T) {
	etcd := etcdtest.Start(t)
	c := startClient(t, etcd.Endpoint(), "t9", nil)
	ctx := ctxT(t)
	var wg sync.WaitGroup
	for i := range 66 {
		wg.Go(func() {
			if _, err := c.UpdateIfDifferent(ctx, fmt.Sprintf("state/ip/v1/10.0.0.%d", i), []byte("v"), Leased()); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	resp, err := rawClient(t, etcd.Endpoint()).Leases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Leases) != 1 {
		t.Fatalf("66 concurrent first writes opened %d leases in etcd, want 1", len(resp.Leases))
	}
	if st := c.Status(); st.Leases != 1 || st.LeasedKeys != 66 {
		t.Fatalf("Status leases=%d keys=%d, want 1 and 66", st.Leases, st.LeasedKeys)
	}
}

func TestLostLeaseWritesKeysAgain(t *testing.T) {
	etcd := etcdtest.Start(t)
	c := startClient(t, etcd.Endpoint(), "t3", nil)
	ctx := ctxT(t)
	for _, k := range []string{"state/ip/v1/10.0.0.1", "state/ip/v1/10.0.0.2"} {
		if _, err := c.UpdateIfDifferent(ctx, k, []byte(k), Leased()); err != nil {
			t.Fatal(err)
		}
	}
	// A key deleted by its owner must not come back.
	if err := c.Delete(ctx, "state/ip/v1/10.0.0.2"); err != nil {
		t.Fatal(err)
	}
	kvs, _ := c.List(ctx, "state/ip/v1/")
	raw := rawClient(t, etcd.Endpoint())
	if _, err := raw.Revoke(ctx, clientv3.LeaseID(kvs[0].Lease)); err != nil {
		t.Fatalf("revoke: %v", err)
	}
	celltest.Eventually(t, "the key of the revoked lease written again", func() (bool, string) {
		kvs, err := c.List(ctx, "state/ip/v1/")
		return err == nil && len(kvs) == 1 && kvs[0].Lease != 0 && string(kvs[0].Value) == "state/ip/v1/10.0.0.1", fmt.Sprintf("%+v %v", kvs, err)
	})
	kvs2, _ := c.List(ctx, "state/ip/v1/")
	if kvs2[0].Lease == kvs[0].Lease {
		t.Fatalf("key still on the revoked lease %x", kvs[0].Lease)
	}
	if _, found, _ := c.Get(ctx, "state/ip/v1/10.0.0.2"); found {
		t.Fatal("a deleted key came back with its lease's rewrite")
	}
	if n := testutil.ToFloat64(c.metrics.leasesLost); n != 1 {
		t.Fatalf("lease renewals failed = %v, want 1", n)
	}
}

// TestWatchListsThenFollows: a watch lists, then follows changes, across
// an etcd restart (the relist is TestWatchRelistsAfterACompaction's).
func TestWatchListsThenFollows(t *testing.T) {
	etcd := etcdtest.Start(t)
	c := startClient(t, etcd.Endpoint(), "t4", nil)
	ctx := ctxT(t)
	raw := rawClient(t, etcd.Endpoint())
	put := func(k, v string) {
		t.Helper()
		if _, err := raw.Put(ctx, "t4/"+k, v); err != nil {
			t.Fatal(err)
		}
	}
	put("state/w/a", "1")
	put("state/w/b", "1")
	put("state/other", "x")
	ch := c.Watch(ctx, "state/w/")
	next := func() Event {
		t.Helper()
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatal("watch channel closed")
			}
			return ev
		case <-ctx.Done():
			t.Fatal("no event")
		}
		return Event{}
	}
	got := []string{}
	for {
		ev := next()
		if ev.Kind == EventListed {
			break
		}
		got = append(got, ev.Kind.String()+" "+ev.Key+"="+string(ev.Value))
	}
	if strings.Join(got, ",") != "upsert state/w/a=1,upsert state/w/b=1" {
		t.Fatalf("listing = %v", got)
	}
	put("state/w/a", "2")
	if ev := next(); ev.Kind != EventUpsert || ev.Key != "state/w/a" || string(ev.Value) != "2" {
		t.Fatalf("after a put: %+v", ev)
	}

	// etcd goes away and comes back: the watch goes on, nothing is lost.
	etcd.Stop()
	etcd.Restart()
	if _, err := raw.Delete(ctx, "t4/state/w/b"); err != nil {
		t.Fatal(err)
	}
	put("state/w/c", "1")
	state := map[string]string{"state/w/a": "2", "state/w/b": "1"}
	for len(state) != 2 || state["state/w/c"] != "1" {
		ev := next()
		switch ev.Kind {
		case EventUpsert:
			state[ev.Key] = string(ev.Value)
		case EventDelete:
			delete(state, ev.Key)
		}
	}
	if _, ok := state["state/w/b"]; ok {
		t.Fatalf("deleted key still there: %v", state)
	}
}

// TestWatchRelistsAfterACompaction: a watch cut off from etcd while keys
// change and the store is compacted cannot resume where it was; it lists
// again, and sends the changes it missed (a delete for the key that went)
// and a second EventListed, which only a listing sends.
func TestWatchRelistsAfterACompaction(t *testing.T) {
	etcd := etcdtest.Start(t)
	cut := newCutProxy(t, strings.TrimPrefix(etcd.Endpoint(), "http://"))
	c := startClient(t, "http://"+cut.addr(), "t11", nil)
	ctx := ctxT(t)
	raw := rawClient(t, etcd.Endpoint())
	put := func(k, v string) {
		t.Helper()
		if _, err := raw.Put(ctx, "t11/"+k, v); err != nil {
			t.Fatal(err)
		}
	}
	put("state/w/a", "1")
	put("state/w/b", "1")
	state, next := watchState(t, ctx, c.Watch(ctx, "state/w/"))
	for next().Kind != EventListed {
	}
	put("state/w/a", "2")
	if ev := next(); ev.Kind != EventUpsert || ev.Key != "state/w/a" {
		t.Fatalf("after a put: %+v", ev)
	}

	cut.set(true)
	if _, err := raw.Delete(ctx, "t11/state/w/b"); err != nil {
		t.Fatal(err)
	}
	put("state/w/c", "1")
	put("state/w/a", "3")
	resp, err := raw.Get(ctx, "t11/")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Compact(ctx, resp.Header.Revision); err != nil {
		t.Fatal(err)
	}
	cut.set(false)
	for next().Kind != EventListed {
	}
	if len(state) != 2 || state["state/w/a"] != "3" || state["state/w/c"] != "1" {
		t.Fatalf("after the relist the consumer has %v, want a=3 c=1", state)
	}
	if n := testutil.ToFloat64(c.metrics.relists.WithLabelValues(relistCompacted)); n != 1 {
		t.Fatalf("relists after a compaction %v, want 1", n)
	}
}

// cutProxy forwards TCP connections to an address until it is cut: then
// it closes them and every new one, as a network partition would. Moved
// to another address, it closes them and forwards the next ones there.
type cutProxy struct {
	ln net.Listener
	mu sync.Mutex
	to string
	on bool // cut
	cs map[net.Conn]struct{}
}

func newCutProxy(t *testing.T, to string) *cutProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, to: to, cs: map[net.Conn]struct{}{}}
	t.Cleanup(func() { ln.Close(); p.set(true) })
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			to := p.to
			p.mu.Unlock()
			out, err := net.Dial("tcp", to)
			if err != nil {
				in.Close()
				continue
			}
			p.mu.Lock()
			if p.on {
				in.Close()
				out.Close()
				p.mu.Unlock()
				continue
			}
			p.cs[in], p.cs[out] = struct{}{}, struct{}{}
			p.mu.Unlock()
			go func() { io.Copy(out, in); out.Close() }()
			go func() { io.Copy(in, out); in.Close() }()
		}
	}()
	return p
}

func (p *cutProxy) addr() string { return p.ln.Addr().String() }

func (p *cutProxy) set(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.on = cut
	if cut {
		p.closeAll()
	}
}

// moveTo forwards the next connections to addr, and closes the current
// ones.
func (p *cutProxy) moveTo(addr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.to = addr
	p.closeAll()
}

func (p *cutProxy) closeAll() {
	for conn := range p.cs {
		conn.Close()
	}
	clear(p.cs)
}

// TestStoreReplaced: etcd is replaced by an empty one on the same
// endpoint (a member rebuilt, a restore). The client finds out from the
// revision going back, and its watches, which would wait at their old
// revision for events the new store has not reached, list again: the
// consumer gets a delete for every key that is gone and an upsert for
// every key there now, and the changes after that. The agent's leased
// keys are written again in the new store on a lease it has.
func TestStoreReplaced(t *testing.T) {
	etcd := etcdtest.Start(t)
	c := startClient(t, etcd.Endpoint(), "t10", func(c *etcdClient) {
		c.statusBase, c.statusTimeout = 50*time.Millisecond, 500*time.Millisecond
		c.leases.ttl = time.Minute // renewed every 20 s: the rewrite is not the keep-alive's
	})
	ctx := ctxT(t)
	raw := rawClient(t, etcd.Endpoint())
	for i := range 20 { // revisions the new store will not have reached
		if _, err := raw.Put(ctx, "t10/state/w/a", strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := raw.Put(ctx, "t10/state/w/b", "1"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.UpdateIfDifferent(ctx, "state/ip/v1/10.0.0.1", []byte("mine"), Leased()); err != nil {
		t.Fatal(err)
	}
	state, next := watchState(t, ctx, c.Watch(ctx, "state/w/"))
	for next().Kind != EventListed {
	}
	celltest.Eventually(t, "connected", func() (bool, string) { st := c.Status(); return st.State == StateConnected, fmt.Sprintf("%+v", st) })

	etcd.Wipe()
	etcd.Restart()
	if _, err := raw.Put(ctx, "t10/state/w/c", "new"); err != nil {
		t.Fatal(err)
	}
	for len(state) != 1 || state["state/w/c"] != "new" {
		next()
	}
	// Changes go on flowing.
	if _, err := raw.Put(ctx, "t10/state/w/d", "1"); err != nil {
		t.Fatal(err)
	}
	for state["state/w/d"] != "1" {
		next()
	}
	celltest.Eventually(t, "the leased key written again in the new store", func() (bool, string) {
		resp, err := raw.Get(ctx, "t10/state/ip/v1/10.0.0.1")
		if err != nil {
			return false, err.Error()
		}
		if len(resp.Kvs) != 1 || resp.Kvs[0].Lease == 0 {
			return false, fmt.Sprintf("%+v", resp.Kvs)
		}
		ttl, err := raw.TimeToLive(ctx, clientv3.LeaseID(resp.Kvs[0].Lease))
		if err != nil {
			return false, err.Error()
		}
		return ttl.TTL > 0, fmt.Sprintf("lease %x TTL %d", resp.Kvs[0].Lease, ttl.TTL)
	})
	if n := testutil.ToFloat64(c.metrics.storeReplaced); n != 1 {
		t.Fatalf("store replacements counted %v, want 1", n)
	}
	if n := testutil.ToFloat64(c.metrics.relists.WithLabelValues(relistReplaced)); n != 1 {
		t.Fatalf("relists for a replaced store %v, want 1", n)
	}
	if st := c.Status(); st.State != StateConnected || !strings.Contains(st.LastError, "etcd was replaced: its revision went back") {
		t.Fatalf("status after the replacement %+v", st)
	}
}

// TestStoreReplacedAhead: etcd is replaced by another cluster whose
// revisions are ahead of the ones the client read (a restore followed by
// writes, a member rebuilt while others wrote): no revision goes back, but
// the cluster ID changes. The client tells it by that: its watches, which
// would resume at their old revision and miss what the new store had
// before it, list again, and its leased keys are written in the new store.
func TestStoreReplacedAhead(t *testing.T) {
	old, replacement := etcdtest.Start(t), etcdtest.Start(t)
	ctx := ctxT(t)
	// The new store has state/w/c from the start, then revisions past
	// those the old one will have reached.
	rawNew := rawClient(t, replacement.Endpoint())
	if _, err := rawNew.Put(ctx, "t11/state/w/c", "new"); err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		if _, err := rawNew.Put(ctx, "t11/other", strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	rawOld := rawClient(t, old.Endpoint())
	for _, k := range []string{"a", "b"} {
		if _, err := rawOld.Put(ctx, "t11/state/w/"+k, "old"); err != nil {
			t.Fatal(err)
		}
	}
	proxy := newCutProxy(t, strings.TrimPrefix(old.Endpoint(), "http://"))
	c := startClient(t, "http://"+proxy.addr(), "t11", func(c *etcdClient) {
		c.statusBase, c.statusTimeout = 50*time.Millisecond, 500*time.Millisecond
		c.leases.ttl = time.Minute
	})
	if _, err := c.UpdateIfDifferent(ctx, "state/ip/v1/10.0.0.1", []byte("mine"), Leased()); err != nil {
		t.Fatal(err)
	}
	state, next := watchState(t, ctx, c.Watch(ctx, "state/w/"))
	for next().Kind != EventListed {
	}
	celltest.Eventually(t, "connected", func() (bool, string) { st := c.Status(); return st.State == StateConnected, fmt.Sprintf("%+v", st) })
	seen, _ := c.seenNow()
	resp, err := rawNew.Get(ctx, "t11/other")
	if err != nil {
		t.Fatal(err)
	}
	if oldRev, newRev := seen.rev, resp.Header.Revision; newRev <= oldRev {
		t.Fatalf("the new store's revision %d is not ahead of the old one's %d", newRev, oldRev)
	}

	proxy.moveTo(strings.TrimPrefix(replacement.Endpoint(), "http://"))
	for len(state) != 1 || state["state/w/c"] != "new" {
		next()
	}
	if _, err := rawNew.Put(ctx, "t11/state/w/d", "1"); err != nil {
		t.Fatal(err)
	}
	for state["state/w/d"] != "1" {
		next()
	}
	celltest.Eventually(t, "the leased key written in the new store", func() (bool, string) {
		resp, err := rawNew.Get(ctx, "t11/state/ip/v1/10.0.0.1")
		if err != nil {
			return false, err.Error()
		}
		return len(resp.Kvs) == 1 && resp.Kvs[0].Lease != 0, fmt.Sprintf("%+v", resp.Kvs)
	})
	if n := testutil.ToFloat64(c.metrics.storeReplaced); n != 1 {
		t.Fatalf("store replacements counted %v, want 1", n)
	}
	if st := c.Status(); !strings.Contains(st.LastError, "etcd was replaced: its cluster ID changed") {
		t.Fatalf("status after the replacement %+v", st)
	}
}

// TestRelist: a listing after a broken watch sends what changed, and a
// delete for what went, then listed.
func TestRelist(t *testing.T) {
	known := &sentValues{seed: maphash.MakeSeed(), sums: map[string]uint64{}}
	known.relist("p/", []*mvccpb.KeyValue{
		{Key: []byte("p/k/a"), Value: []byte("1")},
		{Key: []byte("p/k/b"), Value: []byte("1")},
		{Key: []byte("p/k/d"), Value: []byte("1")},
	})
	kvs := []*mvccpb.KeyValue{
		{Key: []byte("p/k/a"), Value: []byte("1")},
		{Key: []byte("p/k/b"), Value: []byte("2")},
		{Key: []byte("p/k/c"), Value: []byte("1")},
	}
	events := known.relist("p/", kvs)
	var got []string
	for _, ev := range events {
		got = append(got, ev.Kind.String()+" "+ev.Key+"="+string(ev.Value))
	}
	want := "upsert k/b=2,upsert k/c=1,delete k/d=,listed ="
	if strings.Join(got, ",") != want {
		t.Fatalf("events %v, want %s", got, want)
	}
	if len(known.sums) != 3 || known.sums["k/b"] != known.sum([]byte("2")) {
		t.Fatalf("state after relisting %v", known.sums)
	}
}

func TestLocks(t *testing.T) {
	etcd := etcdtest.Start(t)
	a := startClient(t, etcd.Endpoint(), "t5", nil)
	b := startClient(t, etcd.Endpoint(), "t5", func(c *etcdClient) { c.locks.ttl = 2 * time.Second })
	ctx := ctxT(t)

	// Mutual exclusion between two agents.
	var inside, max atomic.Int32
	var wg sync.WaitGroup
	for i := range 8 {
		c := a
		if i%2 == 1 {
			c = b
		}
		wg.Go(func() {
			u, err := c.Lock(ctx, "state/locks/x")
			if err != nil {
				t.Error(err)
				return
			}
			n := inside.Add(1)
			if n > max.Load() {
				max.Store(n)
			}
			inside.Add(-1)
			if err := u.Unlock(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if max.Load() != 1 {
		t.Fatalf("%d holders at once", max.Load())
	}
	// Once nobody holds or waits, the process's entry for the lock goes.
	if n := a.locks.local.Users("state/locks/x"); n != 0 {
		t.Fatalf("%d holders or waiters of state/locks/x left after every unlock", n)
	}

	// TryLock sees a held lock.
	u, err := a.TryLock(ctx, "state/locks/y")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.TryLock(ctx, "state/locks/y"); !errors.Is(err, ErrLocked) {
		t.Fatalf("TryLock of a held lock = %v, want ErrLocked", err)
	}
	if _, err := a.TryLock(ctx, "state/locks/y"); !errors.Is(err, ErrLocked) {
		t.Fatalf("TryLock of a lock this process holds = %v, want ErrLocked", err)
	}
	u.Unlock(ctx)

	// A dead holder's lock expires with its session: b takes a lock and
	// its session is orphaned without unlocking, as a killed agent's.
	if _, err := b.Lock(ctx, "state/locks/z"); err != nil {
		t.Fatal(err)
	}
	b.locks.mu.Lock()
	b.locks.sess.Orphan()
	b.locks.mu.Unlock()
	lctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if _, err := a.Lock(lctx, "state/locks/z"); err != nil {
		t.Fatalf("the dead holder's lock did not expire: %v", err)
	}
}

// TestLocksGCReleasesStaleLocks: a lock held past the stale timeout is
// released in etcd, so another agent takes it (the holder's own session
// would be let in again by etcd's mutex anyway).
func TestLocksGCReleasesStaleLocks(t *testing.T) {
	etcd := etcdtest.Start(t)
	a := startClient(t, etcd.Endpoint(), "t6", func(c *etcdClient) { c.locks.stale = 0 })
	b := startClient(t, etcd.Endpoint(), "t6", nil)
	ctx := ctxT(t)
	if _, err := a.Lock(ctx, "state/locks/stuck"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.TryLock(ctx, "state/locks/stuck"); !errors.Is(err, ErrLocked) {
		t.Fatalf("another agent's TryLock of the held lock = %v, want ErrLocked", err)
	}
	if err := a.locks.gc(ctx); err != nil {
		t.Fatal(err)
	}
	if n := a.locks.count(); n != 0 {
		t.Fatalf("%d locks still held after GC", n)
	}
	if n := testutil.ToFloat64(a.metrics.locksReleased); n != 1 {
		t.Fatalf("stale locks released %v, want 1", n)
	}
	if _, err := b.TryLock(ctx, "state/locks/stuck"); err != nil {
		t.Fatalf("another agent cannot take the lock after GC: %v", err)
	}
}

func TestOutage(t *testing.T) {
	etcd := etcdtest.Start(t)
	c := startClient(t, etcd.Endpoint(), "t7", func(c *etcdClient) {
		c.statusBase, c.statusTimeout = 50*time.Millisecond, 500*time.Millisecond
	})
	celltest.Eventually(t, "connected", func() (bool, string) { st := c.Status(); return st.State == StateConnected, fmt.Sprintf("%+v", st) })
	etcd.Stop()
	celltest.Eventually(t, "not connected", func() (bool, string) { st := c.Status(); return st.State != StateConnected, fmt.Sprintf("%+v", st) })
	if c.Status().LastError == "" {
		t.Fatal("no last error while etcd is down")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, _, err := c.Get(ctx, "state/x")
	cancel()
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Get while etcd is down = %v, want ErrUnavailable", err)
	}
	etcd.Restart()
	celltest.Eventually(t, "connected again", func() (bool, string) { st := c.Status(); return st.State == StateConnected, fmt.Sprintf("%+v", st) })
	if _, err := c.UpdateIfDifferent(ctxT(t), "state/x", []byte("1")); err != nil {
		t.Fatalf("write after etcd returned: %v", err)
	}
}

// TestReconnectsSoonAfterEtcdReturns: after an outage long enough for
// gRPC's default backoff to wait many seconds between dials, the client
// is back within 1.5 s of etcd answering again (gRPC's default backoff
// would dial next 2 to 8 s later).
func TestReconnectsSoonAfterEtcdReturns(t *testing.T) {
	etcd := etcdtest.Start(t)
	c := startClient(t, etcd.Endpoint(), "t8", func(c *etcdClient) {
		c.statusBase, c.statusTimeout = 50*time.Millisecond, 500*time.Millisecond
	})
	if _, err := c.UpdateIfDifferent(ctxT(t), "state/x", []byte("1")); err != nil {
		t.Fatal(err)
	}
	etcd.Stop()
	celltest.Eventually(t, "not connected", func() (bool, string) { st := c.Status(); return st.State != StateConnected, fmt.Sprintf("%+v", st) })
	// Calls keep the client dialling, as the agent's jobs do.
	outage := time.Now().Add(12 * time.Second)
	for time.Now().Before(outage) {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		c.Get(ctx, "state/x")
		cancel()
	}
	start := time.Now()
	etcd.Restart()
	back := time.Now()
	polltest.Until(t, "a read through the client", 30*time.Second, 10*time.Millisecond, func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		_, _, err := c.Get(ctx, "state/x")
		return err == nil, fmt.Sprint(err)
	})
	took := time.Since(back)
	t.Logf("after a 12s outage: etcd answered %.2fs after its start, the client %.2fs after that", back.Sub(start).Seconds(), took.Seconds())
	if took > 1500*time.Millisecond {
		t.Fatalf("reconnecting took %s after etcd returned, want at most 1.5s", took)
	}
}

func TestConfigErrors(t *testing.T) {
	dir := t.TempDir()
	badYAML := filepath.Join(dir, "bad.yaml")
	os.WriteFile(badYAML, []byte("endpoints: [\n"), 0o600)
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{KVStore: "consul", KVStorePrefix: "c", KVStoreLeaseTTL: time.Minute}, `invalid --kvstore "consul"`},
		{Config{KVStore: "etcd", KVStorePrefix: "c", KVStoreLeaseTTL: time.Minute}, "needs --kvstore-opt etcd.address"},
		{Config{KVStore: "etcd", KVStoreOpt: []string{"etcd.address"}, KVStorePrefix: "c", KVStoreLeaseTTL: time.Minute}, `invalid --kvstore-opt "etcd.address"`},
		{Config{KVStore: "etcd", KVStoreOpt: []string{"etcd.address=127.0.0.1:2379"}, KVStorePrefix: "c", KVStoreLeaseTTL: time.Minute}, "not an http:// or https:// URL"},
		{Config{KVStore: "etcd", KVStoreOpt: []string{"etcd.qps=-1", "etcd.address=http://a"}, KVStorePrefix: "c", KVStoreLeaseTTL: time.Minute}, "etcd.qps=-1"},
		{Config{KVStore: "etcd", KVStoreOpt: []string{"etcd.bogus=1"}, KVStorePrefix: "c", KVStoreLeaseTTL: time.Minute}, `unknown --kvstore-opt "etcd.bogus"`},
		{Config{KVStore: "etcd", KVStoreOpt: []string{"etcd.address=http://a"}, KVStorePrefix: "/c/", KVStoreLeaseTTL: time.Minute}, "invalid --kvstore-prefix"},
		{Config{KVStore: "etcd", KVStoreOpt: []string{"etcd.address=http://a"}, KVStorePrefix: "c", KVStoreLeaseTTL: time.Second}, "invalid --kvstore-lease-ttl"},
		{Config{KVStoreOpt: []string{"etcd.address=http://a"}}, "without --kvstore"},
	} {
		if _, err := tc.cfg.parse(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want it to say %q", tc.cfg, err, tc.want)
		}
	}
	if _, err := readConfigFile(badYAML); err == nil || !strings.Contains(err.Error(), badYAML) {
		t.Errorf("bad etcd.config: %v, want an error naming the file", err)
	}
	if _, err := readConfigFile(filepath.Join(dir, "missing.yaml")); err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Errorf("missing etcd.config: %v", err)
	}
}

func TestDisabled(t *testing.T) {
	var c Client
	h := celltest.New(Cell, cell.Invoke(func(cl Client) { c = cl }))
	celltest.Start(t, h)
	if c.Enabled() || c.Status().State != StateDisabled {
		t.Fatalf("default client enabled: %+v", c.Status())
	}
	if _, _, err := c.Get(context.Background(), "x"); !errors.Is(err, ErrDisabled) {
		t.Fatalf("Get = %v, want ErrDisabled", err)
	}
	if _, ok := <-c.Watch(context.Background(), "x"); ok {
		t.Fatal("Watch of a disabled store sent an event")
	}
}

// TestTLS: with an etcd.config file the client talks TLS with a client
// certificate, and reads the CA and its certificate again when their files
// change: after both sides rotate to a new CA, it reconnects without a
// restart.
func TestTLS(t *testing.T) {
	serverDir, clientDir := t.TempDir(), t.TempDir()
	serverFiles := etcdtest.NewCA(t, "ca-1").Issue(serverDir, "server")
	clientCA := etcdtest.NewCA(t, "ca-1")
	// The server trusts the client's CA too: one CA file holds both.
	appendFile(t, serverFiles.CA, clientCA.Issue(clientDir, "client").CA)
	etcd := etcdtest.StartTLS(t, serverFiles)
	clientFiles := etcdtest.TLSFiles{CA: filepath.Join(clientDir, "trusted.pem"), Cert: filepath.Join(clientDir, "client.pem"), Key: filepath.Join(clientDir, "client-key.pem")}
	copyFile(t, serverFiles.CA, clientFiles.CA)
	config := filepath.Join(t.TempDir(), "etcd.yaml")
	writeFile(t, config, fmt.Sprintf("endpoints: [%s]\ntrusted-ca-file: %s\ncert-file: %s\nkey-file: %s\n",
		etcd.Endpoint(), clientFiles.CA, clientFiles.Cert, clientFiles.Key))

	var c Client
	h := celltest.New(Cell, cell.Invoke(func(cl Client) { c = cl }))
	hive.AddConfigOverride(h, func(cfg *Config) {
		cfg.KVStore, cfg.KVStoreOpt, cfg.KVStorePrefix = "etcd", []string{"etcd.config=" + config}, "tls"
	})
	celltest.Start(t, h)
	ctx := ctxT(t)
	if _, err := c.UpdateIfDifferent(ctx, "state/a", []byte("1")); err != nil {
		t.Fatalf("write over TLS: %v", err)
	}

	// The server moves to CA 2 (a certificate the client's CA file does
	// not verify; it trusts only client certificates of CA 2): the client
	// with the old files fails.
	ca2 := etcdtest.NewCA(t, "ca-2")
	etcd.Stop()
	ca2.Issue(serverDir, "server")
	etcd.Restart()
	short, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, _, err := c.Get(short, "state/a"); err == nil {
		t.Fatal("the client with CA 1's certificates reached the server of CA 2")
	}
	// Its files are rotated (CA and certificate): it gets through, with no
	// restart.
	ca2.Issue(clientDir, "client")
	copyFile(t, filepath.Join(clientDir, "client-ca.pem"), clientFiles.CA)
	celltest.Eventually(t, "the client with rotated certificates reaches etcd", func() (bool, string) {
		v, found, err := c.Get(ctx, "state/a")
		return err == nil && found && string(v) == "1", fmt.Sprintf("%q found %v, %v", v, found, err)
	})
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

func appendFile(t *testing.T, to, from string) {
	t.Helper()
	a, err := os.ReadFile(to)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, to, string(a)+string(b))
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, to, string(b))
}

// tlsEtcd starts an etcd serving TLS with a certificate for serverHosts
// (signed by the CA the client trusts), and writes the client's
// etcd.config naming it as https://host:port. It returns the config
// file's path and the host:port.
func tlsEtcd(t *testing.T, host string, serverHosts ...string) (*etcdtest.Server, etcdtest.TLSFiles, string, string) {
	t.Helper()
	serverDir, clientDir := t.TempDir(), t.TempDir()
	ca := etcdtest.NewCA(t, "ca")
	serverFiles := ca.IssueFor(serverDir, "server", serverHosts...)
	clientFiles := ca.Issue(clientDir, "client")
	etcd := etcdtest.StartTLS(t, serverFiles)
	_, port, err := net.SplitHostPort(strings.TrimPrefix(etcd.Endpoint(), "https://"))
	if err != nil {
		t.Fatal(err)
	}
	hostPort := net.JoinHostPort(host, port)
	config := filepath.Join(t.TempDir(), "etcd.yaml")
	writeFile(t, config, fmt.Sprintf("endpoints: [https://%s]\ntrusted-ca-file: %s\ncert-file: %s\nkey-file: %s\n",
		hostPort, clientFiles.CA, clientFiles.Cert, clientFiles.Key))
	return etcd, clientFiles, config, hostPort
}

// startTLSClient runs the kvstore cell with an etcd.config file, and
// returns its client and the kvstore-status job's health.
func startTLSClient(t *testing.T, config string) (*etcdClient, func() *health.Status) {
	t.Helper()
	var c Client
	var db *statedb.DB
	var tbl statedb.Table[*health.Status]
	h := celltest.New(Cell, cell.Invoke(func(cl Client, d *statedb.DB, hs statedb.Table[*health.Status]) {
		c, db, tbl = cl, d, hs
		cl.(*etcdClient).statusBase, cl.(*etcdClient).statusTimeout = 50*time.Millisecond, time.Second
	}))
	hive.AddConfigOverride(h, func(cfg *Config) {
		cfg.KVStore, cfg.KVStoreOpt, cfg.KVStorePrefix = "etcd", []string{"etcd.config=" + config}, "tls"
	})
	celltest.Start(t, h)
	status := func() *health.Status {
		st, _, _ := tbl.Get(db.ReadTxn(), health.StatusID.Query("kvstore.job-kvstore-status"))
		return st
	}
	return c.(*etcdClient), status
}

// TestTLSVerifiesTheEndpointsHost: the server's certificate must name the
// host of the endpoint dialled, an IP address or a DNS name, as well as
// chain to the trusted CA. A certificate of the trusted CA for another
// host is refused: the client stays connecting, nothing is written, and
// the status and health say which check failed against which endpoint.
func TestTLSVerifiesTheEndpointsHost(t *testing.T) {
	for _, tc := range []struct {
		name        string
		host        string   // of the endpoint the client dials
		serverHosts []string // the server certificate's names
		ok          bool
	}{
		{"ip endpoint, certificate for the ip", "127.0.0.1", []string{"127.0.0.1"}, true},
		{"dns endpoint, certificate for the name", "localhost", []string{"localhost"}, true},
		{"ip endpoint, certificate for another host", "127.0.0.1", []string{"wrong.example", "10.9.9.9"}, false},
		{"dns endpoint, certificate for another host", "localhost", []string{"wrong.example", "10.9.9.9"}, false},
		{"dns endpoint, certificate for its address only", "localhost", []string{"127.0.0.1"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			etcd, files, config, hostPort := tlsEtcd(t, tc.host, tc.serverHosts...)
			c, status := startTLSClient(t, config)
			if tc.ok {
				celltest.Eventually(t, "connected", func() (bool, string) { st := c.Status(); return st.State == StateConnected, fmt.Sprintf("%+v", st) })
				if _, err := c.UpdateIfDifferent(ctxT(t), "state/a", []byte("1")); err != nil {
					t.Fatalf("write over TLS: %v", err)
				}
				return
			}
			celltest.Eventually(t, "the status names the refused certificate and the endpoint", func() (bool, string) {
				st := c.Status()
				return st.State == StateConnecting && strings.Contains(st.LastError, "TLS handshake with etcd "+hostPort) &&
					strings.Contains(st.LastError, "tls: failed to verify certificate: x509: certificate is"), fmt.Sprintf("%+v", st)
			})
			celltest.Eventually(t, "health degraded, naming it", func() (bool, string) {
				st := status()
				return st != nil && st.Level == cell.StatusDegraded && strings.Contains(st.Error, "TLS handshake with etcd "+hostPort), fmt.Sprintf("%+v", st)
			})
			short, cancel := context.WithTimeout(ctxT(t), time.Second)
			defer cancel()
			if _, err := c.UpdateIfDifferent(short, "state/a", []byte("1")); !errors.Is(err, ErrUnavailable) {
				t.Fatalf("write to a server with a certificate for %v: %v, want ErrUnavailable", tc.serverHosts, err)
			}
			// Nothing reached the server: read it with a client of its own
			// that does not check the host.
			raw := etcdtest.UncheckedClient(t, etcd.Endpoint(), files)
			resp, err := raw.Get(ctxT(t), "tls/", clientv3.WithPrefix())
			if err != nil || len(resp.Kvs) != 0 {
				t.Fatalf("keys on the server the client refused: %v, %v", resp, err)
			}
			if c.Status().State == StateConnected {
				t.Fatal("connected to a server with a certificate for another host")
			}
		})
	}
}
