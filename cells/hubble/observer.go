package hubble

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cilium/cilium/api/v1/flow"
	"github.com/cilium/cilium/api/v1/observer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cellium/cellium/pkg/version"
)

// agentEventsKept is how many agent notifications the observer keeps for
// GetAgentEvents: they are rare (pods and services changing), and a
// thousand covers any recent history someone would read.
const agentEventsKept = 1024

// Observer keeps the newest flows in a ring and serves them with the Hubble
// Observer API (observer.ObserverServer). Flows, lost-event records and
// agent events enter through the add methods; GetFlows readers never slow
// the writer down: a reader that falls behind by more than the ring holds
// is told how many flows it lost.
type Observer struct {
	observer.UnimplementedObserverServer

	node        string
	flows       *Ring[*observer.GetFlowsResponse]
	agentEvents *Ring[*observer.GetAgentEventsResponse]
	started     time.Time
	now         func() time.Time
	// stopping ends the streams of followers when the server stops, which
	// would otherwise wait for their clients to go.
	stopping chan struct{}
	stopOnce sync.Once
}

// NewObserver makes an observer keeping bufferSize flows, stamped with the
// node's name. now is the clock (time.Now outside tests).
func NewObserver(bufferSize int, node string, now func() time.Time) *Observer {
	return &Observer{
		node:        node,
		flows:       NewRing[*observer.GetFlowsResponse](bufferSize),
		agentEvents: NewRing[*observer.GetAgentEventsResponse](agentEventsKept),
		started:     now(),
		now:         now,
		stopping:    make(chan struct{}),
	}
}

// AddFlow adds f, which must not be changed afterwards: readers share it.
func (o *Observer) AddFlow(f *flow.Flow) {
	o.flows.Write(&observer.GetFlowsResponse{
		ResponseTypes: &observer.GetFlowsResponse_Flow{Flow: f},
		NodeName:      o.node,
		Time:          f.GetTime(),
	})
}

// AddLost records that n events from source never became flows; GetFlows
// clients see the record among the flows, where the gap is.
func (o *Observer) AddLost(source flow.LostEventSource, n uint64) {
	o.flows.Write(o.lostRecord(source, n))
}

func (o *Observer) lostRecord(source flow.LostEventSource, n uint64) *observer.GetFlowsResponse {
	return &observer.GetFlowsResponse{
		ResponseTypes: &observer.GetFlowsResponse_LostEvents{LostEvents: &flow.LostEvent{Source: source, NumEventsLost: n}},
		NodeName:      o.node,
		Time:          timestamppb.New(o.now()),
	}
}

// AddAgentEvent adds an agent notification that happened at t.
func (o *Observer) AddAgentEvent(ev *flow.AgentEvent, t time.Time) {
	o.agentEvents.Write(&observer.GetAgentEventsResponse{AgentEvent: ev, NodeName: o.node, Time: timestamppb.New(t)})
}

// stop ends the followers' streams; stopping again does nothing.
func (o *Observer) stop() { o.stopOnce.Do(func() { close(o.stopping) }) }

// GetFlows sends the flows the request selects: the last (or first)
// number of them in the since/until window that pass the whitelist and not
// the blacklist, then, with follow, every new one until the client goes.
// It sends the response headers as soon as it has taken its place in the
// ring, before any flow: once a client's Header() returns, every flow
// added later reaches a following stream.
func (o *Observer) GetFlows(req *observer.GetFlowsRequest, srv observer.Observer_GetFlowsServer) error {
	matcher, err := newFlowMatcher(req.GetWhitelist(), req.GetBlacklist())
	if err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	maskPaths := req.GetFieldMask()
	if len(maskPaths.GetPaths()) == 0 {
		maskPaths = req.GetExperimental().GetFieldMask() //nolint:staticcheck // older clients send it here
	}
	mask, err := newFlowMask(maskPaths)
	if err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	sel := &selection[*observer.GetFlowsResponse]{
		timeOf: func(r *observer.GetFlowsResponse) time.Time { return r.GetTime().AsTime() },
		counts: func(r *observer.GetFlowsResponse) bool { return r.GetFlow() != nil },
		wants: func(r *observer.GetFlowsResponse) bool {
			// Lost-event records pass every filter: they say flows are
			// missing, whichever those were.
			f := r.GetFlow()
			return f == nil || matcher.match(f)
		},
	}
	if err := setWindow(sel, req.GetNumber(), req.GetFirst(), req.GetFollow(), req.GetSince(), req.GetUntil()); err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}

	send := func(r *observer.GetFlowsResponse) error {
		if f := r.GetFlow(); f != nil && mask != nil {
			r = &observer.GetFlowsResponse{
				ResponseTypes: &observer.GetFlowsResponse_Flow{Flow: mask.apply(f)},
				NodeName:      r.NodeName,
				Time:          r.Time,
			}
		}
		return srv.Send(r)
	}
	history, next := sel.history(o.flows)
	if err := srv.SendHeader(nil); err != nil {
		return err
	}
	for _, r := range history {
		if err := send(r); err != nil {
			return err
		}
	}
	if !sel.follow {
		return nil
	}
	f := &follower[*observer.GetFlowsResponse]{
		sel:  sel,
		send: send,
		lost: func(n uint64) error { return srv.Send(o.lostRecord(flow.LostEventSource_HUBBLE_RING_BUFFER, n)) },
	}
	return streamEnd(f.run(srv.Context(), o.flows, next, o.stopping))
}

