package ipam_test

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
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
	"github.com/cellium/cellium/cells/internal/logtest"
	"github.com/cellium/cellium/cells/ipam"
)

// agent is one run of the ipam cell over a state directory.
type agent struct {
	ipam *ipam.IPAM
	db   *statedb.DB
	tbl  statedb.Table[*ipam.Allocation]
	// health is the health table.
	health statedb.Table[*health.Status]
	logs   *logtest.Recorder
	// restoreDone completes the "test-restore" restorer, when asked for.
	restoreDone func()
	stop        func()
}

type runOpts struct {
	podCIDR  []string
	grace    time.Duration
	restorer bool
}

// run starts the ipam cell over stateDir; the returned agent's stop also
// runs when the test ends.
func run(t *testing.T, stateDir string, o runOpts) *agent {
	t.Helper()
	a := &agent{logs: logtest.NewRecorder(hivetest.Logger(t).Handler())}
	cells := []cell.Cell{daemon.Cell, ipam.Cell, cell.Invoke(func(i *ipam.IPAM, db *statedb.DB, tbl statedb.Table[*ipam.Allocation], hs statedb.Table[*health.Status]) {
		a.ipam, a.db, a.tbl, a.health = i, db, tbl, hs
	})}
	if o.restorer {
		cells = append(cells, cell.Module("test-restorer", "Test restorer",
			cell.Invoke(func(i *ipam.IPAM) { a.restoreDone = i.RegisterRestorer("test-restore") })))
	}
	h := celltest.New(cells...)
	hive.AddConfigOverride(h, func(c *daemon.Config) { c.StateDir, c.RunDir = stateDir, filepath.Join(stateDir, "run") })
	hive.AddConfigOverride(h, func(c *ipam.Config) {
		c.PodCIDR = o.podCIDR
		if c.PodCIDR == nil {
			c.PodCIDR = []string{"10.244.0.0/29"}
		}
		c.IPAMLeakGrace = o.grace
	})
	log := slog.New(a.logs)
	if err := h.Start(log, context.Background()); err != nil {
		t.Fatalf("start: %v", err)
	}
	var once sync.Once
	a.stop = func() {
		once.Do(func() {
			if err := h.Stop(log, context.Background()); err != nil {
				t.Errorf("stop: %v", err)
			}
		})
	}
	t.Cleanup(a.stop)
	return a
}

func (a *agent) allocate(t *testing.T, owner string) netip.Addr {
	t.Helper()
	alloc, err := a.ipam.Allocate(context.Background(), ipam.Request{Owner: owner, Family: ipam.IPv4})
	if err != nil {
		t.Fatalf("allocate for %s: %v", owner, err)
	}
	return alloc.IP
}

// rows is the table as "ip owner state" lines, router rows left out.
func (a *agent) rows() []string {
	var out []string
	for r := range a.tbl.All(a.db.ReadTxn()) {
		if r.State != ipam.Router {
			out = append(out, r.IP.String()+" "+r.Owner+" "+string(r.State))
		}
	}
	return out
}

// waitRows waits, on the table's watch channel, until rows() is want.
func (a *agent) waitRows(t *testing.T, want ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		_, watch := a.tbl.AllWatch(a.db.ReadTxn())
		if got := a.rows(); slices.Equal(got, want) {
			return
		}
		select {
		case <-watch:
		case <-ctx.Done():
			t.Fatalf("ipam table is %q, want %q", a.rows(), want)
		}
	}
}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

// An allocation issued while a restore runs must not get an address the
// restore is about to claim. The restorer is slow, paced by the test: the
// allocation either waits for it or, with a context that ends, fails and
// names what it waits for. Without the barrier it would get 10.244.0.2,
// the first free address.
func TestAllocationRacingTheRestore(t *testing.T) {
	a := run(t, t.TempDir(), runOpts{restorer: true})

	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := a.ipam.Allocate(cancelled, ipam.Request{Owner: "new-pod", Family: ipam.IPv4})
	if !errors.Is(err, ipam.ErrNotReady) || !strings.Contains(err.Error(), "waiting for test-restore") {
		t.Fatalf("allocation during the restore = %v, want ErrNotReady naming test-restore", err)
	}

	result := make(chan netip.Addr, 1)
	go func() {
		alloc, err := a.ipam.Allocate(context.Background(), ipam.Request{Owner: "new-pod", Family: ipam.IPv4})
		if err != nil {
			t.Error(err)
		}
		result <- alloc.IP
	}()
	for _, ip := range []string{"10.244.0.2", "10.244.0.3"} {
		if err := a.ipam.Claim(mustAddr(ip), "restored-pod-"+ip); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case ip := <-result:
		t.Fatalf("allocation returned %s before the restorer was done", ip)
	default:
	}
	a.restoreDone()
	if got := <-result; got != mustAddr("10.244.0.4") {
		t.Fatalf("allocation racing the restore got %s, want 10.244.0.4, the first address no restored pod holds", got)
	}
}

