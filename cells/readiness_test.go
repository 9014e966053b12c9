package cells_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"
	"github.com/spf13/pflag"

	"github.com/cellium/cellium/cells"
	"github.com/cellium/cellium/cells/bpfmaps/bpfmapstest"
	"github.com/cellium/cellium/cells/devices"
	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/endpointmaps"
	"github.com/cellium/cellium/cells/health"
	"github.com/cellium/cellium/cells/ipam"
	"github.com/cellium/cellium/cells/ipcache"
	"github.com/cellium/cellium/cells/lbmaps"
	"github.com/cellium/cellium/cells/loadbalancer"
	"github.com/cellium/cellium/cells/loader"
	"github.com/cellium/cellium/pkg/apiv1"
	"github.com/cellium/cellium/pkg/cgroup2"
	"github.com/cellium/cellium/pkg/polltest"
)

// testManifests is a Service with three backends, for the frontends to
// have something to reconcile.
const testManifests = `apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, protocol: TCP, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: default
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- addresses: [127.0.0.1]
  conditions: {ready: true}
- addresses: [127.0.0.2]
  conditions: {ready: true}
- addresses: [127.0.0.3]
  conditions: {ready: true}
`

// testAgent is the whole agent in this process, on private paths.
type testAgent struct {
	t          *testing.T
	h          *hive.Hive
	db         *statedb.DB
	healthAddr string
	conflist   string
}

// slowTable makes a table's initialization wait for the test: it adds an
// initializer, as a slow sync or restore of that table would hold, and
// returns the function that completes it.
type slowTable struct {
	name    string
	release func()
}

