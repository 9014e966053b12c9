package loader_test

import (
	"context"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"

	"github.com/cellium/cellium/bpf"
	"github.com/cellium/cellium/cells/bpfmaps"
	"github.com/cellium/cellium/cells/bpfmaps/bpfmapstest"
	"github.com/cellium/cellium/cells/health"
	"github.com/cellium/cellium/cells/lbmaps"
	"github.com/cellium/cellium/cells/loader/socklbtest"
	"github.com/cellium/cellium/pkg/lbmap"
)

func TestMain(m *testing.M) { socklbtest.Main(m) }

var (
	frontend = netip.MustParseAddrPort("10.96.0.10:80")
	backend  = netip.MustParseAddrPort("127.0.0.2:8080")
	connect  = socklbtest.Call{Op: socklbtest.TCP, To: frontend}
)

// programs are the names of the programs, which name their link pins.
var programs = func() []string {
	spec, err := bpf.LoadSockLB()
	if err != nil {
		panic(err)
	}
	return slices.Sorted(maps.Keys(spec.Programs))
}()

func start(t *testing.T, h *hive.Hive) (stop func()) {
	t.Helper()
	return startLogging(t, h, hivetest.Logger(t))
}

// startLogging is start with the hive logging to log.
func startLogging(t *testing.T, h *hive.Hive, log *slog.Logger) (stop func()) {
	t.Helper()
	if err := h.Start(log, context.Background()); err != nil {
		t.Fatalf("start hive: %v", err)
	}
	stopped := false
	stop = func() {
		t.Helper()
		if !stopped {
			stopped = true
			if err := h.Stop(log, context.Background()); err != nil {
				t.Errorf("stop hive: %v", err)
			}
		}
	}
	t.Cleanup(stop)
	return stop
}

// putService sends frontend to backend.
func putService(t *testing.T, m *lbmaps.Maps) {
	t.Helper()
	for _, err := range []error{
		m.Backends4.Put(1, lbmap.NewBackend4(backend.Addr(), backend.Port(), lbmap.TCP)),
		m.Services4.Put(lbmap.NewService4Key(frontend.Addr(), frontend.Port(), lbmap.TCP, 1), lbmap.NewServiceSlot(1, 1)),
		m.Services4.Put(lbmap.NewService4Key(frontend.Addr(), frontend.Port(), lbmap.TCP, 0), lbmap.NewServiceMaster(1, 1, 0, 0)),
		m.RevNAT4.Put(1, lbmap.NewRevNAT4(frontend.Addr(), frontend.Port())),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
}

func wantTranslated(t *testing.T, env *socklbtest.Env, when string) {
	t.Helper()
	if r := env.Run(connect)[0]; r.Backend != backend.String() || r.Peer != frontend {
		t.Fatalf("%s: %v; want backend %s, peer %s", when, r, backend, frontend)
	}
}

func wantUntouched(t *testing.T, env *socklbtest.Env, when string) {
	t.Helper()
	if r := env.Run(connect)[0]; r.Errno != "ENETUNREACH" {
		t.Fatalf("%s: %v; want the connect left alone, failing with ENETUNREACH in the test netns", when, r)
	}
}

// pinnedLink is what a link pin holds.
type pinnedLink struct {
	id      link.ID
	program ebpf.ProgramID
	cgroup  uint64
}

// pinnedLinks reads every link pinned in the loader's directory.
func pinnedLinks(t *testing.T, root string) map[string]pinnedLink {
	t.Helper()
	dir := filepath.Join(root, "cellium", "links")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]pinnedLink{}
	for _, e := range entries {
		l, err := link.LoadPinnedLink(filepath.Join(dir, e.Name()), nil)
		if err != nil {
			t.Fatalf("pin %s: %v", e.Name(), err)
		}
		info, err := l.Info()
		l.Close()
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = pinnedLink{id: info.ID, program: info.Program, cgroup: info.Cgroup().CgroupId}
	}
	return out
}

// attached lists the programs attached to the cgroup at dir, per attach
// type of the socket programs.
func attached(t *testing.T, dir string) map[ebpf.AttachType][]ebpf.ProgramID {
	t.Helper()
	cg, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Close()
	out := map[ebpf.AttachType][]ebpf.ProgramID{}
	for _, at := range []ebpf.AttachType{
		ebpf.AttachCGroupInet4Connect, ebpf.AttachCGroupInet6Connect,
		ebpf.AttachCGroupUDP4Sendmsg, ebpf.AttachCGroupUDP6Sendmsg,
		ebpf.AttachCGroupUDP4Recvmsg, ebpf.AttachCGroupUDP6Recvmsg,
		ebpf.AttachCgroupInet4GetPeername, ebpf.AttachCgroupInet6GetPeername,
	} {
		res, err := link.QueryPrograms(link.QueryOptions{Target: int(cg.Fd()), Attach: at})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range res.Programs {
			out[at] = append(out[at], p.ID)
		}
	}
	return out
}

