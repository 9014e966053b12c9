package ipam_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cellium/cellium/cells/ipam"
)

// TestHeldReleases: with releases held (the conntrack GC's HoldReleases),
// an address its owner releases stays in the table as releasing, goes to
// no allocation (the search skips it, an explicit request is refused, a
// full pool is exhausted), cannot be released again or by hand, has no
// file any more, and is free once FinishReleases frees it.
func TestHeldReleases(t *testing.T) {
	dir := t.TempDir()
	a := run(t, dir, runOpts{podCIDR: []string{"10.244.0.0/29"}})
	a.ipam.HoldReleases("test")
	// The pool has 5 addresses for pods (.2-.6): take them all.
	var ips []string
	for _, owner := range []string{"c1", "c2", "c3", "c4", "c5"} {
		ips = append(ips, a.allocate(t, owner).String())
	}
	released, err := a.ipam.ReleaseOwner("c3")
	if err != nil || len(released) != 1 || released[0].String() != ips[2] {
		t.Fatalf("release c3: %v, %v; want [%s]", released, err, ips[2])
	}
	held := released[0]
	a.waitRows(t, ips[0]+" c1 in-use", ips[1]+" c2 in-use", ips[2]+" c3 releasing", ips[3]+" c4 in-use", ips[4]+" c5 in-use")
	if _, err := os.Stat(filepath.Join(dir, "state", "ipam", held.String()+".json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the held address's file: %v, want it removed", err)
	}
	if got, _ := a.ipam.Releasing(); !slices.Equal(got, released) {
		t.Errorf("Releasing() = %v, want %v", got, released)
	}

	ctx := context.Background()
	if _, err := a.ipam.Allocate(ctx, ipam.Request{Owner: "c6", Family: ipam.IPv4}); !errors.Is(err, ipam.ErrExhausted) {
		t.Errorf("allocation with only a held address left: %v, want exhausted", err)
	}
	if _, err := a.ipam.Allocate(ctx, ipam.Request{Owner: "c6", IP: held}); !errors.Is(err, ipam.ErrInUse) {
		t.Errorf("explicit allocation of the held address: %v, want in use", err)
	}
	if again, err := a.ipam.ReleaseOwner("c3"); err != nil || len(again) != 0 {
		t.Errorf("second release of c3: %v, %v; want nothing", again, err)
	}
	if ok, err := a.ipam.Release(held, "c3"); ok || err != nil {
		t.Errorf("Release of the held address: %v, %v; want not released, no error", ok, err)
	}
	if err := a.ipam.Claim(held, "c3"); !errors.Is(err, ipam.ErrInUse) {
		t.Errorf("claim of the held address: %v, want in use", err)
	}

	a.ipam.FinishReleases(released)
	if got, _ := a.ipam.Releasing(); len(got) != 0 {
		t.Errorf("Releasing() after FinishReleases = %v, want none", got)
	}
	if got, err := a.ipam.Allocate(ctx, ipam.Request{Owner: "c6", Family: ipam.IPv4}); err != nil || got.IP != held {
		t.Errorf("allocation after FinishReleases: %+v, %v; want %s", got, err, held)
	}
}
