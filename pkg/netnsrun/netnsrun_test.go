package netnsrun_test

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/pkg/netnsrun"
	"github.com/cellium/cellium/pkg/nettest"
)

// In runs in the namespace, and the thread it ran on, if it lives on, is
// back in the namespace it came from.
func TestInAndBack(t *testing.T) {
	n := nettest.NewNS(t)
	host, err := netns.GetFromPath("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()

	var tid int
	links, err := netnsrun.In(n.Path(), func() ([]netlink.Link, error) {
		tid = unix.Gettid()
		return netlink.LinkList()
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(links) != 1 || links[0].Attrs().Name != "lo" {
		t.Fatalf("links in the new namespace = %d, want lo alone", len(links))
	}
	thread, err := netns.GetFromPath(fmt.Sprintf("/proc/self/task/%d/ns/net", tid))
	if errors.Is(err, os.ErrNotExist) {
		return // the thread ended: it runs nothing in the wrong namespace
	}
	if err != nil {
		t.Fatal(err)
	}
	defer thread.Close()
	if !thread.Equal(host) {
		t.Fatalf("thread %d stayed in the namespace In ran in", tid)
	}
}

// Create makes a namespace with lo up at a path, Exists sees it, and
// Remove takes it away; bad paths are errors naming the path.
func TestCreateRemove(t *testing.T) {
	nettest.RequireRoot(t)
	path := filepath.Join(t.TempDir(), "sub", "ns")
	if netnsrun.Exists(path) {
		t.Fatal("Exists before Create")
	}
	if err := netnsrun.Create(path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netnsrun.Remove(path) })
	if !netnsrun.Exists(path) {
		t.Fatal("not a namespace after Create")
	}
	up, err := netnsrun.In(path, func() (bool, error) {
		lo, err := netlink.LinkByName("lo")
		return err == nil && lo.Attrs().Flags&net.FlagUp != 0, err
	})
	if err != nil || !up {
		t.Fatalf("lo up in the new namespace = %v, %v", up, err)
	}
	if err := netnsrun.Create(path); err == nil {
		t.Fatal("Create over an existing namespace: no error")
	}
	if err := netnsrun.Remove(path); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("after Remove: stat %s = %v", path, err)
	}
	if err := netnsrun.Remove(path); err != nil {
		t.Fatalf("Remove of a path that is not there: %v", err)
	}

	plain := filepath.Join(t.TempDir(), "plain")
	if err := os.WriteFile(plain, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	if netnsrun.Exists(plain) {
		t.Fatal("a plain file Exists")
	}
	for _, p := range []string{plain, "/nonexistent"} {
		err := netnsrun.Do(p, func() error { t.Error("ran in", p); return nil })
		if err == nil {
			t.Fatalf("Do in %s: no error", p)
		}
		if !strings.Contains(err.Error(), p) {
			t.Fatalf("Do in %s: error %q does not name the path", p, err)
		}
	}
}
