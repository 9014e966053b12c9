package endpointmanager_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/health"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/pkg/nettest"
)

// setPhase rewrites an endpoint's state file as if the agent had died
// before it finished creating it.
func setPhase(t *testing.T, stateDir string, id uint16, phase string) {
	t.Helper()
	path := filepath.Join(stateDir, "endpoints", strconv.Itoa(int(id)), "endpoint.json")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var f map[string]any
	if err := json.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	f["phase"] = phase
	data, _ = json.Marshal(f)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// A restart restores every endpoint from its state file, with the same ID
// and addresses, without touching the kernel state of intact ones; it
// repairs an endpoint whose veth pair was removed, removes one whose netns
// is gone, undoes one whose creation did not finish, and new endpoints get
// none of the restored addresses.
func TestRestore(t *testing.T) {
	tn := newTestNet(t)
	first := tn.start(t, nodeOpts{})
	intact, repaired, nsGone, unfinished := newPod(t), newPod(t), newPod(t), newPod(t)
	epIntact := first.create(t, intact)
	epRepaired := first.create(t, repaired)
	epGone := first.create(t, nsGone)
	epUnfinished := first.create(t, unfinished)
	first.stop()

	// While the agent is down: a veth pair is removed, a pod goes away, and
	// the state file of another says its creation had not finished.
	if _, err := netlink.LinkByName(epRepaired.HostIfName); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkDel(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: epRepaired.HostIfName}}); err != nil {
		t.Fatal(err)
	}
	nsGone.ns.Close()
	if err := testutils.UnmountNS(nsGone.ns); err != nil {
		t.Fatal(err)
	}
	setPhase(t, first.stateDir, epUnfinished.ID, "creating")

	second := tn.start(t, nodeOpts{})
	second.waitRestored(t)

	got, found := second.mgr.Lookup(endpointmanager.Selector{ContainerID: intact.id})
	if !found {
		t.Fatal("intact endpoint not restored")
	}
	if got.ID != epIntact.ID || got.IPv4 != epIntact.IPv4 || got.IPv6 != epIntact.IPv6 || got.Netns != epIntact.Netns ||
		got.IfName != epIntact.IfName || got.MAC.String() != epIntact.MAC.String() || got.HostMAC.String() != epIntact.HostMAC.String() ||
		got.HostIfIndex != epIntact.HostIfIndex || got.PodName != epIntact.PodName || !got.Created.Equal(epIntact.Created) ||
		got.State != endpointmanager.Ready {
		t.Fatalf("restored endpoint\n got %+v\nwant %+v", got, epIntact)
	}
	// Its new host side is routed once the datapath has it
	// (TestRestoreRemadeVethWaitsForLive), after the restore.
	celltest.Eventually(t, "the endpoint whose veth pair was removed ready", func() (bool, string) {
		got, found = second.mgr.Lookup(endpointmanager.Selector{ContainerID: repaired.id})
		if !found {
			return false, "not in the table"
		}
		return got.State != endpointmanager.Starting, fmt.Sprintf("state %v", got.State)
	})
	if !found || got.IPv4 != epRepaired.IPv4 || got.State != endpointmanager.Ready || got.HostIfIndex == epRepaired.HostIfIndex {
		t.Fatalf("endpoint whose veth pair was removed: %+v, %v; want it restored with a new veth pair", got, found)
	}
	for _, p := range []pod{intact, repaired} {
		if _, problems, err := second.mgr.Check(context.Background(), endpointmanager.Selector{ContainerID: p.id}); err != nil || len(problems) > 0 {
			t.Errorf("check of restored %s: %v, %v", p.id, problems, err)
		}
		if err := nettest.Ping(p.ns.Path(), router(tn.v4), 5*time.Second); err != nil {
			t.Errorf("restored pod to its router: %v", err)
		}
	}

	for _, tc := range []struct {
		ep  *endpointmanager.Endpoint
		log string
	}{
		{epGone, "Removed an endpoint whose network namespace is gone"},
		{epUnfinished, "Rolled back an endpoint whose creation did not finish before the agent stopped"},
	} {
		if _, found := second.mgr.Lookup(endpointmanager.Selector{ID: tc.ep.ID}); found {
			t.Errorf("endpoint %d restored, want it removed", tc.ep.ID)
		}
		if _, err := netlink.LinkByName(tc.ep.HostIfName); err == nil {
			t.Errorf("host link %s of removed endpoint %d still exists", tc.ep.HostIfName, tc.ep.ID)
		}
		if second.logs.Find(tc.log, "container", tc.ep.ContainerID) == nil {
			t.Errorf("no log line %q for %s", tc.log, tc.ep.ContainerID)
		}
	}
	if dirs, want := second.stateDirs(), []string{strconv.Itoa(int(epIntact.ID)), strconv.Itoa(int(epRepaired.ID))}; !slices.Equal(dirs, want) {
		t.Errorf("state directories after the restore = %v, want %v", dirs, want)
	}
	second.waitAllocations(t,
		epIntact.IPv4.String()+" "+intact.id+" in-use", epIntact.IPv6.String()+" "+intact.id+" in-use",
		epRepaired.IPv4.String()+" "+repaired.id+" in-use", epRepaired.IPv6.String()+" "+repaired.id+" in-use")

	// The state file follows the repaired endpoint's new veth pair.
	var file struct{ HostIfIndex int }
	data, err := os.ReadFile(filepath.Join(second.stateDir, "endpoints", strconv.Itoa(int(epRepaired.ID)), "endpoint.json"))
	if err != nil || json.Unmarshal(data, &file) != nil || file.HostIfIndex != got.HostIfIndex {
		t.Errorf("state file of the repaired endpoint: %s, %v; want hostIfIndex %d", data, err, got.HostIfIndex)
	}

	fresh := second.create(t, newPod(t))
	for _, ip := range []string{epIntact.IPv4.String(), epRepaired.IPv4.String()} {
		if fresh.IPv4.String() == ip {
			t.Errorf("a new endpoint got %s, which a restored endpoint holds", ip)
		}
	}
}

