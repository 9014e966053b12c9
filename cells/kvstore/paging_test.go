package kvstore

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/cellium/cellium/pkg/etcdtest"
)

// TestListPaged: a listing of a prefix larger than a page is several
// requests (counted by etcd itself), and List and Watch still see every
// key of the prefix, once, and none beside it.
func TestListPaged(t *testing.T) {
	etcd := etcdtest.Start(t)
	c := startClient(t, etcd.Endpoint(), "t20", func(c *etcdClient) { c.pageSize = 3 })
	ctx := ctxT(t)
	raw := rawClient(t, etcd.Endpoint())
	var want []string
	for i := range 10 {
		key := fmt.Sprintf("state/p/%02d", i)
		want = append(want, key)
		if _, err := raw.Put(ctx, "t20/"+key, "v"); err != nil {
			t.Fatal(err)
		}
	}
	// Beside the prefix, before and after it.
	for _, k := range []string{"t20/state/o", "t20/state/q", "t20/state/p"} {
		if _, err := raw.Put(ctx, k, "x"); err != nil {
			t.Fatal(err)
		}
	}
	ranges := func() int {
		n, err := etcd.RangeRequests()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}

	before := ranges()
	kvs, err := c.List(ctx, "state/p/")
	if err != nil {
		t.Fatal(err)
	}
	// 10 keys in pages of 3: 4 requests. One unpaged request, with the
	// client's own status checks meanwhile, stays well below.
	if n := ranges() - before; n < 4 {
		t.Fatalf("List of 10 keys in pages of 3 took %d range requests, want at least 4", n)
	}
	var got []string
	for _, kv := range kvs {
		got = append(got, kv.Key)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("List = %v, want %v", got, want)
	}

	before = ranges()
	got = nil
	for ev := range c.Watch(ctx, "state/p/") {
		if ev.Kind == EventListed {
			break
		}
		got = append(got, ev.Key)
	}
	if n := ranges() - before; n < 4 {
		t.Fatalf("the watch's listing of 10 keys in pages of 3 took %d range requests, want at least 4", n)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("watch listed %v, want %v", got, want)
	}
}

// TestBackoffJitter: the waits grow from 100ms to 10s, each drawn between
// half its step and the whole, spread over that range.
func TestBackoffJitter(t *testing.T) {
	b := newBackoff()
	step := backoffMin
	for range 10 {
		if w := b.Wait(); w < step/2 || w > step {
			t.Fatalf("step %v: wait %v, want from %v to %v", step, w, step/2, step)
		}
		step = min(2*step, backoffMax)
	}

	const draws = 1000
	var waits []time.Duration
	for range draws {
		b.Reset()
		waits = append(waits, b.Wait())
	}
	slices.Sort(waits)
	if waits[0] < backoffMin/2 || waits[draws-1] > backoffMin {
		t.Fatalf("first waits from %v to %v, want within [%v, %v]", waits[0], waits[draws-1], backoffMin/2, backoffMin)
	}
	// Spread: the middle half of the agents' first retries covers at
	// least a fifth of the range, not one instant.
	if spread := waits[draws*3/4] - waits[draws/4]; spread < backoffMin/10 {
		t.Fatalf("first waits' middle half within %v, want spread over at least %v", spread, backoffMin/10)
	}
}
