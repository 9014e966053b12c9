package endpointmanager_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/ipam"
	"github.com/cellium/cellium/pkg/apiv1"
)

// stateDirs are the endpoint directories on disk.
func (n *node) stateDirs() []string {
	entries, _ := os.ReadDir(filepath.Join(n.stateDir, "endpoints"))
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// unchanged checks that a failed creation left nothing: the allocations
// and state directories are what they were, and there is no host link for
// the container.
func (n *node) unchanged(t *testing.T, containerID string, allocations, dirs []string) {
	t.Helper()
	if got := n.allocations(); !slices.Equal(got, allocations) {
		t.Errorf("allocations after a failed creation = %q, want %q", got, allocations)
	}
	if got := n.stateDirs(); !slices.Equal(got, dirs) {
		t.Errorf("state directories after a failed creation = %q, want %q", got, dirs)
	}
	if _, err := netlink.LinkByName(endpointmanager.HostIfName(containerID)); err == nil {
		t.Errorf("host link %s exists after a failed creation", endpointmanager.HostIfName(containerID))
	}
}

// Bad input is refused with an error naming it, and changes nothing.
func TestCreateBadInput(t *testing.T) {
	tn := newTestNet(t)
	n := tn.start(t, nodeOpts{})
	existing := newPod(t)
	ep := n.create(t, existing)
	allocations, dirs := n.allocations(), n.stateDirs()

	notANamespace := filepath.Join(t.TempDir(), "netns")
	os.WriteFile(notANamespace, nil, 0o600)
	p := newPod(t)
	withNetns := func(path string) endpointmanager.CreateRequest { r := p.req(); r.Netns = path; return r }
	withIfName := func(name string) endpointmanager.CreateRequest { r := p.req(); r.IfName = name; return r }
	withID := func(id string) endpointmanager.CreateRequest { r := p.req(); r.ContainerID = id; return r }

	for _, tc := range []struct {
		name string
		req  endpointmanager.CreateRequest
		kind error
		want string
	}{
		{"container ID", withID("-starts-with-dash"), endpointmanager.ErrInvalid, `invalid container ID "-starts-with-dash"`},
		{"relative netns", withNetns("netns/x"), endpointmanager.ErrInvalid, `invalid netns "netns/x": want the absolute path`},
		{"missing netns", withNetns("/nonexistent/netns"), endpointmanager.ErrInvalid, "netns /nonexistent/netns does not exist"},
		{"not a namespace", withNetns(notANamespace), endpointmanager.ErrInvalid, "is not a namespace (nothing is mounted there)"},
		{"host netns", withNetns("/proc/self/ns/net"), endpointmanager.ErrInvalid, "netns /proc/self/ns/net is the host's network namespace"},
		{"mount namespace", withNetns("/proc/self/ns/mnt"), endpointmanager.ErrInvalid, "is a namespace but not a network namespace"},
		{"interface name", withIfName("an-interface-name-too-long"), endpointmanager.ErrInvalid, `invalid interface name "an-interface-name-too-long"`},
		{"interface name with CR", withIfName("eth\r0"), endpointmanager.ErrInvalid, `invalid interface name "eth\r0"`},
		{"interface name with VT", withIfName("eth\v0"), endpointmanager.ErrInvalid, `invalid interface name "eth\v0"`},
		{"interface name with FF", withIfName("eth\f0"), endpointmanager.ErrInvalid, `invalid interface name "eth\f0"`},
		{"existing container", existing.req(), endpointmanager.ErrExists, "already has endpoint 1 (interface eth0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := n.mgr.Create(context.Background(), tc.req)
			if !errors.Is(err, tc.kind) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("create = %v, want %v containing %q", err, tc.kind, tc.want)
			}
			if tc.req.ContainerID != existing.id {
				n.unchanged(t, tc.req.ContainerID, allocations, dirs)
			}
		})
	}
	if _, problems, err := n.mgr.Check(context.Background(), endpointmanager.Selector{ID: ep.ID}); err != nil || len(problems) > 0 {
		t.Fatalf("the existing endpoint after a second ADD for it: %v, %v", problems, err)
	}
}

