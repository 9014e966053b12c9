package identity

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cellium/cellium/cells/daemon"
	"github.com/cellium/cellium/cells/health"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/pkg/etcdtest"
	"github.com/cellium/cellium/pkg/identity"
	"github.com/cellium/cellium/pkg/labels"
	"github.com/cellium/cellium/pkg/polltest"
)

func rawClient(t *testing.T, etcd *etcdtest.Server) *clientv3.Client {
	t.Helper()
	raw, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd.Endpoint()}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	return raw
}

// TestEveryKeyDeleted: every key under the prefix deleted at once: each
// node writes back the master key of the identity it uses and its own
// value key, on its lease, and counts the repair; the collector then sees
// the identity in use and keeps it, round after round.
func TestEveryKeyDeleted(t *testing.T) {
	etcd := etcdtest.Start(t)
	a, _ := startAllocator(t, "node-a", t.TempDir(), etcd.Endpoint(), "all")
	b, _ := startAllocator(t, "node-b", t.TempDir(), etcd.Endpoint(), "all")
	ctx := ctxT(t)
	n, err := a.Allocate(ctx, web("all"))
	if err != nil {
		t.Fatal(err)
	}
	if m, err := b.Allocate(ctx, web("all")); err != nil || m != n {
		t.Fatalf("node b: %v, %v; want %v", m, err, n)
	}
	raw := rawClient(t, etcd)
	if _, err := raw.Delete(ctx, "all/", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	ls := web("all").String()
	celltest.Eventually(t, "the master key and both value keys back, leased", func() (bool, string) {
		master, found, err := a.kv.Get(ctx, idPrefix+n.String())
		if err != nil || !found || string(master) != ls {
			return false, fmt.Sprintf("master key %q found %v, %v", master, found, err)
		}
		values, err := a.kv.List(ctx, valuePrefix+ls+"/")
		if err != nil || len(values) != 2 {
			return false, fmt.Sprintf("value keys %+v, %v", values, err)
		}
		for _, v := range values {
			if string(v.Value) != n.String() || v.Lease == 0 {
				return false, fmt.Sprintf("value key %+v", v)
			}
		}
		return true, ""
	})
	celltest.Eventually(t, "a repair counted on each node", func() (bool, string) {
		ra, rb := testutil.ToFloat64(a.repairs), testutil.ToFloat64(b.repairs)
		return ra >= 1 && rb >= 1, fmt.Sprintf("repairs %v and %v", ra, rb)
	})
	for range 3 {
		if err := a.gcRound(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, found, _ := a.kv.Get(ctx, idPrefix+n.String()); !found {
		t.Fatal("the collector deleted the master key of an identity in use after it was written back")
	}
}

// TestVanishedMasterKeepsNumber: a label set whose master key is gone while
// a value key still names its number (etcd lost the master key, the
// value key was written again on its lease) gets that number, with its
// master key written again, not a new one nor an error.
func TestVanishedMasterKeepsNumber(t *testing.T) {
	etcd := etcdtest.Start(t)
	a, _ := startAllocator(t, "node-a", t.TempDir(), etcd.Endpoint(), "van")
	ctx := ctxT(t)
	ls := web("van").String()
	for _, kv := range [][2]string{{idPrefix + "300", ls}, {valuePrefix + ls + "/node-x", "300"}} {
		if _, err := a.kv.UpdateIfDifferent(ctx, kv[0], []byte(kv[1])); err != nil {
			t.Fatal(err)
		}
	}
	celltest.Eventually(t, "node a knows 300", func() (bool, string) {
		id, ok := a.Lookup(web("van"))
		return ok && id == 300, fmt.Sprintf("lookup: %v, %v", id, ok)
	})
	if err := a.kv.Delete(ctx, idPrefix+"300"); err != nil {
		t.Fatal(err)
	}
	celltest.Eventually(t, "node a forgot 300", func() (bool, string) {
		id, ok := a.Lookup(web("van"))
		return !ok, fmt.Sprintf("lookup: %v, %v", id, ok)
	})
	n, err := a.Allocate(ctx, web("van"))
	if err != nil || n != 300 {
		t.Fatalf("Allocate = %v, %v; want 300, the number the value keys name", n, err)
	}
	if v, found, _ := a.kv.Get(ctx, idPrefix+"300"); !found || string(v) != ls {
		t.Fatalf("master key 300 = %q (found %v), want %s", v, found, ls)
	}
}

// TestMasterKeyOverwritten: the master key of an identity in use rewritten
// to name another label set is put back.
func TestMasterKeyOverwritten(t *testing.T) {
	a, ctx, n := allocatedOne(t, "ow")
	for _, forged := range []string{web("forged").String(), "not a label set"} {
		if _, err := a.kv.UpdateIfDifferent(ctx, idPrefix+n.String(), []byte(forged)); err != nil {
			t.Fatal(err)
		}
		wantMasterKeyBack(t, ctx, a, n, web("ow"))
	}
}

// TestMasterKeysRefused: master keys whose number is not canonical or not
// in the cluster range, or whose value is not a label set in canonical
// form or too large, are refused and named in health; they change nothing
// else (an alias of a number in use neither renames nor, when deleted,
// removes it).
func TestMasterKeysRefused(t *testing.T) {
	etcd := etcdtest.Start(t)
	var (
		a  *Allocator
		hs statedb.Table[*health.Status]
	)
	dir := t.TempDir()
	h := celltest.New(daemon.Cell, kvstore.Cell, Cell, cell.Invoke(func(al *Allocator, s statedb.Table[*health.Status]) { a, hs = al, s }))
	hive.AddConfigOverride(h, func(c *daemon.Config) {
		c.StateDir, c.RunDir, c.NodeName = filepath.Join(dir, "state"), filepath.Join(dir, "run"), "node-a"
	})
	hive.AddConfigOverride(h, func(c *kvstore.Config) {
		c.KVStore, c.KVStoreOpt, c.KVStorePrefix = "etcd", []string{"etcd.address=" + etcd.Endpoint()}, "ref"
	})
	celltest.Start(t, h)
	ctx := ctxT(t)
	if _, err := a.kv.UpdateIfDifferent(ctx, idPrefix+"300", []byte(web("ref").String())); err != nil {
		t.Fatal(err)
	}
	celltest.Eventually(t, "300 known", func() (bool, string) {
		id, ok := a.Lookup(web("ref"))
		return ok && id == 300, fmt.Sprintf("lookup: %v, %v", id, ok)
	})

	big := web("big").String() + ";k8s:x=" + strings.Repeat("y", maxMasterValue)
	for _, c := range []struct{ key, value, why string }{
		{"0300", web("alias").String(), "canonical form"},
		{"1", web("host").String(), "outside the cluster range"},
		{"70000", web("high").String(), "outside the cluster range"},
		{"301", "k8s:b=1;k8s:a=1", "canonical form"},
		{"302", big, "bytes"},
	} {
		if _, err := a.kv.UpdateIfDifferent(ctx, idPrefix+c.key, []byte(c.value)); err != nil {
			t.Fatal(err)
		}
		celltest.Eventually(t, "health names "+c.key, func() (bool, string) {
			s, _, found := hs.Get(a.db.ReadTxn(), health.StatusID.Query("identity.job-watch-identities"))
			return found && s.Level == cell.StatusDegraded && strings.Contains(s.Error, idPrefix+c.key+": ") && strings.Contains(s.Error, c.why), fmt.Sprintf("found %v: %+v", found, s)
		})
	}
	if err := a.kv.Delete(ctx, idPrefix+"0300"); err != nil {
		t.Fatal(err)
	}
	celltest.Eventually(t, "the alias gone from health", func() (bool, string) {
		s, _, _ := hs.Get(a.db.ReadTxn(), health.StatusID.Query("identity.job-watch-identities"))
		return !strings.Contains(s.Error, idPrefix+"0300:"), fmt.Sprintf("%+v", s)
	})
	row, _, found := a.tbl.Get(a.db.ReadTxn(), ByID.Query(300))
	if !found || row.Labels.String() != web("ref").String() {
		t.Fatalf("row 300 = %+v, %v; want it unchanged", row, found)
	}
	for _, n := range []identity.NumericIdentity{1, 301, 302} {
		if row, _, _ := a.tbl.Get(a.db.ReadTxn(), ByID.Query(n)); row != nil && row.Kind == KindCluster {
			t.Errorf("refused key made row %+v", row)
		}
	}
}

// TestEtcdReplacedByAnEmptyOne: etcd replaced by an empty one behind the
// same endpoint: each node writes back the master key of the identity it
// uses and its value key; a node that starts afterwards (or restarts)
// gets the same number for the label set.
func TestEtcdReplacedByAnEmptyOne(t *testing.T) {
	etcd := etcdtest.Start(t)
	raw := rawClient(t, etcd)
	ctx := ctxT(t)
	// Revisions the empty store will not have reached when the agents
	// read it again: how the kvstore client tells it was replaced.
	for i := range 20 {
		if _, err := raw.Put(ctx, "rep/other", fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	a, _ := startAllocator(t, "node-a", t.TempDir(), etcd.Endpoint(), "rep")
	b, _ := startAllocator(t, "node-b", t.TempDir(), etcd.Endpoint(), "rep")
	n, err := a.Allocate(ctx, web("rep"))
	if err != nil {
		t.Fatal(err)
	}
	if m, err := b.Allocate(ctx, web("rep")); err != nil || m != n {
		t.Fatalf("node b: %v, %v; want %v", m, err, n)
	}
	etcd.Wipe()
	etcd.Restart()
	ls := web("rep").String()
	polltest.Until(t, "the master key and both value keys in the new etcd", 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		master, found, err := a.kv.Get(ctx, idPrefix+n.String())
		if err != nil || !found || string(master) != ls {
			return false, fmt.Sprintf("master %q found %v err %v", master, found, err)
		}
		values, err := a.kv.List(ctx, valuePrefix+ls+"/")
		if err != nil || len(values) != 2 {
			return false, fmt.Sprintf("value keys %v, err %v", values, err)
		}
		return true, ""
	})
	c, _ := startAllocator(t, "node-c", t.TempDir(), etcd.Endpoint(), "rep")
	if m, err := c.Allocate(ctxT(t), web("rep")); err != nil || m != n {
		t.Fatalf("a node started after the replacement: %v, %v; want %v", m, err, n)
	}
}

// TestClusterIdentitiesExhausted: with every cluster number known, a new
// label set's allocation fails at once with ErrIdentitiesExhausted (it
// looped for ever, holding the label set's lock), and the next label set
// gets the one number freed.
func TestClusterIdentitiesExhausted(t *testing.T) {
	etcd := etcdtest.Start(t)
	a, _ := startAllocator(t, "node-a", t.TempDir(), etcd.Endpoint(), "full")
	ctx := ctxT(t)
	if err := a.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	txn := a.db.WriteTxn(a.tbl)
	for n := identity.MinCluster; n <= identity.MaxCluster; n++ {
		ls := labels.New(labels.Label{Source: "k8s", Key: "n", Value: n.String()}, labels.Label{Source: "k8s", Key: NamespaceLabel, Value: "full"})
		if _, _, err := a.tbl.Insert(txn, &Identity{ID: n, Labels: ls, Kind: KindCluster, Source: SourceKVStore}); err != nil {
			t.Fatal(err)
		}
	}
	txn.Commit()
	if _, err := a.Allocate(ctx, web("full")); !errors.Is(err, ErrIdentitiesExhausted) || !strings.Contains(err.Error(), "k8s:app=web") {
		t.Fatalf("Allocate with every cluster number known: %v, want ErrIdentitiesExhausted naming the label set", err)
	}
	txn = a.db.WriteTxn(a.tbl)
	a.tbl.Delete(txn, &Identity{ID: 40000})
	txn.Commit()
	if n, err := a.Allocate(ctx, web("full")); err != nil || n != 40000 {
		t.Fatalf("Allocate with one number free: %v, %v; want 40000", n, err)
	}
}