func linkPrograms(links map[string]pinnedLink) []ebpf.ProgramID {
	var ids []ebpf.ProgramID
	for _, l := range links {
		ids = append(ids, l.program)
	}
	slices.Sort(ids)
	return ids
}

func attachedPrograms(byType map[ebpf.AttachType][]ebpf.ProgramID) []ebpf.ProgramID {
	var ids []ebpf.ProgramID
	for _, p := range byType {
		ids = append(ids, p...)
	}
	slices.Sort(ids)
	return ids
}

// loaderHealth is the loader module's row of the health table.
func loaderHealth(t *testing.T, db *statedb.DB, tbl statedb.Table[*health.Status]) *health.Status {
	t.Helper()
	s, _, ok := tbl.Get(db.ReadTxn(), health.StatusID.Query("loader"))
	if !ok {
		t.Fatal("no health row for the loader")
	}
	return s
}

// agentCleanup runs what `agent cleanup` runs, on a graph built for the
// same flags, and returns its report.
func agentCleanup(t *testing.T, env *socklbtest.Env, root string) (string, *bpfmaps.Cleaner) {
	t.Helper()
	var (
		cleaner *bpfmaps.Cleaner
		lb      *lbmaps.Maps
	)
	h := env.Datapath(root, &lb, cell.Invoke(func(c *bpfmaps.Cleaner) { cleaner = c }))
	if err := h.Populate(hivetest.Logger(t)); err != nil {
		t.Fatal(err)
	}
	removed, err := cleaner.Remove()
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(removed, "\n"), cleaner
}

// TestAttachRestartCleanup follows the links through an agent's life:
// attached at start, kept while the agent is down, updated in place by the
// next run, gone after `agent cleanup`.
func TestAttachRestartCleanup(t *testing.T) {
	env := socklbtest.New(t)
	root := bpfmapstest.Root(t)
	env.ServeTCP(backend)

	var (
		m   *lbmaps.Maps
		db  *statedb.DB
		tbl statedb.Table[*health.Status]
	)
	grabHealth := cell.Invoke(func(d *statedb.DB, t statedb.Table[*health.Status]) { db, tbl = d, t })
	stop := start(t, env.Datapath(root, &m, grabHealth))
	putService(t, m)
	wantTranslated(t, env, "after the first start")

	first := pinnedLinks(t, root)
	if names := slices.Sorted(maps.Keys(first)); !slices.Equal(names, programs) {
		t.Fatalf("pinned links %v, want one per program %v", names, programs)
	}
	// Exactly the pinned links' programs are attached, one per hook.
	byType := attached(t, env.Cgroup)
	for at, ids := range byType {
		if len(ids) != 1 {
			t.Fatalf("%s: programs %v attached, want one", at, ids)
		}
	}
	if got, want := attachedPrograms(byType), linkPrograms(first); !slices.Equal(got, want) {
		t.Fatalf("programs attached to the cgroup %v, want the pinned links' %v", got, want)
	}
	if s := loaderHealth(t, db, tbl); s.Level != cell.StatusOK || !strings.Contains(s.Message, "8 socket load-balancing programs attached to cgroup "+env.Cgroup) {
		t.Fatalf("loader health %s %q, want OK naming the programs and the cgroup", s.Level, s.Message)
	}

	// The agent is down: the pinned links and maps keep balancing.
	stop()
	wantTranslated(t, env, "with the agent stopped")

	// The next run updates the same links to its own programs.
	stop = start(t, env.Datapath(root, &m))
	second := pinnedLinks(t, root)
	for name, l := range second {
		was := first[name]
		if l.id != was.id {
			t.Errorf("link %s: ID %d after restart, want the pinned link %d updated in place", name, l.id, was.id)
		}
		if l.program == was.program {
			t.Errorf("link %s still runs program %d after restart, want the new run's program", name, l.program)
		}
	}
	if got, want := attachedPrograms(attached(t, env.Cgroup)), linkPrograms(second); !slices.Equal(got, want) {
		t.Fatalf("programs attached after restart %v, want the new ones %v", got, want)
	}
	wantTranslated(t, env, "after the restart")
	stop()

	text, cleaner := agentCleanup(t, env, root)
	for _, want := range append(slices.Clone(programs), "removed link directory", "removed map", bpf.SockLBMapCelliumLb4Services, "removed pin directory") {
		if !strings.Contains(text, want) {
			t.Errorf("cleanup report does not mention %q:\n%s", want, text)
		}
	}
	if _, err := os.Stat(cleaner.PinDir()); !os.IsNotExist(err) {
		t.Fatalf("pin directory after cleanup: %v", err)
	}
	if got := attachedPrograms(attached(t, env.Cgroup)); len(got) != 0 {
		t.Fatalf("programs %v still attached after cleanup", got)
	}
	wantUntouched(t, env, "after cleanup")

	if again, err := cleaner.Remove(); err != nil || len(again) != 0 {
		t.Fatalf("second cleanup removed %q, %v; want nothing", again, err)
	}
}

