package hubble

import (
	"context"
	"errors"
	"io"
	"math"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/cilium/api/v1/flow"
	"github.com/cilium/cilium/api/v1/observer"
	"github.com/cilium/statedb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cellium/cellium/cells/api"
	"github.com/cellium/cellium/cells/nodes"
	"github.com/cellium/cellium/pkg/netlimit"
)

// testClock is a clock the test moves.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// serve serves o over a unix socket in a temporary directory, as the cell
// does, with a Peer service of an empty nodes table, and returns a client
// connection to it.
func serve(t *testing.T, o *Observer) (*grpc.ClientConn, *grpcServer) {
	t.Helper()
	db := statedb.New()
	tbl, err := nodes.NewTable(db)
	if err != nil {
		t.Fatal(err)
	}
	return serveWith(t, o, newPeerServer(db, tbl))
}

// serveWith serves o and peer over a unix socket in a temporary
// directory and returns a client connection to them.
func serveWith(t *testing.T, o *Observer, peer *peerServer) (*grpc.ClientConn, *grpcServer) {
	t.Helper()
	addr := Address{Network: "unix", Addr: filepath.Join(t.TempDir(), SocketName)}
	ln, err := api.ListenUnix("hubble-listen-address", addr.Addr)
	if err != nil {
		t.Fatal(err)
	}
	s := newGRPCServer(o, peer, nil, netlimit.Default)
	s.serve([]net.Listener{ln}, nil, func(_ net.Listener, err error) { t.Errorf("serve: %v", err) })
	t.Cleanup(func() { s.stop(context.Background()) })
	conn, err := Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn, s
}

// flowAt is a TCP flow from src to dst at epoch+sec seconds.
func flowAt(sec int, src, dst string, verdict flow.Verdict) *flow.Flow {
	return &flow.Flow{
		Time:    timestamppb.New(epoch.Add(time.Duration(sec) * time.Second)),
		Verdict: verdict,
		IP:      &flow.IP{Source: src, Destination: dst, IpVersion: flow.IPVersion_IPv4},
		L4:      &flow.Layer4{Protocol: &flow.Layer4_TCP{TCP: &flow.TCP{SourcePort: 40000 + uint32(sec), DestinationPort: 80}}},
		Source:  &flow.Endpoint{ID: 1, Namespace: "default", PodName: "client"},
	}
}

// getFlows runs a GetFlows call to its end and returns what it sent: flows
// as "second:source>destination", lost records as "lost:N".
func getFlows(t *testing.T, c observer.ObserverClient, req *observer.GetFlowsRequest) ([]string, error) {
	t.Helper()
	stream, err := c.GetFlows(context.Background(), req)
	if err != nil {
		return nil, err
	}
	resps, err := recvAll(stream)
	var got []string
	for _, resp := range resps {
		got = append(got, describe(resp))
	}
	return got, err
}

// recvAll receives from a stream that ends (does not follow) until its end,
// and returns what it received before an error.
func recvAll[T any](stream interface{ Recv() (T, error) }) ([]T, error) {
	var all []T
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return all, nil
		}
		if err != nil {
			return all, err
		}
		all = append(all, resp)
	}
}

func describe(resp *observer.GetFlowsResponse) string {
	if l := resp.GetLostEvents(); l != nil {
		return "lost:" + l.GetSource().String() + ":" + strconv.FormatUint(l.GetNumEventsLost(), 10)
	}
	f := resp.GetFlow()
	sec := f.GetTime().AsTime().Sub(epoch) / time.Second
	return strconv.FormatUint(uint64(sec), 10) + ":" + f.GetIP().GetSource() + ">" + f.GetIP().GetDestination()
}

