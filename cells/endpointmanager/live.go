package endpointmanager

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cellium/cellium/cells/metrics"
)

// LiveCondition is something a new endpoint needs in the datapath before it
// is routed, ready, and its CNI ADD answered. The cells that put endpoints
// into the datapath contribute one each to the value group "endpoint-live"
// (see LiveOut): the endpoint map, the programs on the host side, the
// endpoint's network policy. An agent without one of them (a test of a few
// cells, an agent without policy) does not wait for it.
type LiveCondition struct {
	// Name names the condition in errors, in the log and in the metric
	// cellium_endpoints_waiting{for=Name}.
	Name string
	// Live says whether the condition holds for ep, which the endpoint
	// manager wrote at revision rev of the endpoints table; when it does
	// not, why, and a channel that is closed once that may have changed
	// (nil: a change of ep's row, which the waiter watches anyway). It
	// reads the tables it needs in transactions of its own, taken when it
	// is called.
	Live func(ep *Endpoint, rev statedb.Revision) (ok bool, why string, watch <-chan struct{})
}

// LiveOut contributes a LiveCondition.
type LiveOut struct {
	cell.Out
	Condition LiveCondition `group:"endpoint-live"`
}

// StatusCondition is the LiveCondition of a reconciler of the endpoints
// table: the endpoint's status field it writes is Done.
func StatusCondition(name string, status func(*Endpoint) reconciler.Status) LiveOut {
	return LiveOut{Condition: LiveCondition{Name: name, Live: func(ep *Endpoint, _ statedb.Revision) (bool, string, <-chan struct{}) {
		s := status(ep)
		switch s.Kind {
		case reconciler.StatusKindDone:
			return true, "", nil
		case reconciler.StatusKindError:
			return false, s.GetError(), nil
		}
		return false, s.Kind.String(), nil
	}}}
}

// EndpointPolicy is how an endpoint's network policy stands: the policy
// revision its entries were computed from, the directions it is isolated
// in, its entries, and whether they and its enforcement are in the maps.
type EndpointPolicy struct {
	Revision uint64
	Ingress  bool
	Egress   bool
	Entries  int
	// Realized: every entry and the enforcement are in the maps; else
	// Error says what failed, if anything did.
	Realized bool
	Error    string
}

// PolicyView shows an endpoint's policy; the policy cell provides it.
type PolicyView interface {
	// EndpointPolicy is the policy of endpoint id in txn; false when it
	// has none computed.
	EndpointPolicy(txn statedb.ReadTxn, id uint16) (EndpointPolicy, bool)
}

// liveMetrics counts the creations waiting for each condition, and how
// long each step of the creations took.
type liveMetrics struct {
	waiting *prometheus.GaugeVec
	steps   *prometheus.HistogramVec
}

func newLiveMetrics() (*liveMetrics, metrics.Collectors) {
	m := &liveMetrics{waiting: prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "cellium", Name: "endpoints_waiting",
		Help: "New endpoints whose CNI ADD waits for a part of the datapath (for: endpoint-map, programs, policy)",
	}, []string{"for"}), steps: prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "cellium", Name: "endpoint_create_step_seconds",
		Help:    "How long each step of the endpoint creations (CNI ADDs) that succeeded took (step: netns, identity, lock, ipam, state, veth, programs, insert, live, route, state-ready, ready)",
		Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10),
	}, []string{"step"})}
	return m, metrics.NewCollectors(m.waiting, m.steps)
}

