package netnsrun_test

import (
	"runtime"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/cellium/cellium/pkg/netnsrun"
	"github.com/cellium/cellium/pkg/nettest"
)

// In runs in the namespace and comes back to the caller's.
func TestInAndBack(t *testing.T) {
	ns := nettest.NewNS(t)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	before, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer before.Close()

	links, err := netnsrun.In(ns.Path(), func() ([]netlink.Link, error) { return netlink.LinkList() })
	if err != nil {
		t.Fatal(err)
	}
	if len(links) != 1 || links[0].Attrs().Name != "lo" {
		t.Fatalf("links in the new namespace = %d, want lo alone", len(links))
	}
	after, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer after.Close()
	if !after.Equal(before) {
		t.Fatal("the thread did not come back to its namespace")
	}
	if err := netnsrun.Do("/nonexistent", func() error { return nil }); err == nil {
		t.Fatal("Do in a namespace that does not exist: no error")
	}
}
