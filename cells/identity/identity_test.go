package identity

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/cells/daemon"
	"github.com/cellium/cellium/cells/health"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/pkg/etcdtest"
	"github.com/cellium/cellium/pkg/identity"
	"github.com/cellium/cellium/pkg/labels"
)

// startAllocator runs the identity cell for node, with its state in dir,
// and with the kvstore at etcd (under prefix) when etcd is not "".
func startAllocator(t testing.TB, node, dir, etcd, prefix string) (*Allocator, *hive.Hive) {
	t.Helper()
	var a *Allocator
	h := celltest.New(daemon.Cell, kvstore.Cell, Cell, cell.Invoke(func(al *Allocator) { a = al }))
	hive.AddConfigOverride(h, func(c *daemon.Config) {
		c.StateDir, c.RunDir, c.NodeName = filepath.Join(dir, "state"), filepath.Join(dir, "run"), node
	})
	if etcd != "" {
		hive.AddConfigOverride(h, func(c *kvstore.Config) {
			c.KVStore, c.KVStoreOpt, c.KVStorePrefix = "etcd", []string{"etcd.address=" + etcd}, prefix
		})
	}
	celltest.Start(t, h)
	return a, h
}

func startBenchAllocator(b *testing.B, etcd string) (*Allocator, *hive.Hive) {
	return startAllocator(b, "bench-node", b.TempDir(), etcd, "bench")
}

func web(ns string) labels.Labels {
	return labels.New(labels.Label{Source: "k8s", Key: "app", Value: "web"}, labels.Label{Source: "k8s", Key: NamespaceLabel, Value: ns})
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestLocalAllocator(t *testing.T) {
	dir := t.TempDir()
	a, h := startAllocator(t, "n1", dir, "", "")
	ctx := ctxT(t)
	id1, err := a.Allocate(ctx, web("default"))
	if err != nil || !id1.IsLocal() {
		t.Fatalf("Allocate = %v, %v; want a local identity", id1, err)
	}
	if again, _ := a.Allocate(ctx, web("default")); again != id1 {
		t.Fatalf("same labels got %v then %v", id1, again)
	}
	id2, _ := a.Allocate(ctx, web("other"))
	if id2 == id1 {
		t.Fatal("two label sets share an identity")
	}
	if id, _ := a.Allocate(ctx, nil); id != identity.Init {
		t.Fatalf("empty label set = %v, want init", id)
	}
	if n, ok := a.Lookup(web("default")); !ok || n != id1 {
		t.Fatalf("Lookup = %v, %v", n, ok)
	}
	if b := a.Backend(); b.Mode != "local" || b.Known != 2 || b.State != "checkpointed" || !strings.HasSuffix(b.Store, "checkpointed in "+filepath.Join(dir, "state", checkpointFile)) {
		t.Errorf("Backend = %+v, want local, 2 known, checkpointed in %s", b, filepath.Join(dir, "state", checkpointFile))
	}
	// Two users of id1, one of id2; id2's last user goes.
	if err := a.Release(ctx, id2); err != nil {
		t.Fatal(err)
	}
	if _, ok := a.Lookup(web("other")); ok {
		t.Fatal("released identity still in the table")
	}
	if err := a.Release(ctx, id2); err == nil {
		t.Fatal("releasing an identity no longer in use is no error")
	}

	// A restart keeps id1 for the endpoint that takes it back; RestoreDone
	// forgets the rest.
	h.Stop(hivetest.Logger(t), context.Background())
	b, _ := startAllocator(t, "n1", dir, "", "")
	if got, _ := b.Allocate(ctx, web("default")); got != id1 {
		t.Fatalf("after a restart the label set got %v, want %v", got, id1)
	}
	if err := b.RestoreDone(); err != nil {
		t.Fatal(err)
	}
	if got, _ := b.Allocate(ctx, web("third")); got == id1 {
		t.Fatal("a new label set got an identity in use")
	}
}

func TestCorruptCheckpointMovedAside(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "state"), 0o700)
	path := filepath.Join(dir, "state", checkpointFile)
	os.WriteFile(path, []byte(`{"version":1,"identities":[{"id":300,"labels":"k8s:a=b"}]}`), 0o600)
	a, _ := startAllocator(t, "n1", dir, "", "")
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("invalid checkpoint (a cluster number in the local file) still in place: %v", err)
	}
	moved, _ := filepath.Glob(filepath.Join(dir, "state", "invalid", "*"))
	if len(moved) != 1 {
		t.Fatalf("moved aside: %v", moved)
	}
	if id, err := a.Allocate(ctxT(t), web("default")); err != nil || !id.IsLocal() {
		t.Fatalf("allocation after a corrupt checkpoint = %v, %v", id, err)
	}
}