// A pin that cannot be updated in place is replaced, and pins of programs
// that no longer exist are detached and removed.
func TestReplaceUnusablePins(t *testing.T) {
	env := socklbtest.New(t)
	root := bpfmapstest.Root(t)
	env.ServeTCP(backend)
	var m *lbmaps.Maps
	stop := start(t, env.Datapath(root, &m))
	putService(t, m)
	stop()
	first := pinnedLinks(t, root)

	dir := filepath.Join(root, "cellium", "links")
	// A program an older agent had: its link under a name no program has.
	if err := os.Rename(filepath.Join(dir, bpf.SockLBProgLb4Sendmsg), filepath.Join(dir, "lb4_retired")); err != nil {
		t.Fatal(err)
	}
	// Something that is no link where a link should be. Removing the pin
	// detaches the link: nothing else holds it.
	connectPin := filepath.Join(dir, bpf.SockLBProgLb4Connect)
	if err := os.Remove(connectPin); err != nil {
		t.Fatal(err)
	}
	junk, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer junk.Close()
	if err := junk.Pin(connectPin); err != nil {
		t.Fatal(err)
	}

	start(t, env.Datapath(root, &m))
	second := pinnedLinks(t, root)
	if names := slices.Sorted(maps.Keys(second)); !slices.Equal(names, programs) {
		t.Fatalf("pinned links %v, want one per program %v (the retired one removed)", names, programs)
	}
	if second[bpf.SockLBProgLb4Connect].id == first[bpf.SockLBProgLb4Connect].id {
		t.Fatal("connect4 link not replaced")
	}
	if second[bpf.SockLBProgLb6Connect].id != first[bpf.SockLBProgLb6Connect].id {
		t.Fatal("connect6 link replaced, want it updated in place")
	}
	byType := attached(t, env.Cgroup)
	if ids := byType[ebpf.AttachCGroupUDP4Sendmsg]; len(ids) != 1 || ids[0] != second[bpf.SockLBProgLb4Sendmsg].program {
		t.Fatalf("sendmsg4 programs %v, want only the new link's: the retired link must be detached", ids)
	}
	wantTranslated(t, env, "after replacing pins")
}

// Moving --cgroup-root moves the programs: the links pinned for the old
// cgroup are replaced by links on the new one.
func TestCgroupRootMoves(t *testing.T) {
	env := socklbtest.New(t)
	root := bpfmapstest.Root(t)
	env.ServeTCP(backend)
	var m *lbmaps.Maps
	stop := start(t, env.Datapath(root, &m))
	putService(t, m)
	wantTranslated(t, env, "attached to the test cgroup")
	stop()

	// A cgroup beside the clients' one: the clients are not under it.
	other, err := os.MkdirTemp(filepath.Dir(env.Cgroup), "cellium-loader-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(other) })
	h := env.Datapath(root, &m)
	h.Viper().Set("cgroup-root", other)
	start(t, h)

	if got := attachedPrograms(attached(t, env.Cgroup)); len(got) != 0 {
		t.Fatalf("programs %v left on the old cgroup", got)
	}
	if got, want := attachedPrograms(attached(t, other)), linkPrograms(pinnedLinks(t, root)); len(got) != len(programs) || !slices.Equal(got, want) {
		t.Fatalf("programs on the new cgroup %v, want the pinned links' %v", got, want)
	}
	wantUntouched(t, env, "outside the new --cgroup-root")
}

func TestCgroupRootErrors(t *testing.T) {
	notCgroup := t.TempDir()
	for _, tc := range []struct {
		name, root, want string
	}{
		{"relative", "sys/fs/cgroup", `invalid --cgroup-root "sys/fs/cgroup": want an absolute path to a cgroup2 directory`},
		{"not a cgroup", notCgroup, "--cgroup-root " + notCgroup + " is not a cgroup2 directory"},
		{"missing", filepath.Join(notCgroup, "missing"), "--cgroup-root " + filepath.Join(notCgroup, "missing") + ": no such file or directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := socklbtest.New(t)
			var m *lbmaps.Maps
			h := env.Datapath(bpfmapstest.Root(t), &m)
			h.Viper().Set("cgroup-root", tc.root)
			log := hivetest.Logger(t)
			err := h.Start(log, context.Background())
			if err == nil {
				h.Stop(log, context.Background())
				t.Fatal("started; want an error")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not contain %q", err, tc.want)
			}
		})
	}
}