// GetAgentEvents sends agent notifications (endpoints and services
// created and deleted, the agent starting) as GetFlows sends flows,
// without filters.
func (o *Observer) GetAgentEvents(req *observer.GetAgentEventsRequest, srv observer.Observer_GetAgentEventsServer) error {
	sel := &selection[*observer.GetAgentEventsResponse]{
		timeOf: func(r *observer.GetAgentEventsResponse) time.Time { return r.GetTime().AsTime() },
		counts: func(*observer.GetAgentEventsResponse) bool { return true },
		wants:  func(*observer.GetAgentEventsResponse) bool { return true },
	}
	if err := setWindow(sel, req.GetNumber(), req.GetFirst(), req.GetFollow(), req.GetSince(), req.GetUntil()); err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	history, next := sel.history(o.agentEvents)
	if err := srv.SendHeader(nil); err != nil {
		return err
	}
	for _, r := range history {
		if err := srv.Send(r); err != nil {
			return err
		}
	}
	if !sel.follow {
		return nil
	}
	f := &follower[*observer.GetAgentEventsResponse]{
		sel:  sel,
		send: srv.Send,
		// The API has no record for lost agent events; a follower that
		// falls a thousand notifications behind just skips them.
		lost: func(uint64) error { return nil },
	}
	return streamEnd(f.run(srv.Context(), o.agentEvents, next, o.stopping))
}

// setWindow validates and sets the selection's common fields.
func setWindow[T any](sel *selection[T], number uint64, first, follow bool, since, until *timestamppb.Timestamp) error {
	if first && follow {
		return errors.New("first and follow exclude each other: first picks the oldest entries, follow streams new ones")
	}
	sel.number, sel.first, sel.follow = number, first, follow
	for _, t := range []struct {
		name string
		ts   *timestamppb.Timestamp
		out  *time.Time
	}{{"since", since, &sel.since}, {"until", until, &sel.until}} {
		if t.ts == nil {
			continue
		}
		if err := t.ts.CheckValid(); err != nil {
			return fmt.Errorf("invalid %s: %w", t.name, err)
		}
		*t.out = t.ts.AsTime()
	}
	if !sel.since.IsZero() && !sel.until.IsZero() && sel.since.After(sel.until) {
		return fmt.Errorf("since %s is after until %s", sel.since.Format(time.RFC3339Nano), sel.until.Format(time.RFC3339Nano))
	}
	return nil
}

// streamEnd is what a following stream returns. A follow ends when the
// client goes away (its context is canceled or its deadline passes), which
// gets the matching gRPC code rather than Unknown, or when the server
// stops, which is no error.
func streamEnd(err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return status.FromContextError(err).Err()
	}
	return err
}

// rateWindow is the span ServerStatus' flows_rate averages over.
const rateWindow = time.Minute

// ServerStatus reports the ring's figures: flows held, capacity, flows
// seen since start (lost-event records included in both), uptime, and the
// rate of flows over the last minute.
func (o *Observer) ServerStatus(context.Context, *observer.ServerStatusRequest) (*observer.ServerStatusResponse, error) {
	now := o.now()
	oldest, next := o.flows.Bounds()
	return &observer.ServerStatusResponse{
		NumFlows:  next - oldest,
		MaxFlows:  uint64(o.flows.Capacity()),
		SeenFlows: next,
		UptimeNs:  uint64(now.Sub(o.started).Nanoseconds()),
		Version:   "cellium " + version.Get().Version,
		FlowsRate: o.flowsRate(now),
	}, nil
}

// flowsRate is flows per second over the last minute (or since start, if
// that is shorter), counted from the newest flows in the ring. When the
// ring holds less than the window, it averages over what the ring holds.
func (o *Observer) flowsRate(now time.Time) float64 {
	window := min(rateWindow, now.Sub(o.started))
	from := now.Add(-window)
	oldest, next := o.flows.Bounds()
	count := 0
	var oldestCounted time.Time
	exhausted := o.flows.ScanBack(next, func(r *observer.GetFlowsResponse) bool {
		t := r.GetTime().AsTime()
		if t.Before(from) {
			return false
		}
		if r.GetFlow() != nil {
			count++
			oldestCounted = t
		}
		return true
	})
	if exhausted && oldest > 0 && count > 0 {
		// The ring dropped flows of the window: average over what it holds.
		window = now.Sub(oldestCounted)
	}
	if window <= 0 {
		return 0
	}
	return float64(count) / window.Seconds()
}