// A checkpoint that is a FIFO is moved aside at once: the start neither
// waits for a writer nor fails.
func TestCheckpointNotARegularFileMovedAside(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "state"), 0o700)
	path := filepath.Join(dir, "state", checkpointFile)
	if err := unix.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	// Should the start block on the FIFO (the bug), a writer comes after
	// 10s to release it, and the test fails.
	var blocked atomic.Bool
	release := time.AfterFunc(10*time.Second, func() {
		blocked.Store(true)
		if fd, err := unix.Open(path, unix.O_RDWR|unix.O_NONBLOCK, 0); err == nil {
			unix.Close(fd)
		}
	})
	var (
		a  *Allocator
		db *statedb.DB
		hs statedb.Table[*health.Status]
	)
	h := celltest.New(daemon.Cell, kvstore.Cell, Cell, cell.Invoke(func(al *Allocator, d *statedb.DB, s statedb.Table[*health.Status]) {
		a, db, hs = al, d, s
	}))
	hive.AddConfigOverride(h, func(c *daemon.Config) {
		c.StateDir, c.RunDir, c.NodeName = filepath.Join(dir, "state"), filepath.Join(dir, "run"), "n1"
	})
	celltest.Start(t, h)
	release.Stop()
	if blocked.Load() {
		t.Fatal("the allocator's start blocked on a FIFO as its checkpoint")
	}
	// agent status shows it.
	row, _, found := hs.Get(db.ReadTxn(), health.StatusID.Query("identity.checkpoint"))
	if !found || row.Level != cell.StatusDegraded || !strings.Contains(row.Error, path+" moved to ") || !strings.Contains(row.Error, "named pipe") {
		t.Fatalf("health identity.checkpoint = %+v, want Degraded naming %s", row, path)
	}
	moved, _ := filepath.Glob(filepath.Join(dir, "state", "invalid", "*"))
	if len(moved) != 1 {
		t.Fatalf("moved aside: %v", moved)
	}
	if id, err := a.Allocate(ctxT(t), web("default")); err != nil || !id.IsLocal() {
		t.Fatalf("allocation after a FIFO checkpoint = %v, %v", id, err)
	}
}

func TestLabelFilter(t *testing.T) {
	a := &Allocator{}
	var err error
	if a.filter, err = parseLabelFilter(defaultLabelFilter); err != nil {
		t.Fatal(err)
	}
	got := a.PodLabels(Pod{Namespace: "prod", ServiceAccount: "web-sa",
		Labels: map[string]string{
			"app": "web", "pod-template-hash": "abc", "kubernetes.io/x": "1", "app.kubernetes.io/name": "web",
			"statefulset.kubernetes.io/pod-name": "web-0",
			// A pod cannot pose as another namespace or service account.
			NamespaceLabel: "kube-system", ServiceAccountLabel: "admin", NamespaceLabelsPrefix + "team": "root",
		},
		NamespaceLabels: map[string]string{"team": "payments", "kubernetes.io/metadata.name": "prod"},
	}).String()
	want := "k8s:app=web;k8s:app.kubernetes.io/name=web;k8s:io.cellium.k8s.namespace.labels.team=payments;" +
		"k8s:io.cellium.k8s.policy.serviceaccount=web-sa;k8s:io.kubernetes.pod.namespace=prod"
	if got != want {
		t.Fatalf("PodLabels =\n%s, want\n%s", got, want)
	}
	if a.filter, err = parseLabelFilter([]string{"app", "!tier"}); err != nil {
		t.Fatal(err)
	}
	got = a.PodLabels(Pod{Namespace: "prod", Labels: map[string]string{"app": "web", "tier": "x", "other": "y"},
		NamespaceLabels: map[string]string{"team": "payments"}}).String()
	if got != "k8s:app=web;k8s:io.kubernetes.pod.namespace=prod" {
		t.Fatalf("with keep patterns: %s", got)
	}
	for _, bad := range []string{"", "!", "a=b", "*"} {
		if _, err := parseLabelFilter([]string{bad}); err == nil || !strings.Contains(err.Error(), "--labels") {
			t.Errorf("pattern %q: %v", bad, err)
		}
	}
}