// waitLive waits until every live condition holds for the endpoint ep,
// written at rev, or ctx ends, and returns when each was first seen to
// hold, from the start of the wait, for the log. Each condition is
// counted in cellium_endpoints_waiting while it does not hold. It ends
// with errEndpointGone once ep's row is gone from the table, is another
// endpoint's (see sameEndpoint), or is being deleted.
//
// With stall, once stall.after is closed, stall.report is called with
// what is still pending (condition: why) every time that is computed.
func (m *Manager) waitLive(ctx context.Context, ep *Endpoint, rev statedb.Revision, stall *liveStall) ([]any, error) {
	start := time.Now()
	var took []any
	held := map[string]bool{}
	waiting := map[string]bool{}
	defer func() {
		for name := range waiting {
			m.liveMetrics.waiting.WithLabelValues(name).Dec()
		}
	}()
	for {
		cur, _, watch, found := m.tbl.GetWatch(m.db.ReadTxn(), EndpointID.Query(ep.ID))
		if !found || !sameEndpoint(cur, ep) || cur.State == Deleting {
			return nil, fmt.Errorf("endpoint %d (container %s) waited for the datapath: %w", ep.ID, ep.ContainerID, errEndpointGone)
		}
		ws := statedb.NewWatchSet()
		ws.Add(watch)
		var pending []string
		for _, c := range m.live {
			ok, why, w := c.Live(cur, rev)
			if ok && !held[c.Name] {
				held[c.Name] = true
				took = append(took, c.Name, time.Since(start).Round(time.Microsecond))
			}
			if ok {
				if waiting[c.Name] {
					delete(waiting, c.Name)
					m.liveMetrics.waiting.WithLabelValues(c.Name).Dec()
				}
				continue
			}
			if !waiting[c.Name] {
				waiting[c.Name] = true
				m.liveMetrics.waiting.WithLabelValues(c.Name).Inc()
			}
			pending = append(pending, c.Name+": "+why)
			if w != nil {
				ws.Add(w)
			}
		}
		if len(pending) == 0 {
			return took, nil
		}
		if stall != nil {
			select {
			case <-stall.after:
				stall.report(cur, pending)
			default:
				ws.Add(stall.after)
			}
		}
		if _, err := ws.Wait(ctx, 0); err != nil {
			return nil, errorf(ErrNotReady, "endpoint %d (container %s) is not in the datapath yet (%s): %v",
				ep.ID, ep.ContainerID, strings.Join(pending, "; "), err)
		}
	}
}

// errEndpointGone: the endpoint a wait was for was deleted meanwhile.
var errEndpointGone = errors.New("the endpoint was deleted meanwhile")

// sameEndpoint says whether the row cur is the endpoint ep, not one that
// took its ID (or its container, after a DEL and a new ADD) since.
func sameEndpoint(cur, ep *Endpoint) bool {
	return cur.ID == ep.ID && cur.ContainerID == ep.ContainerID && cur.Created.Equal(ep.Created)
}

// pendingLive is what of the live conditions does not hold for ep,
// written at rev (condition: why); nothing when it is live.
func (m *Manager) pendingLive(ep *Endpoint, rev statedb.Revision) []string {
	var pending []string
	for _, c := range m.live {
		if ok, why, _ := c.Live(ep, rev); !ok {
			pending = append(pending, c.Name+": "+why)
		}
	}
	return pending
}

// liveStall is what a wait for the live conditions reports once it has
// waited longer than it should (see waitLive).
type liveStall struct {
	after  <-chan struct{}
	report func(ep *Endpoint, pending []string)
}

// reportStalled shows, in the health scope restore-live, the restored
// endpoints that have waited longer than --endpoint-restore-live-report
// (m.liveReport) to be live in
// the datapath, and what each waits for; done ends the entry of the
// container. The scope is made with the first such endpoint and says OK
// once none waits any more.
func (m *Manager) reportStalled(containerID, what string, done bool) {
	m.stalledMu.Lock()
	defer m.stalledMu.Unlock()
	if done {
		if _, ok := m.stalled[containerID]; !ok {
			return
		}
		delete(m.stalled, containerID)
	} else {
		if m.stalled == nil {
			m.stalled = map[string]string{}
		}
		if m.stalled[containerID] == what {
			return
		}
		m.stalled[containerID] = what
	}
	if m.stalledHealth == nil {
		m.stalledHealth = m.health.NewScope("restore-live")
	}
	if len(m.stalled) == 0 {
		m.stalledHealth.OK("Every restored endpoint is live in the datapath")
		return
	}
	var details []string
	for _, id := range slices.Sorted(maps.Keys(m.stalled)) {
		details = append(details, m.stalled[id])
	}
	m.stalledHealth.Degraded(fmt.Sprintf("%d restored endpoint(s) not live in the datapath after %v; their host side stays down",
		len(m.stalled), m.liveReport), errors.New(strings.Join(details, "; ")))
}