func TestGetFlows(t *testing.T) {
	clock := &testClock{now: epoch}
	o := NewObserver(4, "node-1", clock.Now)
	conn, _ := serve(t, o)
	c := observer.NewObserverClient(conn)

	// Six flows into four slots: the flows of seconds 1 and 2 are gone.
	o.AddFlow(flowAt(1, "10.244.0.1", "10.244.0.2", flow.Verdict_FORWARDED))
	o.AddFlow(flowAt(2, "10.244.0.1", "10.244.0.2", flow.Verdict_FORWARDED))
	o.AddFlow(flowAt(3, "10.244.0.1", "10.244.0.3", flow.Verdict_DROPPED))
	// Lost-event records are stamped with the observer's clock.
	clock.Set(epoch.Add(4500 * time.Millisecond))
	o.AddLost(flow.LostEventSource_OBSERVER_EVENTS_QUEUE, 7)
	o.AddFlow(flowAt(5, "10.244.0.4", "10.244.0.2", flow.Verdict_FORWARDED))
	o.AddFlow(flowAt(6, "10.244.0.1", "10.244.0.2", flow.Verdict_FORWARDED))

	tests := []struct {
		name string
		req  *observer.GetFlowsRequest
		want string
	}{
		{"everything held", &observer.GetFlowsRequest{}, "3:10.244.0.1>10.244.0.3 lost:OBSERVER_EVENTS_QUEUE:7 5:10.244.0.4>10.244.0.2 6:10.244.0.1>10.244.0.2"},
		{"last 2", &observer.GetFlowsRequest{Number: 2}, "5:10.244.0.4>10.244.0.2 6:10.244.0.1>10.244.0.2"},
		{"all, as hubble observe --all asks", &observer.GetFlowsRequest{Number: math.MaxUint64}, "3:10.244.0.1>10.244.0.3 lost:OBSERVER_EVENTS_QUEUE:7 5:10.244.0.4>10.244.0.2 6:10.244.0.1>10.244.0.2"},
		{"first 1", &observer.GetFlowsRequest{Number: 1, First: true}, "3:10.244.0.1>10.244.0.3"},
		{"since", &observer.GetFlowsRequest{Since: timestamppb.New(epoch.Add(5 * time.Second))}, "5:10.244.0.4>10.244.0.2 6:10.244.0.1>10.244.0.2"},
		{"until", &observer.GetFlowsRequest{Until: timestamppb.New(epoch.Add(4 * time.Second))}, "3:10.244.0.1>10.244.0.3"},
		{"whitelist", &observer.GetFlowsRequest{Whitelist: []*flow.FlowFilter{{DestinationIp: []string{"10.244.0.2"}}}},
			"lost:OBSERVER_EVENTS_QUEUE:7 5:10.244.0.4>10.244.0.2 6:10.244.0.1>10.244.0.2"},
		{"blacklist", &observer.GetFlowsRequest{Number: 3, Blacklist: []*flow.FlowFilter{{SourceIp: []string{"10.244.0.4"}}}},
			"3:10.244.0.1>10.244.0.3 lost:OBSERVER_EVENTS_QUEUE:7 6:10.244.0.1>10.244.0.2"},
		// Lost-event records pass every filter: the flows lost may have
		// been ones the filters select.
		{"verdict", &observer.GetFlowsRequest{Whitelist: []*flow.FlowFilter{{Verdict: []flow.Verdict{flow.Verdict_DROPPED}}}}, "3:10.244.0.1>10.244.0.3 lost:OBSERVER_EVENTS_QUEUE:7"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := getFlows(t, c, tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Join(got, " ") != tc.want {
				t.Fatalf("GetFlows sent\n  %s\nwant\n  %s", strings.Join(got, " "), tc.want)
			}
		})
	}
}