// The state files a crash can leave: a directory without a file, a
// temporary file, a truncated file, a file that contradicts its directory.
// None stops the restore; each is cleaned up or moved aside with a log
// line naming the file and the error.
func TestRestoreDamagedStateFiles(t *testing.T) {
	tn := newTestNet(t)
	dir := filepath.Join(tn.dir, "state", "endpoints")
	write := func(name, content string) string {
		path := filepath.Join(dir, name)
		os.MkdirAll(filepath.Dir(path), 0o700)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	valid := func(id int, netns string) string {
		f := map[string]any{
			"version": 1, "phase": "ready", "id": id, "containerID": "c" + strconv.Itoa(id), "netns": netns,
			"ifName": "eth0", "ipv4": nth(tn.v4, id).String(), "hostIfName": endpointmanager.HostIfName("c" + strconv.Itoa(id)),
			"created": time.Now(),
		}
		data, _ := json.Marshal(f)
		return string(data)
	}
	os.MkdirAll(filepath.Join(dir, "5"), 0o700) // created, the file never written
	write("6/endpoint.json", valid(6, "/nonexistent/netns"))
	temp := write("6/endpoint.json.tmp", valid(6, "/nonexistent/netns")[:20])
	truncated := write("7/endpoint.json", valid(7, "/nonexistent/netns")[:40])
	mismatched := write("8/endpoint.json", valid(9, "/nonexistent/netns"))
	stray := write("README", "not an endpoint")

	n := tn.start(t, nodeOpts{})
	n.waitRestored(t)
	if ids := n.endpointIDs(); len(ids) != 0 {
		t.Fatalf("restored %v from damaged state, want nothing", ids)
	}
	if dirs := n.stateDirs(); len(dirs) != 0 {
		t.Errorf("endpoint state after the restore = %v, want none", dirs)
	}
	if _, err := os.Stat(temp); !os.IsNotExist(err) {
		t.Errorf("temporary file after the restore: %v", err)
	}
	for _, tc := range []struct{ file, err string }{
		{truncated, "unexpected EOF"},
		{mismatched, `id 9 does not match its directory "8"`},
		{stray, "not an endpoint directory"},
	} {
		line := n.logs.Find("Invalid endpoint state file, moved aside; the endpoint is not restored", "file", tc.file)
		if line == nil || !strings.Contains(line["error"], tc.err) {
			t.Errorf("log line for %s = %v, want one with error %q", tc.file, line, tc.err)
		}
	}
	invalid, _ := os.ReadDir(filepath.Join(tn.dir, "state", "endpoints-invalid"))
	if len(invalid) != 3 {
		t.Errorf("endpoints-invalid holds %d entries, want 3", len(invalid))
	}
	if n.logs.Find("Removed an endpoint whose network namespace is gone", "container", "c6") == nil {
		t.Error("the endpoint whose netns does not exist was not removed")
	}
	n.waitAllocations(t)
}

// A pod whose state file is lost while the agent is down keeps its
// addresses: its veth pair still exists and the IPAM still knows them
// under its container ID, so the restore claims them for it instead of
// letting the leak grace release them to the next ADD. Health names the
// moved file and the container; a CNI DEL of the container cleans it up.
func TestRestoreKeepsAddressesOfPodWithLostState(t *testing.T) {
	tn := newTestNet(t)
	first := tn.start(t, nodeOpts{})
	p := newPod(t)
	ep := first.create(t, p)
	first.stop()

	path := filepath.Join(first.stateDir, "endpoints", strconv.Itoa(int(ep.ID)), "endpoint.json")
	if err := os.Truncate(path, 10); err != nil {
		t.Fatal(err)
	}

	// A grace so short that a release, if any, would come at once.
	second := tn.start(t, nodeOpts{grace: time.Millisecond})
	second.waitRestored(t)
	second.waitAllocations(t, ep.IPv4.String()+" "+p.id+" in-use", ep.IPv6.String()+" "+p.id+" in-use")

	row := second.waitHealth(t, "endpoint-manager.state", func(s *health.Status) bool { return s != nil && s.Level == cell.StatusDegraded })
	for _, want := range []string{path, "unexpected EOF", p.id, ep.HostIfName, ep.IPv4.String()} {
		if !strings.Contains(row.Error, want) {
			t.Errorf("health endpoint-manager.state error %q does not name %q", row.Error, want)
		}
	}

	other := second.create(t, newPod(t))
	if other.IPv4 == ep.IPv4 || other.IPv6 == ep.IPv6 {
		t.Fatalf("a new pod got %s/%s, which the pod with the lost state still uses", other.IPv4, other.IPv6)
	}
	if err := nettest.Ping(p.ns.Path(), router(tn.v4), 5*time.Second); err != nil {
		t.Errorf("the pod with the lost state lost its connectivity: %v", err)
	}

	del, err := second.mgr.Delete(context.Background(), endpointmanager.Selector{ContainerID: p.id})
	if err != nil {
		t.Fatalf("DEL of the pod with the lost state: %v", err)
	}
	if !slices.Contains(del.Released, ep.IPv4) || !slices.Contains(del.Released, ep.IPv6) {
		t.Errorf("DEL released %v, want %s and %s", del.Released, ep.IPv4, ep.IPv6)
	}
	if _, err := netlink.LinkByName(ep.HostIfName); err == nil {
		t.Errorf("host link %s still exists after the DEL", ep.HostIfName)
	}
	// The moved file stays reported; the container no longer is.
	row = second.waitHealth(t, "endpoint-manager.state", func(s *health.Status) bool { return s != nil && !strings.Contains(s.Error, p.id) })
	if !strings.Contains(row.Error, path) {
		t.Errorf("health after the DEL = %q, want the moved file %s still named", row.Error, path)
	}
	second.waitAllocations(t, other.IPv4.String()+" "+other.ContainerID+" in-use", other.IPv6.String()+" "+other.ContainerID+" in-use")
}

// An endpoint.json that is a directory or a FIFO is moved aside like a
// corrupt file: the restore finishes (it neither retries for ever nor
// waits for a writer), and health names both.
func TestRestoreStateEntryNotARegularFile(t *testing.T) {
	tn := newTestNet(t)
	dir := filepath.Join(tn.dir, "state", "endpoints")
	asDir := filepath.Join(dir, "5", "endpoint.json")
	if err := os.MkdirAll(asDir, 0o700); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "6", "endpoint.json")
	os.MkdirAll(filepath.Dir(fifo), 0o700)
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	n := tn.start(t, nodeOpts{})
	// Runs before the node stops: releases a restore blocked on the FIFO
	// (before the fix), wherever the FIFO is by then.
	t.Cleanup(func() {
		for _, p := range append([]string{fifo}, globAll(filepath.Join(tn.dir, "state", "endpoints-invalid", "*", "endpoint.json"))...) {
			if fd, err := unix.Open(p, unix.O_RDWR|unix.O_NONBLOCK, 0); err == nil {
				unix.Close(fd)
			}
		}
	})
	n.waitRestored(t)
	for _, tc := range []struct{ file, err string }{
		{asDir, "is a directory"},
		{fifo, "is a named pipe (FIFO)"},
	} {
		line := n.logs.Find("Invalid endpoint state file, moved aside; the endpoint is not restored", "file", tc.file)
		if line == nil || !strings.Contains(line["error"], tc.err) {
			t.Errorf("log line for %s = %v, want one with error %q", tc.file, line, tc.err)
		}
	}
	if dirs := n.stateDirs(); len(dirs) != 0 {
		t.Errorf("endpoint state after the restore = %v, want none", dirs)
	}
	row := n.waitHealth(t, "endpoint-manager.state", func(s *health.Status) bool { return s != nil && s.Level == cell.StatusDegraded })
	if !strings.Contains(row.Error, asDir) || !strings.Contains(row.Error, fifo) {
		t.Errorf("health endpoint-manager.state = %q, want both moved files named", row.Error)
	}
}