// Allocations are on disk before Allocate returns: a new run finds them,
// in-use ones unclaimed until a restorer claims them, reserved ones as they
// were.
func TestAllocationsSurviveRestart(t *testing.T) {
	dir := t.TempDir()
	first := run(t, dir, runOpts{grace: time.Hour})
	podA := first.allocate(t, "pod-a")
	podB := first.allocate(t, "pod-b")
	if _, err := first.ipam.Allocate(context.Background(), ipam.Request{Owner: "ops", IP: mustAddr("10.244.0.6"), Reserved: true}); err != nil {
		t.Fatal(err)
	}
	first.stop()

	second := run(t, dir, runOpts{grace: time.Hour, restorer: true})
	second.waitRows(t, podA.String()+" pod-a unclaimed", podB.String()+" pod-b unclaimed", "10.244.0.6 ops reserved")
	if err := second.ipam.Claim(podA, "pod-a"); err != nil {
		t.Fatal(err)
	}
	if err := second.ipam.Claim(podB, "pod-x"); !errors.Is(err, ipam.ErrInUse) {
		t.Fatalf("claim of pod-b's address by pod-x = %v, want ErrInUse", err)
	}
	second.restoreDone()
	next := second.allocate(t, "pod-c")
	if next == podA || next == podB {
		t.Fatalf("new allocation got %s, an address held before the restart", next)
	}
	second.waitRows(t, podA.String()+" pod-a in-use", podB.String()+" pod-b unclaimed", next.String()+" pod-c in-use", "10.244.0.6 ops reserved")
}

// An address allocated before a crash for an owner that never became an
// endpoint is released once the grace period after the restore is over,
// with a log line; claimed ones stay. The grace period starts when the
// restore is done, not at start.
func TestUnclaimedReleasedAfterGrace(t *testing.T) {
	dir := t.TempDir()
	first := run(t, dir, runOpts{})
	kept := first.allocate(t, "pod-kept")
	leaked := first.allocate(t, "pod-died-in-add")
	first.stop()

	second := run(t, dir, runOpts{grace: 20 * time.Millisecond, restorer: true})
	if err := second.ipam.Claim(kept, "pod-kept"); err != nil {
		t.Fatal(err)
	}
	// However long the restore takes, nothing is released before it ends.
	if ok, _ := second.tbl.Initialized(second.db.ReadTxn()); ok {
		t.Fatal("ipam table initialized before the restorer was done")
	}
	if got := second.rows(); !slices.Contains(got, leaked.String()+" pod-died-in-add unclaimed") {
		t.Fatalf("rows during the restore = %q, want the unclaimed address kept", got)
	}
	second.restoreDone()
	second.waitRows(t, kept.String()+" pod-kept in-use")

	if _, err := os.Stat(filepath.Join(dir, "ipam", leaked.String()+".json")); !os.IsNotExist(err) {
		t.Fatalf("state file of the released address: %v, want it removed", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "ipam", kept.String()+".json")); err != nil {
		t.Fatalf("state file of the claimed address: %v", err)
	}
	line := second.logs.Find("Released an address allocated before the restart for an owner that never became an endpoint")
	if line == nil || line["ip"] != leaked.String() || line["owner"] != "pod-died-in-add" {
		t.Fatalf("no log line releasing %s for pod-died-in-add: %v", leaked, line)
	}

	// A third run has nothing left to release.
	second.stop()
	third := run(t, dir, runOpts{restorer: true})
	third.waitRows(t, kept.String()+" pod-kept unclaimed")
}

