package monitor_test

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/cells/api"
	"github.com/cellium/cellium/cells/bpfmaps"
	"github.com/cellium/cellium/cells/bpfmaps/bpfmapstest"
	"github.com/cellium/cellium/cells/ctmaps"
	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/health"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/loadbalancer"
	"github.com/cellium/cellium/cells/monitor"
	"github.com/cellium/cellium/cells/monitor/monitortest"
	"github.com/cellium/cellium/pkg/apiv1"
	"github.com/cellium/cellium/pkg/client"
	"github.com/cellium/cellium/pkg/monitorapi"
)

// env is the monitor cell over real maps, with the tables it watches.
type env struct {
	t         *testing.T
	db        *statedb.DB
	health    statedb.Table[*health.Status]
	endpoints statedb.RWTable[*endpointmanager.Endpoint]
	frontends statedb.RWTable[*loadbalancer.Frontend]
	services  statedb.RWTable[*loadbalancer.Service]
	monitor   *monitor.Monitor
	writer    *monitortest.RecordWriter
	boot      monitorapi.BootClock
	client    *client.Client
	// early subscribed before the hive started.
	early *monitor.Subscription
}

type envOptions struct {
	ringbufSize uint32
	apiBuffer   int
	withAPI     bool
}

func newEnv(t *testing.T, opts envOptions) *env {
	t.Helper()
	e := &env{t: t, boot: monitorapi.SystemBootClock()}
	var events *ctmaps.Events
	cells := []cell.Cell{
		bpfmaps.Cell, ctmaps.Cell, monitor.Cell,
		cell.Provide(
			endpointmanager.NewTable, statedb.RWTable[*endpointmanager.Endpoint].ToTable,
			loadbalancer.NewFrontendsTable, statedb.RWTable[*loadbalancer.Frontend].ToTable,
			loadbalancer.NewServicesTable, statedb.RWTable[*loadbalancer.Service].ToTable,
		),
		cell.Invoke(func(db *statedb.DB, hs statedb.Table[*health.Status], eps statedb.RWTable[*endpointmanager.Endpoint], fes statedb.RWTable[*loadbalancer.Frontend], svcs statedb.RWTable[*loadbalancer.Service], m *monitor.Monitor, ev *ctmaps.Events) {
			e.db, e.health, e.endpoints, e.frontends, e.services, e.monitor, events = db, hs, eps, fes, svcs, m, ev
			e.early = m.Subscribe("early", 64)
		}),
	}
	socket := filepath.Join(t.TempDir(), "agent.sock")
	if opts.withAPI {
		cells = append(cells, api.Cell)
	}
	h := celltest.New(cells...)
	hive.AddConfigOverride(h, func(c *bpfmaps.Config) { c.BPFRoot = bpfmapstest.Root(t) })
	if opts.withAPI {
		hive.AddConfigOverride(h, func(c *api.Config) { c.APISocket = socket })
		e.client = client.New(socket)
	}
	if opts.ringbufSize != 0 {
		hive.AddConfigOverride(h, func(c *ctmaps.Config) { c.MonitorRingbufSize = opts.ringbufSize })
	}
	if opts.apiBuffer != 0 {
		hive.AddConfigOverride(h, func(c *monitor.Config) { c.MonitorAPIBuffer = opts.apiBuffer })
	}
	celltest.Start(t, h)
	w, err := monitortest.NewRecordWriter(events.Ring.EBPF(), events.Lost.EBPF())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	e.writer = w
	return e
}

// trace is a trace event as the from-endpoint program writes it.
func (e *env) trace(sport uint16) *monitorapi.TraceEvent {
	return &monitorapi.TraceEvent{
		Time:       time.Now().Round(time.Microsecond),
		EndpointID: 7,
		IfIndex:    42,
		Point:      monitorapi.TraceFromEndpoint,
		Flow: monitorapi.Flow{
			Src: netip.MustParseAddr("10.244.0.7"), Dst: netip.MustParseAddr("10.244.0.9"),
			Proto: unix.IPPROTO_TCP, SrcPort: sport, DstPort: 80,
			TCPFlags: monitorapi.TCPSyn, CTState: monitorapi.CTNew, Len: 74,
		},
	}
}

// write outputs ev into the ring buffer repeat times.
func (e *env) write(ev monitorapi.Event, repeat int) {
	e.t.Helper()
	rec, err := monitorapi.Encode(ev, e.boot)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := e.writer.Write(rec, repeat); err != nil {
		e.t.Fatal(err)
	}
}

// waitNotifying waits until the change watchers ids have their baseline:
// they report OK with "Notifying changes …" then. OK alone is not enough,
// since a one-shot job reports OK "Running" as soon as it starts.
func (e *env) waitNotifying(ids ...string) {
	e.t.Helper()
	for _, id := range ids {
		for {
			s, _, watch, found := e.health.GetWatch(e.db.ReadTxn(), health.StatusID.Query(id))
			if found && s.Level == cell.StatusOK && strings.HasPrefix(s.Message, "Notifying changes") {
				break
			}
			select {
			case <-watch:
			case <-time.After(10 * time.Second):
				e.t.Fatalf("timed out waiting for %s to be healthy", id)
			}
		}
	}
}