func globAll(pattern string) []string {
	out, _ := filepath.Glob(pattern)
	return out
}

// A restart with other pod CIDRs restores the endpoints the pods still
// use, but warns about their addresses outside every pool and shows them
// in health until they are deleted.
func TestRestoreWithOtherPodCIDRsReportsEndpointsOutsidePools(t *testing.T) {
	tn := newTestNet(t)
	first := tn.start(t, nodeOpts{})
	p := newPod(t)
	ep := first.create(t, p)
	first.stop()

	other := newTestNet(t)
	second := tn.start(t, nodeOpts{cidrs: []string{other.v4.String(), other.v6.String()}})
	second.waitRestored(t)
	if _, found := second.mgr.Lookup(endpointmanager.Selector{ID: ep.ID}); !found {
		t.Fatal("the endpoint was not restored")
	}
	if second.logs.Find("Restored an endpoint with addresses outside every pod pool; were the pod CIDRs changed?", "container", p.id) == nil {
		t.Error("no warning for the endpoint outside the pools")
	}
	row := second.waitHealth(t, "endpoint-manager.state", func(s *health.Status) bool { return s != nil && s.Level == cell.StatusDegraded })
	for _, want := range []string{p.id, ep.IPv4.String(), ep.IPv6.String(), "outside every pod pool (" + other.v4.String()} {
		if !strings.Contains(row.Error, want) {
			t.Errorf("health endpoint-manager.state error %q does not name %q", row.Error, want)
		}
	}
	if _, err := second.mgr.Delete(context.Background(), endpointmanager.Selector{ID: ep.ID}); err != nil {
		t.Fatal(err)
	}
	second.waitHealth(t, "endpoint-manager.state", func(s *health.Status) bool { return s == nil })
}