func startTestAgent(t *testing.T, extraFlags []string, slow *slowTable) *testAgent {
	t.Helper()
	bpfRoot := bpfmapstest.Root(t)
	mount, err := cgroup2.Mount()
	if err != nil {
		t.Skipf("no cgroup2 mount for the socket programs: %v", err)
	}
	cgroup, err := os.MkdirTemp(mount, "cellium-readiness-test-")
	if err != nil {
		t.Skipf("cannot create a test cgroup: %v", err)
	}
	t.Cleanup(func() { os.Remove(cgroup) })

	dir := t.TempDir()
	ipv4 := filepath.Join(dir, "proc", "sys", "net", "ipv4")
	if err := os.MkdirAll(ipv4, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ipv4, "ip_forward"), []byte("0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	manifests := filepath.Join(dir, "manifests")
	if err := os.Mkdir(manifests, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(manifests, "web.yaml"), []byte(testManifests), 0o644); err != nil {
		t.Fatal(err)
	}
	a := &testAgent{t: t, healthAddr: freePort(t), conflist: filepath.Join(dir, "net.d", endpointmanager.CNIConfFile)}

	var hold func()
	h := hive.NewWithOptions(cells.Options(), cells.Agent,
		cell.Invoke(func(db *statedb.DB) error {
			a.db = db
			if slow == nil {
				return nil
			}
			var err error
			hold, err = holdTable(db, slow.name)
			return err
		}),
		health.StartedMarker)
	flags := pflag.NewFlagSet("", pflag.ContinueOnError)
	h.RegisterFlags(flags)
	args := append([]string{
		"--api-socket", filepath.Join(dir, "run", "agent.sock"),
		"--state-dir", filepath.Join(dir, "state"),
		"--run-dir", filepath.Join(dir, "run"),
		"--proc-fs", filepath.Join(dir, "proc"),
		"--health-addr", a.healthAddr,
		"--metrics-addr", "",
		"--bpf-root", bpfRoot,
		"--cni-conf-dir", filepath.Dir(a.conflist),
		"--cgroup-root", cgroup,
		"--k8s-mode", "embedded",
		"--k8s-manifests-dir", manifests,
		"--node-name", "readiness-test",
		"--pod-cidr", "10.251.0.0/24",
		// No health endpoint: it would be a veth in the host's namespace.
		"--cluster-health-port", "0",
		// No nftables table in the host's namespace.
		"--enable-masquerade=false",
		// No programs on the host's devices.
		"--enable-nodeport=false",
	}, extraFlags...)
	if err := flags.Parse(args); err != nil {
		t.Fatal(err)
	}
	log := hivetest.Logger(t)
	if err := h.Start(log, context.Background()); err != nil {
		t.Fatalf("start the agent: %v", err)
	}
	t.Cleanup(func() {
		if err := h.Stop(log, context.Background()); err != nil {
			t.Errorf("stop the agent: %v", err)
		}
	})
	if slow != nil {
		// Released before the stop too: a stop with a restore still
		// waiting would wait for it.
		var once sync.Once
		slow.release = func() { once.Do(hold) }
		t.Cleanup(slow.release)
	}
	a.h = h
	return a
}

// holdTable adds the initializer "test-slow" to the table named name.
func holdTable(db *statedb.DB, name string) (release func(), err error) {
	i := slices.IndexFunc(db.GetTables(db.ReadTxn()), func(m statedb.TableMeta) bool { return m.Name() == name })
	if i < 0 {
		return nil, fmt.Errorf("no table %q", name)
	}
	tbl := db.GetTables(db.ReadTxn())[i]
	rw, ok := tbl.(interface {
		RegisterInitializer(statedb.WriteTxn, string) func(statedb.WriteTxn)
	})
	if !ok {
		return nil, fmt.Errorf("table %q takes no initializers", name)
	}
	txn := db.WriteTxn(tbl)
	done := rw.RegisterInitializer(txn, "test-slow")
	txn.Commit()
	return func() {
		txn := db.WriteTxn(tbl)
		done(txn)
		txn.Commit()
	}, nil
}

func freePort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// readyz is the probe's answer.
func (a *testAgent) readyz() (int, apiv1.Healthz) {
	a.t.Helper()
	resp, err := http.Get("http://" + a.healthAddr + "/readyz")
	if err != nil {
		a.t.Fatalf("/readyz: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var hz apiv1.Healthz
	if err := json.Unmarshal(body, &hz); err != nil {
		a.t.Fatalf("/readyz body %q: %v", body, err)
	}
	return resp.StatusCode, hz
}

// waitReadyz polls /readyz until cond holds, for at most a minute.
func (a *testAgent) waitReadyz(what string, cond func(code int, hz apiv1.Healthz) bool) apiv1.Healthz {
	a.t.Helper()
	var hz apiv1.Healthz
	polltest.Until(a.t, what, time.Minute, 20*time.Millisecond, func() (bool, string) {
		var code int
		code, hz = a.readyz()
		return cond(code, hz), fmt.Sprintf("/readyz %d %+v", code, hz)
	})
	return hz
}

func (a *testAgent) conflistExists() bool {
	_, err := os.Stat(a.conflist)
	return err == nil
}

// TestReadinessBarriers makes each piece of restored or synced state slow
// in a whole agent, and checks that it alone keeps the agent not ready:
// /readyz answers 503 naming it with how long it waits and what for, and no
// CNI configuration exists, so the kubelet sends no pods. Once the state is
// in place the agent is ready and writes the configuration.
func TestReadinessBarriers(t *testing.T) {
	tests := []struct {
		table string
		// pending are the barriers the slow table holds back: its own and
		// those of the state computed from it.
		pending []string
	}{
		{loadbalancer.ServicesTableName, []string{loadbalancer.K8sSyncedBarrier}},
		{loadbalancer.FrontendsTableName, []string{lbmaps.FrontendsBarrier}},
		{endpointmanager.TableName, []string{endpointmaps.WrittenBarrier, loader.AttachedBarrier, ipcache.SyncedBarrier}},
		{ipcache.TableName, []string{ipcache.SyncedBarrier}},
		{devices.DevicesTableName, []string{devices.KnownBarrier}},
		{ipam.TableName, []string{ipam.PoolsBarrier, endpointmanager.RestoreBarrier, endpointmaps.WrittenBarrier, loader.AttachedBarrier, ipcache.SyncedBarrier}},
	}
	for _, tc := range tests {
		t.Run(tc.table, func(t *testing.T) {
			slow := &slowTable{name: tc.table}
			a := startTestAgent(t, nil, slow)
			hz := a.waitReadyz("only the slow table's barriers pending", func(code int, hz apiv1.Healthz) bool {
				return code == http.StatusServiceUnavailable && slices.Equal(sorted(hz.Pending), sorted(tc.pending))
			})
			for _, b := range hz.Waiting {
				if b.Since.IsZero() || b.WaitedSeconds <= 0 {
					t.Errorf("barrier %s: no wait time in %+v", b.Name, b)
				}
			}
			if i := slices.IndexFunc(hz.Waiting, func(b apiv1.Barrier) bool { return b.Name == tc.pending[0] }); i < 0 ||
				!strings.Contains(hz.Waiting[i].Detail, "test-slow") {
				t.Errorf("barrier %s does not say it waits for the table's initializer test-slow: %+v", tc.pending[0], hz.Waiting)
			}
			if a.conflistExists() {
				t.Fatalf("CNI configuration %s exists while the agent is not ready", a.conflist)
			}

			slow.release()
			a.waitReadyz("ready", func(code int, hz apiv1.Healthz) bool { return code == http.StatusOK && hz.Ready })
			polltest.Until(t, "CNI configuration "+a.conflist+" after the agent became ready", 30*time.Second, 20*time.Millisecond, func() (bool, string) {
				return a.conflistExists(), "no file"
			})
		})
	}
}

// TestReadinessWaitsForTheMaps: frontends written into the table but
// refused by the maps (a service map too small for the Service's backends)
// keep the agent not ready, and after --readiness-timeout the health of
// the agent names the barrier as an error.
func TestReadinessWaitsForTheMaps(t *testing.T) {
	a := startTestAgent(t, []string{"--lb-service-map-max", "2", "--readiness-timeout", "1s"}, nil)
	// Every other barrier passes; this one stays, saying why.
	a.waitReadyz("the frontends barrier alone pending, reporting the failed writes", func(code int, hz apiv1.Healthz) bool {
		i := slices.IndexFunc(hz.Waiting, func(b apiv1.Barrier) bool { return b.Name == lbmaps.FrontendsBarrier })
		return code == http.StatusServiceUnavailable && i >= 0 && strings.Contains(hz.Waiting[i].Detail, "failed to reconcile") &&
			slices.Equal(hz.Pending, []string{lbmaps.FrontendsBarrier})
	})
	if a.conflistExists() {
		t.Fatalf("CNI configuration %s exists while the frontends are not in the maps", a.conflist)
	}
	polltest.Until(t, "a health error naming "+lbmaps.FrontendsBarrier+" after --readiness-timeout", 30*time.Second, 20*time.Millisecond, func() (bool, string) {
		i := slices.IndexFunc(a.db.GetTables(a.db.ReadTxn()), func(m statedb.TableMeta) bool { return m.Name() == health.TableName })
		statuses := a.db.GetTables(a.db.ReadTxn())[i].(statedb.Table[*health.Status])
		st, _, found := statuses.Get(a.db.ReadTxn(), health.StatusID.Query("health.job-readiness-timeout"))
		return found && st.Level == cell.StatusDegraded && strings.Contains(st.Error, lbmaps.FrontendsBarrier), fmt.Sprintf("%+v", st)
	})
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}