func TestGetFlowsStampsNodeAndTime(t *testing.T) {
	o := NewObserver(4, "node-1", time.Now)
	conn, _ := serve(t, o)
	o.AddFlow(flowAt(1, "10.244.0.1", "10.244.0.2", flow.Verdict_FORWARDED))
	stream, err := observer.NewObserverClient(conn).GetFlows(context.Background(), &observer.GetFlowsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetNodeName() != "node-1" || !resp.GetTime().AsTime().Equal(epoch.Add(time.Second)) {
		t.Fatalf("response node %q time %v, want node-1 and the flow's time", resp.GetNodeName(), resp.GetTime().AsTime())
	}
}

func TestGetFlowsFollow(t *testing.T) {
	o := NewObserver(16, "node-1", time.Now)
	conn, _ := serve(t, o)
	c := observer.NewObserverClient(conn)
	o.AddFlow(flowAt(1, "10.244.0.1", "10.244.0.2", flow.Verdict_FORWARDED))
	o.AddFlow(flowAt(2, "10.244.0.1", "10.244.0.2", flow.Verdict_FORWARDED))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := c.GetFlows(ctx, &observer.GetFlowsRequest{
		Number: 1, Follow: true,
		Whitelist: []*flow.FlowFilter{{Verdict: []flow.Verdict{flow.Verdict_FORWARDED}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	recv := func() string {
		t.Helper()
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		return describe(resp)
	}
	if got := recv(); got != "2:10.244.0.1>10.244.0.2" {
		t.Fatalf("first response %s, want the last flow held", got)
	}
	// New flows arrive whether the server sent the history yet or not;
	// the dropped one is filtered out.
	o.AddFlow(flowAt(3, "10.244.0.1", "10.244.0.9", flow.Verdict_DROPPED))
	o.AddFlow(flowAt(4, "10.244.0.1", "10.244.0.3", flow.Verdict_FORWARDED))
	if got := recv(); got != "4:10.244.0.1>10.244.0.3" {
		t.Fatalf("followed %s, want the new forwarded flow", got)
	}
	o.AddFlow(flowAt(5, "10.244.0.1", "10.244.0.4", flow.Verdict_FORWARDED))
	if got := recv(); got != "5:10.244.0.1>10.244.0.4" {
		t.Fatalf("followed %s, want the next flow", got)
	}
	cancel()
	if _, err := stream.Recv(); status.Code(err) != codes.Canceled {
		t.Fatalf("after cancel: %v, want Canceled", err)
	}
}

func TestGetFlowsFollowEndsWhenTheServerStops(t *testing.T) {
	o := NewObserver(16, "node-1", time.Now)
	conn, srv := serve(t, o)
	stream, err := observer.NewObserverClient(conn).GetFlows(context.Background(), &observer.GetFlowsRequest{Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	// The headers say the stream follows the ring: flows added from now on
	// reach it.
	if _, err := stream.Header(); err != nil {
		t.Fatal(err)
	}
	o.AddFlow(flowAt(1, "10.244.0.1", "10.244.0.2", flow.Verdict_FORWARDED))
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	// A graceful stop waits for calls in flight: the follow stream must end
	// by itself, or this never returns.
	srv.stop(context.Background())
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) && status.Code(err) != codes.Unavailable {
		t.Fatalf("stream after stop: %v, want its end", err)
	}
}

func TestGetFlowsFieldMask(t *testing.T) {
	o := NewObserver(4, "node-1", time.Now)
	conn, _ := serve(t, o)
	c := observer.NewObserverClient(conn)
	full := flowAt(1, "10.244.0.1", "10.244.0.2", flow.Verdict_FORWARDED)
	o.AddFlow(full)

	for _, req := range []*observer.GetFlowsRequest{
		{FieldMask: &fieldmaskpb.FieldMask{Paths: []string{"source.pod_name", "IP.source", "verdict"}}},
		{Experimental: &observer.GetFlowsRequest_Experimental{FieldMask: &fieldmaskpb.FieldMask{Paths: []string{"source.pod_name", "IP.source", "verdict"}}}},
	} {
		stream, err := c.GetFlows(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		want := &flow.Flow{
			Verdict: flow.Verdict_FORWARDED,
			IP:      &flow.IP{Source: "10.244.0.1"},
			Source:  &flow.Endpoint{PodName: "client"},
		}
		if !proto.Equal(resp.GetFlow(), want) {
			t.Fatalf("masked flow = %v, want %v", resp.GetFlow(), want)
		}
	}
	if full.GetIP().GetDestination() != "10.244.0.2" || full.GetSource().GetNamespace() != "default" {
		t.Fatal("masking changed the flow in the ring")
	}
}

func TestGetFlowsInvalidRequests(t *testing.T) {
	o := NewObserver(4, "node-1", time.Now)
	conn, _ := serve(t, o)
	c := observer.NewObserverClient(conn)
	tests := []struct {
		name string
		req  *observer.GetFlowsRequest
		want string
	}{
		{"first and follow", &observer.GetFlowsRequest{First: true, Follow: true}, "first and follow exclude each other"},
		{"since after until", &observer.GetFlowsRequest{Since: timestamppb.New(epoch.Add(time.Hour)), Until: timestamppb.New(epoch)}, "since 2026-01-02T04:04:05Z is after until"},
		{"unsupported filter", &observer.GetFlowsRequest{Blacklist: []*flow.FlowFilter{{HttpMethod: []string{"GET"}}}}, "blacklist[0]: filter field http_method is not supported"},
		{"bad filter value", &observer.GetFlowsRequest{Whitelist: []*flow.FlowFilter{{SourcePort: []string{"-1"}}}}, `invalid source_port "-1"`},
		{"bad field mask", &observer.GetFlowsRequest{FieldMask: &fieldmaskpb.FieldMask{Paths: []string{"source.colour"}}}, "invalid field_mask [source.colour]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := getFlows(t, c, tc.req)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("GetFlows = %v, want InvalidArgument containing %q", err, tc.want)
			}
		})
	}
}

func TestServerStatus(t *testing.T) {
	clock := &testClock{now: epoch}
	o := NewObserver(4, "node-1", clock.Now)
	conn, _ := serve(t, o)
	c := observer.NewObserverClient(conn)

	// Three flows in the agent's first 10 seconds.
	for _, sec := range []int{2, 5, 9} {
		o.AddFlow(flowAt(sec, "10.244.0.1", "10.244.0.2", flow.Verdict_FORWARDED))
	}
	clock.Set(epoch.Add(10 * time.Second))
	st, err := c.ServerStatus(context.Background(), &observer.ServerStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.NumFlows != 3 || st.MaxFlows != 4 || st.SeenFlows != 3 || st.UptimeNs != uint64(10*time.Second) {
		t.Fatalf("status = %v, want 3 of 4 flows held, 3 seen, 10s up", st)
	}
	if st.FlowsRate != 0.3 {
		t.Fatalf("flows rate = %v, want 3 flows / 10 s = 0.3", st.FlowsRate)
	}
	if !strings.HasPrefix(st.Version, "cellium ") {
		t.Fatalf("version = %q, want cellium's", st.Version)
	}

	// Two minutes on, the first three are out of the minute, and six more
	// flows overfill the ring: the rate is over the 4 flows it holds, which
	// cover 30 seconds.
	for _, sec := range []int{95, 100, 105, 110, 115, 125} {
		o.AddFlow(flowAt(sec, "10.244.0.1", "10.244.0.2", flow.Verdict_FORWARDED))
	}
	clock.Set(epoch.Add(130 * time.Second))
	st, err = c.ServerStatus(context.Background(), &observer.ServerStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.NumFlows != 4 || st.SeenFlows != 9 || st.UptimeNs != uint64(130*time.Second) {
		t.Fatalf("status = %v, want 4 held, 9 seen, 130s up", st)
	}
	if want := 4.0 / 25; st.FlowsRate != want {
		t.Fatalf("flows rate = %v, want 4 flows over the 25 s from the oldest held (105) to now (130) = %v", st.FlowsRate, want)
	}

	// Quiet for a minute: no flow in the window.
	clock.Set(epoch.Add(200 * time.Second))
	if st, _ = c.ServerStatus(context.Background(), &observer.ServerStatusRequest{}); st.FlowsRate != 0 {
		t.Fatalf("flows rate after a quiet minute = %v, want 0", st.FlowsRate)
	}
}

func TestHealthService(t *testing.T) {
	o := NewObserver(4, "node-1", time.Now)
	conn, _ := serve(t, o)
	hc := healthpb.NewHealthClient(conn)
	for _, service := range []string{"", ObserverService, HubbleService} {
		resp, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: service})
		if err != nil {
			t.Fatalf("health check %q: %v", service, err)
		}
		if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health of %q = %v, want SERVING", service, resp.GetStatus())
		}
	}
	if ObserverService != "observer.Observer" || HubbleService != "hubble.server.Observer" {
		t.Fatalf("service names %q, %q; want observer.Observer and hubble.server.Observer, which `hubble status` checks", ObserverService, HubbleService)
	}
}

func TestGetAgentEvents(t *testing.T) {
	o := NewObserver(4, "node-1", time.Now)
	conn, _ := serve(t, o)
	c := observer.NewObserverClient(conn)
	for i, typ := range []flow.AgentEventType{flow.AgentEventType_AGENT_STARTED, flow.AgentEventType_ENDPOINT_CREATED, flow.AgentEventType_ENDPOINT_DELETED} {
		o.AddAgentEvent(&flow.AgentEvent{Type: typ}, epoch.Add(time.Duration(i)*time.Second))
	}
	stream, err := c.GetAgentEvents(context.Background(), &observer.GetAgentEventsRequest{Number: 2})
	if err != nil {
		t.Fatal(err)
	}
	resps, err := recvAll(stream)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, resp := range resps {
		got = append(got, resp.GetAgentEvent().GetType().String()+"@"+resp.GetTime().AsTime().Sub(epoch).String()+"@"+resp.GetNodeName())
	}
	if strings.Join(got, " ") != "ENDPOINT_CREATED@1s@node-1 ENDPOINT_DELETED@2s@node-1" {
		t.Fatalf("agent events = %v, want the last two", got)
	}
}