// next waits for sub's next event that keep accepts.
func next(t *testing.T, sub *monitor.Subscription, keep func(monitorapi.Event) bool) monitorapi.Event {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev, ok := <-sub.Events():
			if !ok {
				t.Fatal("subscription closed")
			}
			if keep(ev) {
				return ev
			}
		case <-timeout:
			t.Fatal("timed out waiting for an event")
		}
	}
}

func isAgent(typ string) func(monitorapi.Event) bool {
	return func(ev monitorapi.Event) bool {
		a, ok := ev.(*monitorapi.AgentEvent)
		return ok && a.Type == typ
	}
}

func isKind(kind string) func(monitorapi.Event) bool {
	return func(ev monitorapi.Event) bool { return ev.Kind() == kind }
}

func TestDatapathRecordsReachSubscribersDecoded(t *testing.T) {
	e := newEnv(t, envOptions{})
	sub := e.monitor.Subscribe("test", 16)
	defer sub.Close()

	want := e.trace(40000)
	e.write(want, 1)
	got := next(t, sub, isKind(monitorapi.KindTrace)).(*monitorapi.TraceEvent)
	// The boot clock is read twice (here and by the reader): allow for
	// the difference between the readings.
	if d := got.Time.Sub(want.Time); d < -time.Millisecond || d > time.Millisecond {
		t.Errorf("time %s, want %s", got.Time, want.Time)
	}
	got.Time = want.Time
	if *got != *want {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
}

func TestSlowSubscriberLosesWithoutStallingOthers(t *testing.T) {
	e := newEnv(t, envOptions{})
	// After the agent-started notification, the records are all there is.
	next(t, e.early, isAgent(monitorapi.AgentStarted))
	slow := e.monitor.Subscribe("slow", 1) // never read
	defer slow.Close()
	fast := e.monitor.Subscribe("fast", 1024)
	defer fast.Close()

	const n = 500
	e.write(e.trace(40000), n)
	for range n {
		next(t, fast, isKind(monitorapi.KindTrace))
	}
	// The slow one held the first event and lost the rest.
	celltest.Eventually(t, "the slow subscriber's losses", func() (bool, string) { l := slow.Lost(); return l == n-1, fmt.Sprint(l, " lost") })
	if fast.Lost() != 0 {
		t.Errorf("fast subscriber lost %d events", fast.Lost())
	}
	if got := len(slow.Events()); got != 1 {
		t.Errorf("slow subscriber holds %d events, want 1", got)
	}
}

func TestFullRingBufferCountsLostEvents(t *testing.T) {
	// One page: a few dozen records. A single BPF_PROG_TEST_RUN writes
	// far faster than the reader drains it.
	e := newEnv(t, envOptions{ringbufSize: uint32(unix.Getpagesize())})
	sub := e.monitor.Subscribe("test", 1<<16)
	defer sub.Close()

	const n = 20000
	e.write(e.trace(40000), n)
	received := 0
	celltest.Eventually(t, "every record received or counted lost", func() (bool, string) {
		for len(sub.Events()) > 0 {
			if (<-sub.Events()).Kind() == monitorapi.KindTrace {
				received++
			}
		}
		lost := e.monitor.Lost()
		return uint64(received)+lost == n, fmt.Sprintf("%d received, %d lost of %d", received, lost, n)
	})
	if e.monitor.Lost() == 0 {
		t.Fatalf("no events lost writing %d records into a one-page ring buffer", n)
	}
	t.Logf("received %d, lost %d", received, e.monitor.Lost())
}

func TestAgentNotifications(t *testing.T) {
	e := newEnv(t, envOptions{})
	sub := e.monitor.Subscribe("test", 64)
	defer sub.Close()
	agent := isAgent
	// Changes before the watchers took their baseline are not news.
	e.waitNotifying("monitor.job-notify-endpoints", "monitor.job-notify-services")

	ep := &endpointmanager.Endpoint{
		ID: 12, ContainerID: "c12", PodNamespace: "default", PodName: "web-1",
		IPv4: netip.MustParseAddr("10.244.0.12"), HostIfName: "lxc12", HostIfIndex: 99,
		State: endpointmanager.Ready,
	}
	txn := e.db.WriteTxn(e.endpoints)
	e.endpoints.Insert(txn, ep)
	txn.Commit()
	got := next(t, sub, agent(monitorapi.EndpointCreated)).(*monitorapi.AgentEvent)
	for _, want := range []string{"endpoint 12", "default/web-1", "10.244.0.12", "lxc12"} {
		if !strings.Contains(got.Message, want) {
			t.Errorf("endpoint-created %q does not mention %q", got.Message, want)
		}
	}

	fe := &loadbalancer.Frontend{
		Address:     loadbalancer.L3n4Addr{Addr: netip.MustParseAddr("10.96.0.10"), Port: 80, Protocol: loadbalancer.TCP},
		Type:        loadbalancer.FrontendClusterIP,
		ServiceName: loadbalancer.ServiceName{Namespace: "default", Name: "web"},
		Backends:    []loadbalancer.L3n4Addr{{Addr: netip.MustParseAddr("10.244.0.12"), Port: 8080, Protocol: loadbalancer.TCP}},
	}
	svc := &loadbalancer.Service{
		Name: fe.ServiceName, Type: loadbalancer.ServiceClusterIP, ClusterIPs: []netip.Addr{fe.Address.Addr},
		Ports: []loadbalancer.ServicePort{{Port: 80, Protocol: loadbalancer.TCP}},
	}
	txn = e.db.WriteTxn(e.services, e.frontends)
	e.services.Insert(txn, svc)
	e.frontends.Insert(txn, fe)
	txn.Commit()
	got = next(t, sub, agent(monitorapi.ServiceUpdated)).(*monitorapi.AgentEvent)
	for _, want := range []string{"default/web", "10.96.0.10:80/TCP", "10.244.0.12:8080/TCP"} {
		if !strings.Contains(got.Message, want) {
			t.Errorf("service-updated %q does not mention %q", got.Message, want)
		}
	}

	txn = e.db.WriteTxn(e.endpoints, e.services, e.frontends)
	e.endpoints.Delete(txn, ep)
	e.services.Delete(txn, svc)
	e.frontends.Delete(txn, fe)
	txn.Commit()
	// The two come from separate watchers, in either order.
	pending := map[string]bool{monitorapi.EndpointDeleted: true, monitorapi.ServiceDeleted: true}
	for len(pending) > 0 {
		ev := next(t, sub, func(ev monitorapi.Event) bool {
			a, ok := ev.(*monitorapi.AgentEvent)
			return ok && pending[a.Type]
		})
		delete(pending, ev.(*monitorapi.AgentEvent).Type)
	}
}

func TestAgentStartedNotification(t *testing.T) {
	e := newEnv(t, envOptions{})
	ev := next(t, e.early, isAgent(monitorapi.AgentStarted))
	if msg := ev.(*monitorapi.AgentEvent).Message; !strings.Contains(msg, "started") {
		t.Errorf("agent-started message %q", msg)
	}
}

func TestAPIStreamFiltersKinds(t *testing.T) {
	e := newEnv(t, envOptions{withAPI: true})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := e.client.Monitor(ctx, monitorapi.KindDrop)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	e.write(e.trace(40000), 3)
	drop := &monitorapi.DropEvent{
		Time: time.Now(), EndpointID: 7, IfIndex: 42, Reason: monitorapi.DropInvalidPacket,
		Flow: monitorapi.Flow{Proto: unix.IPPROTO_TCP, Len: 20},
	}
	e.write(drop, 1)
	msg, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if msg.Kind != monitorapi.KindDrop {
		t.Fatalf("first message of a drop stream is a %q", msg.Kind)
	}
	ev, err := client.MonitorEvent(msg)
	if err != nil {
		t.Fatal(err)
	}
	if got := ev.(*monitorapi.DropEvent); got.Reason != monitorapi.DropInvalidPacket || got.EndpointID != 7 {
		t.Errorf("drop event %+v", got)
	}
}

func TestAPIStreamRefusesUnknownKind(t *testing.T) {
	e := newEnv(t, envOptions{withAPI: true})
	_, err := e.client.Monitor(context.Background(), "trace", "bogus")
	if err == nil || !strings.Contains(err.Error(), `invalid type "bogus"`) {
		t.Fatalf("error %v, want one naming the invalid type", err)
	}
}

// A client that stops reading loses events; once it reads again, lost
// markers account for every one: delivered + lost = written.
func TestAPIStreamReportsLostEvents(t *testing.T) {
	e := newEnv(t, envOptions{withAPI: true, apiBuffer: 16})
	// Lost counts events of every kind: let the notification pass first.
	next(t, e.early, isAgent(monitorapi.AgentStarted))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := e.client.Monitor(ctx, monitorapi.KindTrace)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	// Far more than the stream's buffer and the socket's buffers hold.
	const n = 50000
	for range n / 1000 {
		e.write(e.trace(40000), 1000)
	}
	var delivered, lostStream, lostDatapath uint64
	for delivered+lostStream+lostDatapath < n {
		msg, err := s.Recv()
		if err != nil {
			t.Fatalf("after %d delivered, %d lost: %v", delivered, lostStream+lostDatapath, err)
		}
		switch msg.Kind {
		case monitorapi.KindTrace:
			delivered++
		case apiv1.MonitorLostKind:
			lostStream += msg.Lost.Stream
			lostDatapath += msg.Lost.Datapath
		default:
			t.Fatalf("message of kind %q in a trace stream", msg.Kind)
		}
	}
	if got := delivered + lostStream + lostDatapath; got != n {
		t.Errorf("delivered %d + lost %d (stream) + %d (datapath) = %d, want %d", delivered, lostStream, lostDatapath, got, n)
	}
	if lostStream == 0 {
		t.Errorf("a client that fell %d events behind lost none", n)
	}
	t.Logf("delivered %d, lost %d (stream), %d (datapath)", delivered, lostStream, lostDatapath)
}