func TestClusterAllocator(t *testing.T) {
	etcd := etcdtest.Start(t)
	a, _ := startAllocator(t, "node-a", t.TempDir(), etcd.Endpoint(), "c1")
	b, _ := startAllocator(t, "node-b", t.TempDir(), etcd.Endpoint(), "c1")
	ctx := ctxT(t)

	// Racing allocations of one new label set on both nodes give one number.
	var mu sync.Mutex
	got := map[identity.NumericIdentity]int{}
	var wg sync.WaitGroup
	for i := range 16 {
		al := a
		if i%2 == 1 {
			al = b
		}
		wg.Go(func() {
			id, err := al.Allocate(ctx, web("race"))
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			got[id]++
			mu.Unlock()
		})
	}
	wg.Wait()
	if len(got) != 1 {
		t.Fatalf("one label set got %d numbers: %v", len(got), got)
	}
	var n identity.NumericIdentity
	for id := range got {
		n = id
	}
	if !n.IsCluster() {
		t.Fatalf("identity %v is not in the cluster range", n)
	}
	// Both nodes have their value key; the other node's table learns the
	// identity from the master key.
	raw := etcdKeys(t, a, "state/identities/v1/value/"+web("race").String()+"/")
	if len(raw) != 2 {
		t.Fatalf("value keys %v, want one per node", raw)
	}
	celltest.Eventually(t, "node b's table knows the identity", func() (bool, string) {
		id, ok := b.Lookup(web("race"))
		return ok && id == n, fmt.Sprintf("lookup: %v, %v", id, ok)
	})
	// A label set allocated later on one node gets the same number on the
	// other.
	first, _ := a.Allocate(ctx, web("later"))
	second, _ := b.Allocate(ctx, web("later"))
	if first != second {
		t.Fatalf("same labels, numbers %v and %v", first, second)
	}

	// Releasing every use on node a deletes its value key only.
	for range 8 {
		if err := a.Release(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	if raw := etcdKeys(t, a, "state/identities/v1/value/"+web("race").String()+"/"); len(raw) != 1 || !strings.HasSuffix(raw[0], "/node-b") {
		t.Fatalf("value keys after node a released: %v", raw)
	}
}

func TestClusterAllocatorOutage(t *testing.T) {
	etcd := etcdtest.Start(t)
	a, _ := startAllocator(t, "node-a", t.TempDir(), etcd.Endpoint(), "c2")
	ctx := ctxT(t)
	known, err := a.Allocate(ctx, web("known"))
	if err != nil {
		t.Fatal(err)
	}
	etcd.Stop()
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := a.Allocate(short, web("new")); err == nil {
		t.Fatal("a new label set was allocated with etcd down")
	}
	if id, ok := a.Lookup(web("known")); !ok || id != known {
		t.Fatalf("Lookup of a known label set with etcd down = %v, %v", id, ok)
	}
	etcd.Restart()
	id, err := a.Allocate(ctx, web("new"))
	if err != nil || !id.IsCluster() {
		t.Fatalf("allocation after etcd returned = %v, %v", id, err)
	}
}

func etcdKeys(t *testing.T, a *Allocator, prefix string) []string {
	t.Helper()
	kvs, err := a.kv.List(ctxT(t), prefix)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, kv := range kvs {
		keys = append(keys, kv.Key)
	}
	return keys
}

// TestGC: a master key that no node uses is deleted by the second GC round
// that finds it unused, never the first; one in use, or used again between
// rounds, stays; only the agent holding the GC lock collects.
func TestGC(t *testing.T) {
	etcd := etcdtest.Start(t)
	a, _ := startAllocator(t, "node-a", t.TempDir(), etcd.Endpoint(), "gc")
	b, _ := startAllocator(t, "node-b", t.TempDir(), etcd.Endpoint(), "gc")
	ctx := ctxT(t)
	unused, _ := a.Allocate(ctx, web("unused"))
	reused, _ := a.Allocate(ctx, web("reused"))
	kept, _ := b.Allocate(ctx, web("kept"))
	a.Release(ctx, unused)
	a.Release(ctx, reused)
	master := func(n identity.NumericIdentity) bool {
		_, found, err := a.kv.Get(ctx, idPrefix+n.String())
		if err != nil {
			t.Fatal(err)
		}
		return found
	}

	// While b holds the GC lock, a's rounds do nothing.
	u, err := b.kv.TryLock(ctx, gcLock)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := a.gcRound(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if !master(unused) {
		t.Fatal("a collected without the GC lock")
	}
	u.Unlock(ctx)

	if err := a.gcRound(ctx); err != nil {
		t.Fatal(err)
	}
	if !master(unused) || !master(reused) {
		t.Fatal("the first round that found a key unused deleted it")
	}
	// reused gets a user again between the rounds, on b, which knows its
	// master key (a label set nobody uses may otherwise get a new number).
	celltest.Eventually(t, "node b knows the reused identity", func() (bool, string) {
		id, ok := b.Lookup(web("reused"))
		return ok && id == reused, fmt.Sprintf("lookup: %v, %v", id, ok)
	})
	if again, err := b.Allocate(ctx, web("reused")); err != nil || again != reused {
		t.Fatalf("reallocating %v = %v, %v; want the same number", reused, again, err)
	}
	if err := a.gcRound(ctx); err != nil {
		t.Fatal(err)
	}
	if master(unused) {
		t.Fatal("unused for two rounds and still there")
	}
	if !master(reused) || !master(kept) {
		t.Fatal("GC deleted an identity in use")
	}
}

// TestMasterKeyWrittenBack: a master key deleted (by hand, or a collector
// that lost its value key's race) while a node uses the identity is
// written back by that node with the same label set.
func TestMasterKeyWrittenBack(t *testing.T) {
	a, ctx, n := allocatedOne(t, "wb")
	if err := a.kv.Delete(ctx, idPrefix+n.String()); err != nil {
		t.Fatal(err)
	}
	wantMasterKeyBack(t, ctx, a, n, web("wb"))
}

// allocatedOne starts node-a's allocator on a new etcd under prefix and
// allocates web(prefix) there, as n.
func allocatedOne(t *testing.T, prefix string) (a *Allocator, ctx context.Context, n identity.NumericIdentity) {
	t.Helper()
	etcd := etcdtest.Start(t)
	a, _ = startAllocator(t, "node-a", t.TempDir(), etcd.Endpoint(), prefix)
	ctx = ctxT(t)
	n, err := a.Allocate(ctx, web(prefix))
	if err != nil {
		t.Fatal(err)
	}
	return a, ctx, n
}

// wantMasterKeyBack waits until n's master key holds ls again and checks
// that a still resolves ls to n.
func wantMasterKeyBack(t *testing.T, ctx context.Context, a *Allocator, n identity.NumericIdentity, ls labels.Labels) {
	t.Helper()
	celltest.Eventually(t, "the master key of "+n.String()+" back", func() (bool, string) {
		v, found, err := a.kv.Get(ctx, idPrefix+n.String())
		return err == nil && found && string(v) == ls.String(), fmt.Sprintf("%q found %v, %v", v, found, err)
	})
	if id, ok := a.Lookup(ls); !ok || id != n {
		t.Fatalf("Lookup(%s) after the master key came back = %v, %v; want %v", ls, id, ok, n)
	}
}

// TestTwoMastersForOneLabelSet: when a node that did not know an unused
// master key created a second one for the same label set, every node
// still resolves the set to one number, and the unused one is collected.
func TestTwoMastersForOneLabelSet(t *testing.T) {
	etcd := etcdtest.Start(t)
	a, _ := startAllocator(t, "node-a", t.TempDir(), etcd.Endpoint(), "two")
	ctx := ctxT(t)
	ls := web("two").String()
	// An unused master key (its users went) and one in use by node-x.
	for _, kv := range [][2]string{{idPrefix + "300", ls}, {idPrefix + "400", ls}, {valuePrefix + ls + "/node-x", "400"}} {
		if _, err := a.kv.UpdateIfDifferent(ctx, kv[0], []byte(kv[1])); err != nil {
			t.Fatal(err)
		}
	}
	celltest.Eventually(t, "both numbers in the table", func() (bool, string) {
		var rows []string
		for row := range a.tbl.List(a.db.ReadTxn(), ByLabels.Query(ls)) {
			rows = append(rows, fmt.Sprintf("%+v", row))
		}
		return len(rows) == 2, fmt.Sprint(rows)
	})
	// The allocator joins the number in use, not the lowest one the
	// table names.
	n, err := a.Allocate(ctx, web("two"))
	if err != nil || n != 400 {
		t.Fatalf("Allocate = %v, %v; want 400, the number node-x uses", n, err)
	}
	for range 2 {
		if err := a.gcRound(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, found, _ := a.kv.Get(ctx, idPrefix+"300"); found {
		t.Fatal("the unused second master key was not collected")
	}
	if _, found, _ := a.kv.Get(ctx, idPrefix+"400"); !found {
		t.Fatal("the master key in use was collected")
	}
}

// TestParallelUses: parallel uses and releases of one label set, local and
// through the kvstore, all get its one identity and take no table write
// each while it stays in use; the row's Refs catch up with the count, and
// the last release frees the identity (checkpoint, value key).
func TestParallelUses(t *testing.T) {
	for _, mode := range []string{"local", "kvstore"} {
		t.Run(mode, func(t *testing.T) {
			etcd := ""
			if mode == "kvstore" {
				etcd = etcdtest.Start(t).Endpoint()
			}
			dir := t.TempDir()
			a, _ := startAllocator(t, "n1", dir, etcd, "par")
			ctx := ctxT(t)
			first, err := a.Allocate(ctx, web("par"))
			if err != nil {
				t.Fatal(err)
			}
			refs := func() int {
				row, _, found := a.tbl.Get(a.db.ReadTxn(), ByID.Query(first))
				if !found {
					return -1
				}
				return row.Refs
			}
			const users = 64
			var wg sync.WaitGroup
			for i := range users {
				wg.Go(func() {
					id, err := a.Allocate(ctx, web("par"))
					if err != nil {
						t.Error(err)
						return
					}
					if id != first {
						t.Errorf("a parallel use got identity %v, want %v", id, first)
					}
					if i%2 == 1 {
						// Releases that leave users, beside the uses.
						if err := a.Release(ctx, id); err != nil {
							t.Error(err)
						}
					}
				})
			}
			wg.Wait()
			want := 1 + users/2
			celltest.Eventually(t, "the row's Refs to be the users left", func() (bool, string) { n := refs(); return n == want, fmt.Sprint("Refs ", n) })

			for range want - 1 {
				wg.Go(func() {
					if err := a.Release(ctx, first); err != nil {
						t.Error(err)
					}
				})
			}
			wg.Wait()
			celltest.Eventually(t, "the row's Refs to be the last user", func() (bool, string) { n := refs(); return n == 1, fmt.Sprint("Refs ", n) })
			if err := a.Release(ctx, first); err != nil {
				t.Fatal(err)
			}
			if err := a.Release(ctx, first); err == nil {
				t.Error("a release beyond the last user is no error")
			}
			if mode == "local" {
				if got := refs(); got != -1 {
					t.Errorf("the released local identity's row is still there with Refs %d", got)
				}
				b, err := os.ReadFile(filepath.Join(dir, "state", checkpointFile))
				if err != nil {
					t.Fatal(err)
				}
				if strings.Contains(string(b), first.String()) {
					t.Errorf("the checkpoint still holds the released identity %v: %s", first, b)
				}
				return
			}
			if _, found, err := a.kv.Get(ctx, a.valueKey(web("par").String())); err != nil || found {
				t.Errorf("this node's value key after the last release: found %v, %v; want it deleted", found, err)
			}
			celltest.Eventually(t, "the row's Refs to be 0", func() (bool, string) { n := refs(); return n == 0, fmt.Sprint("Refs ", n) })
		})
	}
}

// TestKnownUseWritesNoRow: a use or release of an identity that stays in
// use does not wait for the identities table (another holds its write
// lock meanwhile); the row's Refs follow once the table is free.
func TestKnownUseWritesNoRow(t *testing.T) {
	a, _ := startAllocator(t, "n1", t.TempDir(), "", "")
	ctx := ctxT(t)
	first, err := a.Allocate(ctx, web("known"))
	if err != nil {
		t.Fatal(err)
	}
	refs := func() int {
		row, _, _ := a.tbl.Get(a.db.ReadTxn(), ByID.Query(first))
		return row.Refs
	}
	// whileTableHeld runs fn with the table's write lock held elsewhere,
	// and fails if fn does not return within 10 s.
	whileTableHeld := func(what string, fn func() error) {
		t.Helper()
		txn := a.db.WriteTxn(a.tbl)
		done := make(chan error, 1)
		go func() { done <- fn() }()
		select {
		case err := <-done:
			txn.Abort()
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			txn.Abort()
			<-done
			t.Fatalf("%s waited for the identities table", what)
		}
	}
	whileTableHeld("a use of an identity in use", func() error {
		id, err := a.Allocate(ctx, web("known"))
		if err == nil && id != first {
			t.Errorf("the second use got %v, want %v", id, first)
		}
		return err
	})
	celltest.Eventually(t, "the row's Refs to be 2", func() (bool, string) { n := refs(); return n == 2, fmt.Sprint("Refs ", n) })
	whileTableHeld("a release that leaves a user", func() error { return a.Release(ctx, first) })
	celltest.Eventually(t, "the row's Refs to be 1", func() (bool, string) { n := refs(); return n == 1, fmt.Sprint("Refs ", n) })
}
