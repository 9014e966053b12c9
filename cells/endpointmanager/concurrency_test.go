package endpointmanager_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cellium/cellium/cells/endpointmanager"
)

// Creations of many containers at once all succeed, with distinct
// endpoint IDs (the lowest free ones), addresses and host interfaces, and
// each is on disk: a restart restores every one as it was.
func TestParallelCreatesDistinctAndPersisted(t *testing.T) {
	tn := newTestNet(t)
	n := tn.start(t, nodeOpts{})
	n.waitRestored(t)
	const pods = 20
	ps := make([]pod, pods)
	for i := range ps {
		ps[i] = newPod(t)
		ps[i].id = fmt.Sprintf("%s-%d", ps[i].id, i)
	}
	eps := make([]*endpointmanager.Endpoint, pods)
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Go(func() {
			ep, err := n.mgr.Create(context.Background(), p.req())
			if err != nil {
				t.Errorf("create endpoint of %s: %v", p.id, err)
				return
			}
			eps[i] = ep
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	seen := map[string]string{}
	for i, ep := range eps {
		for _, k := range []string{"endpoint ID " + strconv.Itoa(int(ep.ID)), ep.IPv4.String(), ep.IPv6.String(), ep.HostIfName} {
			if other, dup := seen[k]; dup {
				t.Errorf("%s given to both %s and %s", k, other, ps[i].id)
			}
			seen[k] = ps[i].id
		}
	}
	var wantIDs []uint16
	for id := range uint16(pods) {
		wantIDs = append(wantIDs, id+1)
	}
	if got := n.endpointIDs(); !slices.Equal(got, wantIDs) {
		t.Fatalf("endpoint IDs = %v, want %v", got, wantIDs)
	}

	n.stop()
	second := tn.start(t, nodeOpts{})
	second.waitRestored(t)
	for i, ep := range eps {
		got, found := second.mgr.Lookup(endpointmanager.Selector{ContainerID: ps[i].id})
		if !found || got.ID != ep.ID || got.IPv4 != ep.IPv4 || got.IPv6 != ep.IPv6 || got.State != endpointmanager.Ready {
			t.Errorf("after a restart, endpoint of %s = %+v (found %v), want endpoint %d with %s and %s, ready",
				ps[i].id, got, found, ep.ID, ep.IPv4, ep.IPv6)
		}
	}
}

// One container's creation that is stuck (here its state directory is on a
// filesystem that does not answer) holds back only that container: ADDs
// and DELs of other containers are served meanwhile, while a DEL of the
// same container waits behind the ADD (and gives up at its deadline,
// naming the container), and once the ADD has finished it deletes what the
// ADD made: nothing is left.
func TestStuckCreateHoldsBackOnlyItsContainer(t *testing.T) {
	tn := newTestNet(t)
	n := tn.start(t, nodeOpts{})
	n.waitRestored(t)
	// The first endpoint gets ID 1: its state directory hangs.
	dir := filepath.Join(n.stateDir, "endpoints", "1")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	release := hang(t, dir)

	stuck := newPod(t)
	addErr := make(chan error, 1)
	go func() {
		_, err := n.mgr.Create(context.Background(), stuck.req())
		addErr <- err
	}()
	// Its addresses are allocated with its container's lock held; then it
	// writes its state file, and hangs.
	n.waitOwner(t, stuck.id)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	other := newPod(t)
	ep, err := n.mgr.Create(ctx, other.req())
	if err != nil {
		t.Fatalf("ADD of another container while one is stuck: %v", err)
	}
	if ep.ID == 1 {
		t.Fatalf("ADD of another container got endpoint ID 1, the stuck creation's")
	}
	if _, err := n.mgr.Delete(ctx, endpointmanager.Selector{ContainerID: other.id}); err != nil {
		t.Fatalf("DEL of another container while one is stuck: %v", err)
	}

	short, cancelShort := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancelShort()
	_, err = n.mgr.Delete(short, endpointmanager.Selector{ContainerID: stuck.id})
	if !errors.Is(err, endpointmanager.ErrBusy) || !strings.Contains(err.Error(), "container "+stuck.id) {
		t.Fatalf("DEL of the stuck container with a short deadline = %v, want ErrBusy naming the container", err)
	}
	type deleted struct {
		deleted *endpointmanager.Deleted
		err     error
	}
	delErr := make(chan deleted, 1)
	go func() {
		d, err := n.mgr.Delete(context.Background(), endpointmanager.Selector{ContainerID: stuck.id})
		delErr <- deleted{d, err}
	}()
	select {
	case err := <-addErr:
		t.Fatalf("the stuck ADD returned (%v) before its state directory answered", err)
	default:
	}

	// The state directory answers (it is a plain directory again): the
	// ADD finishes, then the DEL that waited removes its endpoint. That
	// the DEL deleted the endpoint the ADD made shows it ran after the
	// ADD, with the lock; the order in which the two calls return is not
	// the lock's (the ADD still reads its row after unlocking), so it is
	// not checked.
	release()
	var added *endpointmanager.Endpoint
	select {
	case err := <-addErr:
		if err != nil {
			t.Fatalf("ADD once its state directory answered: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("the stuck ADD did not return once its state directory answered")
	}
	select {
	case d := <-delErr:
		if d.err != nil || d.deleted.Endpoint == nil || d.deleted.Endpoint.ID != 1 {
			t.Fatalf("DEL after the ADD = %+v, %v, want endpoint 1 deleted", d.deleted, d.err)
		}
		added = d.deleted.Endpoint
	case <-ctx.Done():
		t.Fatal("the DEL waiting behind the stuck ADD did not return")
	}
	if added.ContainerID != stuck.id {
		t.Fatalf("DEL deleted the endpoint of %s, want %s", added.ContainerID, stuck.id)
	}
	n.unchanged(t, stuck.id, nil, nil)
}

// waitOwner waits, on the ipam table's watch channel, until owner has an
// address.
func (n *node) waitOwner(t *testing.T, owner string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		rows, watch := n.ipamTbl.AllWatch(n.db.ReadTxn())
		for a := range rows {
			if a.Owner == owner {
				return
			}
		}
		select {
		case <-watch:
		case <-ctx.Done():
			t.Fatalf("no address allocated to %s; allocations are %q", owner, n.allocations())
		}
	}
}