// A creation that fails half way (the pod already has an interface of that
// name) is undone: no link, no state, no address.
func TestCreateFailureIsUndone(t *testing.T) {
	tn := newTestNet(t)
	n := tn.start(t, nodeOpts{})
	p := newPod(t)
	err := p.ns.Do(func(ns.NetNS) error {
		return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "eth0-peer"})
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = n.mgr.Create(context.Background(), p.req())
	if err == nil || !strings.Contains(err.Error(), "interface eth0 already exists in netns "+p.ns.Path()) {
		t.Fatalf("create into a pod that has an eth0 = %v, want an error naming it", err)
	}
	n.unchanged(t, p.id, nil, nil)
}

// An ADD of a container whose earlier ADD the agent did not finish finds
// that ADD's veth pair in its way (the host side's name is the
// container's), and its addresses: the creation removes the one and
// releases the others, says so in one log line with both, and makes its
// own.
func TestCreateReplacesLeftoverVeth(t *testing.T) {
	tn := newTestNet(t)
	n := tn.start(t, nodeOpts{})
	p := newPod(t)
	leftover := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: endpointmanager.HostIfName(p.id)}, PeerName: "eth0", PeerNamespace: netlink.NsFd(p.ns.Fd())}
	if err := netlink.LinkAdd(leftover); err != nil {
		t.Fatal(err)
	}
	a, err := n.ipam.Allocate(context.Background(), ipam.Request{Owner: p.id, Family: ipam.IPv4})
	if err != nil {
		t.Fatal(err)
	}
	old, err := netlink.LinkByName(endpointmanager.HostIfName(p.id))
	if err != nil {
		t.Fatal(err)
	}
	ep, err := n.mgr.Create(context.Background(), p.req())
	if err != nil {
		t.Fatalf("create over a leftover veth pair: %v", err)
	}
	if ep.HostIfIndex == old.Attrs().Index {
		t.Fatalf("the endpoint's host side is the leftover (ifindex %d)", ep.HostIfIndex)
	}
	if _, problems, err := n.mgr.Check(context.Background(), endpointmanager.Selector{ID: ep.ID}); err != nil || len(problems) > 0 {
		t.Fatalf("the endpoint made over a leftover: %v, %v", problems, err)
	}
	const msg = "Removed what an unfinished endpoint creation left"
	if line := n.logs.Find(msg, "container", p.id, "removed-interface", "false"); line != nil {
		t.Fatalf("leftovers logged as if no veth pair was removed: %v", line)
	}
	line := n.logs.Find(msg, "container", p.id, "removed-interface", "true")
	if line == nil || !strings.Contains(line["released"], a.IP.String()) {
		t.Fatalf("leftovers' log line = %v, want removed-interface=true and released %s", line, a.IP)
	}
}