// A pod with lost state that goes away without a DEL (its netns, and with
// it its veth pair, removed) has its addresses released: nothing else would
// release them.
func TestOrphanGoneWithoutDeleteIsReleased(t *testing.T) {
	tn := newTestNet(t)
	first := tn.start(t, nodeOpts{})
	p := newPod(t)
	ep := first.create(t, p)
	first.stop()
	path := filepath.Join(first.stateDir, "endpoints", strconv.Itoa(int(ep.ID)), "endpoint.json")
	if err := os.WriteFile(path, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	second := tn.start(t, nodeOpts{})
	second.waitRestored(t)
	second.waitAllocations(t, ep.IPv4.String()+" "+p.id+" in-use", ep.IPv6.String()+" "+p.id+" in-use")

	p.ns.Close()
	if err := testutils.UnmountNS(p.ns); err != nil {
		t.Fatal(err)
	}
	second.waitAllocations(t)
	// The job logs the release after the addresses go and reports health
	// after that: once health has changed, the line is there.
	row := second.waitHealth(t, "endpoint-manager.state", func(s *health.Status) bool { return s != nil && !strings.Contains(s.Error, p.id) })
	if !strings.Contains(row.Error, path) {
		t.Errorf("health after the release = %q, want the moved file still named", row.Error)
	}
	if second.logs.Find("Released the addresses of a container without state whose interface is gone", "container", p.id) == nil {
		t.Error("no log line for the release")
	}
}