// Files on disk that cannot be used do not stop the agent: temporary files
// of interrupted writes are removed, unreadable ones are moved aside with a
// log line naming the file and the error, the rest is loaded.
func TestCorruptStateFiles(t *testing.T) {
	dir := t.TempDir()
	ipamDir := filepath.Join(dir, "ipam")
	if err := os.MkdirAll(ipamDir, 0o700); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"10.244.0.2.json":     `{"ip":"10.244.0.2","owner":"pod-a","state":"in-use","since":"2026-01-02T03:04:05Z"}`,
		"10.244.0.3.json":     `{"ip":"10.244.0.3","owner":"pod-b","sta`,
		"10.244.0.4.json":     `{"ip":"10.244.0.5","owner":"pod-c","state":"in-use"}`,
		"10.244.0.6.json.tmp": `{"ip":"10.244.0.6"`,
		"10.244.0.1.json":     `{"ip":"10.244.0.1","owner":"pod-d","state":"in-use"}`,
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(ipamDir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// Entries that are not regular files: never opened, moved aside.
	if err := os.Mkdir(filepath.Join(ipamDir, "10.244.0.7.json"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(ipamDir, "10.244.0.8.json"), 0o600); err != nil {
		t.Fatal(err)
	}
	a := run(t, dir, runOpts{restorer: true})
	a.waitRows(t, "10.244.0.2 pod-a unclaimed")

	for _, tc := range []struct{ file, errText string }{
		{"10.244.0.3.json", "unexpected EOF"},
		{"10.244.0.4.json", "file name does not match its ip 10.244.0.5"},
		{"10.244.0.7.json", "not an allocation file"},
		{"10.244.0.8.json", "not an allocation file"},
	} {
		line := a.logs.Find("Invalid IPAM state file, moved aside; its address is not reserved", "file", filepath.Join(ipamDir, tc.file))
		if line == nil || !strings.Contains(line["error"], tc.errText) {
			t.Errorf("log line for %s = %v, want one with error %q", tc.file, line, tc.errText)
		}
	}
	if a.logs.Find("An allocation on disk holds the router address of a pool; dropping it", "ip", "10.244.0.1") == nil {
		t.Error("no log line dropping the allocation that held the router address")
	}
	remaining, _ := filepath.Glob(filepath.Join(ipamDir, "*"))
	if want := []string{filepath.Join(ipamDir, "10.244.0.2.json")}; !slices.Equal(remaining, want) {
		t.Errorf("ipam state after the restore = %v, want %v", remaining, want)
	}
	invalid, _ := filepath.Glob(filepath.Join(dir, "ipam-invalid", "*"))
	if len(invalid) != 4 {
		t.Errorf("ipam-invalid holds %v, want the four unreadable files", invalid)
	}
	// agent status shows them: a Degraded health row naming each.
	row, _, found := a.health.Get(a.db.ReadTxn(), health.StatusID.Query("ipam.state"))
	if !found || row.Level != cell.StatusDegraded {
		t.Fatalf("health ipam.state = %+v, want Degraded", row)
	}
	for _, f := range []string{"10.244.0.3.json", "10.244.0.4.json", "10.244.0.7.json", "10.244.0.8.json"} {
		if !strings.Contains(row.Error, filepath.Join(ipamDir, f)+" moved to ") {
			t.Errorf("health ipam.state error %q does not name %s", row.Error, f)
		}
	}
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  func(*ipam.Config)
		want string
	}{
		{"not a CIDR", func(c *ipam.Config) { c.PodCIDR = []string{"10.244.0.0"} }, `invalid --pod-cidr "10.244.0.0": want a CIDR such as 10.244.0.0/24`},
		{"host bits", func(c *ipam.Config) { c.PodCIDR = []string{"10.244.0.5/24"} }, `invalid --pod-cidr "10.244.0.5/24": host bits are set; the network is 10.244.0.0/24`},
		{"too small", func(c *ipam.Config) { c.PodCIDR = []string{"10.244.0.0/31"} }, `too small for a router and a pod; the longest prefix is /30`},
		{"two of a family", func(c *ipam.Config) { c.PodCIDR = []string{"10.244.0.0/24", "10.245.0.0/24"} }, `more than one ipv4 CIDR`},
		{"none", func(c *ipam.Config) { c.PodCIDR = nil }, `invalid --pod-cidr: no pod CIDR; want one or two`},
		{"mode", func(c *ipam.Config) { c.IPAM = "dhcp" }, `invalid --ipam "dhcp": want static or kubernetes`},
		{"grace", func(c *ipam.Config) { c.IPAMLeakGrace = -time.Second }, `invalid --ipam-leak-grace -1s: must not be negative`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := celltest.New(daemon.Cell, ipam.Cell)
			hive.AddConfigOverride(h, func(c *daemon.Config) { c.StateDir, c.RunDir = t.TempDir(), t.TempDir() })
			hive.AddConfigOverride(h, tc.cfg)
			err := h.Populate(hivetest.Logger(t))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("populate = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestPoolRanges(t *testing.T) {
	for _, tc := range []struct {
		cidr        string
		router      string
		size        uint64
		in, outside []string
	}{
		{"10.244.0.0/24", "10.244.0.1", 254, []string{"10.244.0.1", "10.244.0.254"}, []string{"10.244.0.0", "10.244.0.255", "10.244.1.1"}},
		{"10.244.0.0/30", "10.244.0.1", 2, []string{"10.244.0.2"}, []string{"10.244.0.3"}},
		{"fd00:10:244::/120", "fd00:10:244::1", 255, []string{"fd00:10:244::ff"}, []string{"fd00:10:244::", "fd00:10:244::100"}},
		{"fd00::/64", "fd00::1", 1<<64 - 1, []string{"fd00::ffff:ffff:ffff:ffff"}, []string{"fd00::"}},
	} {
		p, err := ipam.ParsePool("test", tc.cidr)
		if err != nil {
			t.Fatal(err)
		}
		if p.Router != mustAddr(tc.router) || p.Size() != tc.size {
			t.Errorf("%s: router %s size %d, want %s and %d", tc.cidr, p.Router, p.Size(), tc.router, tc.size)
		}
		for _, ip := range tc.in {
			if !p.Contains(mustAddr(ip)) {
				t.Errorf("%s does not contain %s", tc.cidr, ip)
			}
		}
		for _, ip := range tc.outside {
			if p.Contains(mustAddr(ip)) {
				t.Errorf("%s contains %s", tc.cidr, ip)
			}
		}
	}
}

// Allocations for many owners at once (the file of each is written outside
// the table's lock) get distinct addresses, each on disk when Allocate
// returns: a new run finds every one.
func TestParallelAllocationsDistinctAndPersisted(t *testing.T) {
	dir := t.TempDir()
	first := run(t, dir, runOpts{podCIDR: []string{"10.244.0.0/24"}, grace: time.Hour})
	const owners = 50
	ips := make([]netip.Addr, owners)
	var wg sync.WaitGroup
	for i := range owners {
		wg.Go(func() {
			alloc, err := first.ipam.Allocate(context.Background(), ipam.Request{Owner: "pod-" + strconv.Itoa(i), Family: ipam.IPv4})
			if err != nil {
				t.Error(err)
				return
			}
			ips[i] = alloc.IP
			if _, err := os.Stat(filepath.Join(dir, "ipam", alloc.IP.String()+".json")); err != nil {
				t.Errorf("allocation %s of pod-%d returned before its file was written: %v", alloc.IP, i, err)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	seen := map[netip.Addr]int{}
	var want []string
	for i, ip := range ips {
		if j, dup := seen[ip]; dup {
			t.Fatalf("pod-%d and pod-%d both got %s", j, i, ip)
		}
		seen[ip] = i
		want = append(want, ip.String()+" pod-"+strconv.Itoa(i)+" unclaimed")
	}
	first.stop()
	slices.SortFunc(want, func(a, b string) int {
		return mustAddr(strings.Fields(a)[0]).Compare(mustAddr(strings.Fields(b)[0]))
	})
	second := run(t, dir, runOpts{podCIDR: []string{"10.244.0.0/24"}, grace: time.Hour, restorer: true})
	second.waitRows(t, want...)
}

// An allocation whose file cannot be written fails, naming the file, and
// leaves the address free for the next one.
func TestAllocationWriteFailureLeavesAddressFree(t *testing.T) {
	dir := t.TempDir()
	a := run(t, dir, runOpts{})
	// A directory where the allocation's file goes: the rename over it fails.
	first := mustAddr("10.244.0.2")
	if err := os.MkdirAll(filepath.Join(dir, "ipam", first.String()+".json", "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := a.ipam.Allocate(context.Background(), ipam.Request{Owner: "pod-a", Family: ipam.IPv4})
	if err == nil || !strings.Contains(err.Error(), first.String()+".json") {
		t.Fatalf("allocation with its file blocked = %v, want an error naming %s.json", err, first)
	}
	a.waitRows(t)
	if err := os.RemoveAll(filepath.Join(dir, "ipam", first.String()+".json")); err != nil {
		t.Fatal(err)
	}
	if _, err := a.ipam.Allocate(context.Background(), ipam.Request{Owner: "pod-b", IP: first}); err != nil {
		t.Fatalf("allocation of %s, which the failed one left free: %v", first, err)
	}
	a.waitRows(t, first.String()+" pod-b in-use")
}