// The ready state file is written while the datapath takes the new
// endpoint in: a write that fails fails the ADD, and it is undone, however
// far the rest got.
//
// So is one whose creating state file, written before anything touches the
// kernel, cannot be written. Either way nothing is left: no row (whose
// endpoint map entry would point at a released address, and which would
// answer a retried ADD that it exists), no link, no state, no address; and
// the retried ADD succeeds.
func TestCreateStateWriteFailureIsUndone(t *testing.T) {
	tn := newTestNet(t)
	n := tn.start(t, nodeOpts{})
	for _, ph := range []string{"creating", "ready"} {
		p := newPod(t) // of the test: a subtest's name has a slash
		t.Run(ph, func(t *testing.T) {
			n.mgr.FailStateWrites(ph, errors.New("disk full"))
			_, err := n.mgr.Create(context.Background(), p.req())
			if err == nil || !strings.Contains(err.Error(), "disk full") {
				t.Fatalf("create whose %s state file cannot be written = %v, want its error", ph, err)
			}
			n.unchanged(t, p.id, nil, nil)
			if ep, found := n.mgr.Lookup(endpointmanager.Selector{ContainerID: p.id}); found {
				t.Fatalf("endpoint %d (%s) is in the table after its creation failed", ep.ID, ep.State)
			}
			if ids := n.endpointIDs(); len(ids) > 0 {
				t.Fatalf("endpoints table after a failed creation = %v, want none", ids)
			}

			n.mgr.FailStateWrites(ph, nil)
			ep := n.create(t, p)
			if ep.State != endpointmanager.Ready {
				t.Fatalf("the retried ADD's endpoint is %s, want %s", ep.State, endpointmanager.Ready)
			}
			if _, err := n.mgr.Delete(context.Background(), endpointmanager.Selector{ID: ep.ID}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A DEL that failed half way leaves the endpoint deleting: what would
// mark it otherwise meanwhile (a restored endpoint's routing that failed
// marks it not ready, after it let go of the container's lock) leaves it
// so.
func TestDeletingIsNotMarkedOver(t *testing.T) {
	tn := newTestNet(t)
	n := tn.start(t, nodeOpts{})
	p := newPod(t)
	ep := n.create(t, p)
	n.mgr.FailStateWrites("deleting", errors.New("disk full"))
	if _, err := n.mgr.Delete(context.Background(), endpointmanager.Selector{ID: ep.ID}); err == nil {
		t.Fatal("delete whose deleting state file cannot be written succeeded")
	}
	if err := n.mgr.MarkRoutingFailed(ep, errors.New("route: no such device")); err == nil {
		t.Fatal("a deleting endpoint was marked not ready")
	}
	cur, found := n.mgr.Lookup(endpointmanager.Selector{ID: ep.ID})
	if !found || cur.State != endpointmanager.Deleting || !strings.Contains(cur.Error, "disk full") {
		t.Fatalf("endpoint after a half-failed DEL and a failed routing = %+v, want deleting with the DEL's error", cur)
	}
	n.mgr.FailStateWrites("deleting", nil)
	if _, err := n.mgr.Delete(context.Background(), endpointmanager.Selector{ID: ep.ID}); err != nil {
		t.Fatalf("retried delete: %v", err)
	}
}

// An exhausted pool is a clear error and leaves nothing behind; the
// address of a deleted endpoint can then be used again.
func TestCreateExhaustedPool(t *testing.T) {
	tn := newTestNet(t)
	// A /30: the router and one pod.
	small := tn.v4.Addr().String() + "/30"
	n := tn.start(t, nodeOpts{cidrs: []string{small}})
	first := newPod(t)
	ep := n.create(t, first)
	allocations, dirs := n.allocations(), n.stateDirs()

	second := newPod(t)
	_, err := n.mgr.Create(context.Background(), second.req())
	if !errors.Is(err, ipam.ErrExhausted) || !strings.Contains(err.Error(), "ipv4 pool "+small+" is exhausted") {
		t.Fatalf("create in an exhausted pool = %v, want ErrExhausted naming the pool", err)
	}
	n.unchanged(t, second.id, allocations, dirs)

	if _, err := n.mgr.Delete(context.Background(), endpointmanager.Selector{ID: ep.ID}); err != nil {
		t.Fatal(err)
	}
	if again := n.create(t, second); again.IPv4 != ep.IPv4 {
		t.Fatalf("after the delete the pool's one address is %s, want %s", again.IPv4, ep.IPv4)
	}
}

// A CNI_NETNS that is a named pipe, a directory or a socket is refused at
// once with an error naming it, and holds back no other ADD or DEL: the
// path is checked before it is opened, opened without blocking, and not
// under the manager's lock.
func TestCreateNetnsNotARegularFileDoesNotBlock(t *testing.T) {
	tn := newTestNet(t)
	n := tn.start(t, nodeOpts{})
	n.waitRestored(t)
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	// Unblocks an open that waits for a writer, should one (before the
	// fix) have been made.
	t.Cleanup(func() {
		if fd, err := unix.Open(fifo, unix.O_RDWR|unix.O_NONBLOCK, 0); err == nil {
			unix.Close(fd)
		}
	})
	sock := filepath.Join(dir, "sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	for _, tc := range []struct{ path, want string }{
		{fifo, "netns " + fifo + " is a named pipe (FIFO), not a network namespace"},
		{dir, "netns " + dir + " is a directory, not a network namespace"},
		{sock, "netns " + sock + " is a socket, not a network namespace"},
	} {
		p := newPod(t)
		req := p.req()
		req.Netns = tc.path
		done := make(chan error, 1)
		go func() {
			_, err := n.mgr.Create(context.Background(), req)
			done <- err
		}()
		select {
		case err := <-done:
			if !errors.Is(err, endpointmanager.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("ADD with netns %s = %v, want ErrInvalid containing %q", tc.path, err, tc.want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("ADD with netns %s did not return within 10s", tc.path)
		}
		n.unchanged(t, p.id, nil, nil)
	}

	// The next ADD and DEL are served.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p := newPod(t)
	ep, err := n.mgr.Create(ctx, p.req())
	if err != nil {
		t.Fatalf("ADD after the bad ones: %v", err)
	}
	if _, err := n.mgr.Delete(ctx, endpointmanager.Selector{ID: ep.ID}); err != nil {
		t.Fatalf("DEL after the bad ones: %v", err)
	}
}

// A reservation made by hand whose owner is a container's ID survives the
// ADD and the DEL of that container: only DELETE /v1/ipam/{ip} releases it.
func TestReservationOutlivesEndpointOfSameOwner(t *testing.T) {
	tn := newTestNet(t)
	n := tn.start(t, nodeOpts{})
	n.waitRestored(t)
	p := newPod(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	reserved := nth(tn.v4, 7).String()
	if _, err := n.client.ReserveIP(ctx, apiv1.IPAMReserve{IP: reserved, Owner: p.id}); err != nil {
		t.Fatal(err)
	}
	want := reserved + " " + p.id + " reserved"
	ep := n.create(t, p)
	if ep.IPv4.String() == reserved {
		t.Fatalf("the endpoint got the reserved address %s", reserved)
	}
	if !slices.Contains(n.allocations(), want) {
		t.Fatalf("allocations after the ADD = %q, want %q kept", n.allocations(), want)
	}
	del, err := n.mgr.Delete(ctx, endpointmanager.Selector{ContainerID: p.id})
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(del.Released, mustAddr(reserved)) {
		t.Errorf("the DEL released the reserved %s", reserved)
	}
	if got := n.allocations(); !slices.Equal(got, []string{want}) {
		t.Fatalf("allocations after the DEL = %q, want only %q", got, want)
	}
	if _, err := n.client.ReleaseIP(ctx, reserved); err != nil {
		t.Fatalf("release by hand: %v", err)
	}
	if got := n.allocations(); len(got) != 0 {
		t.Fatalf("allocations after the release by hand = %q, want none", got)
	}
}

// A DEL that fails half way leaves the endpoint listed as deleting, with
// the error, not ready; a retried DEL finishes it.
func TestDeleteFailingHalfWayIsListedDeleting(t *testing.T) {
	tn := newTestNet(t)
	n := tn.start(t, nodeOpts{})
	p := newPod(t)
	ep := n.create(t, p)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// Releasing the addresses fails: their state directory is gone.
	ipamDir := filepath.Join(n.stateDir, "ipam")
	if err := os.Rename(ipamDir, ipamDir+".away"); err != nil {
		t.Fatal(err)
	}
	_, err := n.mgr.Delete(ctx, endpointmanager.Selector{ContainerID: p.id})
	if err == nil {
		t.Fatal("DEL with the IPAM state directory gone succeeded")
	}
	got, found := n.mgr.Lookup(endpointmanager.Selector{ContainerID: p.id})
	if !found || got.State != endpointmanager.Deleting || got.Error != err.Error() {
		t.Fatalf("endpoint after a failed DEL = %+v (found %v), want state deleting with error %q", got, found, err)
	}
	list, lerr := n.client.Endpoints(ctx)
	if lerr != nil || len(list) != 1 || list[0].State != apiv1.EndpointDeleting || list[0].Error != err.Error() {
		t.Fatalf("GET /v1/endpoints after a failed DEL = %+v, %v; want the endpoint deleting with the error", list, lerr)
	}

	if err := os.Rename(ipamDir+".away", ipamDir); err != nil {
		t.Fatal(err)
	}
	del, err := n.mgr.Delete(ctx, endpointmanager.Selector{ContainerID: p.id})
	if err != nil {
		t.Fatalf("retried DEL: %v", err)
	}
	if !slices.Contains(del.Released, ep.IPv4) {
		t.Errorf("retried DEL released %v, want %s among them", del.Released, ep.IPv4)
	}
	if _, found := n.mgr.Lookup(endpointmanager.Selector{ContainerID: p.id}); found {
		t.Error("endpoint still listed after the retried DEL")
	}
	n.unchanged(t, p.id, nil, nil)
}

// A restart after a DEL that did not finish (the state file says
// "deleting") finishes it instead of bringing the endpoint back.
func TestRestoreFinishesUnfinishedDelete(t *testing.T) {
	tn := newTestNet(t)
	first := tn.start(t, nodeOpts{})
	p := newPod(t)
	ep := first.create(t, p)
	first.stop()
	setPhase(t, first.stateDir, ep.ID, "deleting")

	second := tn.start(t, nodeOpts{})
	second.waitRestored(t)
	if _, found := second.mgr.Lookup(endpointmanager.Selector{ID: ep.ID}); found {
		t.Fatal("an endpoint whose DEL did not finish was restored")
	}
	if second.logs.Find("Finished deleting an endpoint whose DEL did not finish before the agent stopped", "container", p.id) == nil {
		t.Error("no log line for the finished deletion")
	}
	second.unchanged(t, p.id, nil, nil)
}

// hungPath is a path whose lookup blocks in the kernel: it is on a FUSE
// mount whose server never answers. Closing the server's end (at cleanup)
// aborts the connection and releases whoever waits.
func hungPath(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	hang(t, dir)
	return filepath.Join(dir, "netns")
}

// hang mounts, on the directory dir, a FUSE filesystem whose server never
// answers: whatever looks at dir or below it blocks in the kernel until
// release (which cleanup also calls) unmounts it, lazily, and aborts the
// connection: what waited fails, and dir is a plain directory again.
func hang(t *testing.T, dir string) (release func()) {
	t.Helper()
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Skipf("no FUSE to make a path that hangs: %v", err)
	}
	opts := fmt.Sprintf("fd=%d,rootmode=40000,user_id=0,group_id=0", fd)
	if err := unix.Mount("cellium-test", dir, "fuse", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		unix.Close(fd)
		t.Skipf("cannot mount FUSE to make a path that hangs: %v", err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			unix.Unmount(dir, unix.MNT_DETACH)
			unix.Close(fd)
		})
	}
	t.Cleanup(release)
	return release
}

// A CNI_NETNS whose lookup hangs (a filesystem that does not answer) fails
// its ADD after the open's bound with an error naming the path; other ADDs
// and DELs are served meanwhile.
func TestCreateNetnsThatHangsFailsAlone(t *testing.T) {
	tn := newTestNet(t)
	n := tn.start(t, nodeOpts{})
	n.waitRestored(t)
	path := hungPath(t)

	p := newPod(t)
	req := p.req()
	req.Netns = path
	done := make(chan error, 1)
	go func() {
		_, err := n.mgr.Create(context.Background(), req)
		done <- err
	}()

	// While that ADD waits on the path, another is served.
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	other := newPod(t)
	ep, err := n.mgr.Create(ctx, other.req())
	if err != nil {
		t.Fatalf("ADD while another waits on a hung netns path: %v", err)
	}
	if _, err := n.mgr.Delete(ctx, endpointmanager.Selector{ID: ep.ID}); err != nil {
		t.Fatalf("DEL while an ADD waits on a hung netns path: %v", err)
	}

	select {
	case err := <-done:
		want := "netns " + path + " did not open within 5s"
		if !errors.Is(err, endpointmanager.ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Fatalf("ADD with a hung netns path = %v, want ErrInvalid containing %q", err, want)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("ADD with a hung netns path did not return within 30s")
	}
	n.unchanged(t, p.id, nil, nil)
}
