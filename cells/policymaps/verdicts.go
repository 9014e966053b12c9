package policymaps

import (
	"context"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cellium/cellium/cells/metrics"
	"github.com/cellium/cellium/cells/monitor"
	"github.com/cellium/cellium/pkg/monitorapi"
)

// verdictBuffer is the events the verdict counter may fall behind by
// before it loses some (counted by the monitor under subscriber
// "policy-verdicts").
const verdictBuffer = 4096

// verdictCounter counts the datapath's policy decisions from its events:
// a policy-verdict event per connection an isolated endpoint's policy let
// open, a drop event with reason policy-denied per packet it refused.
type verdictCounter struct {
	verdicts *prometheus.CounterVec
}

func newVerdictCounter() (*verdictCounter, metrics.Collectors) {
	v := &verdictCounter{verdicts: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "cellium", Subsystem: "policy", Name: "verdicts_total",
		Help: "Policy decisions of the datapath in isolated directions, by direction (ingress, egress), verdict (allowed: new connections; denied: packets) and reason (the kind of entry that allowed, or policy-denied)",
	}, []string{"direction", "verdict", "reason"})}
	return v, metrics.NewCollectors(v.verdicts)
}

// count counts ev if it is a policy decision.
func (v *verdictCounter) count(ev monitorapi.Event) {
	switch ev := ev.(type) {
	case *monitorapi.PolicyVerdictEvent:
		v.verdicts.WithLabelValues(ev.Flow.Direction.String(), "allowed", ev.Match.String()).Inc()
	case *monitorapi.DropEvent:
		if ev.Reason == monitorapi.DropPolicyDenied {
			v.verdicts.WithLabelValues(ev.Flow.Direction.String(), "denied", ev.Reason.String()).Inc()
		}
	}
}

type verdictParams struct {
	cell.In

	Counter *verdictCounter
	Jobs    job.Group
	// Monitor is absent where there is no datapath event reader (tests
	// of the maps alone): nothing is counted then.
	Monitor *monitor.Monitor `optional:"true"`
}

// registerVerdictCounter subscribes the counter to the monitor, before
// anything starts (a subscription is a channel: no I/O), so that it sees
// every event from the first, and counts until the monitor closes the
// subscription when the agent stops.
func registerVerdictCounter(p verdictParams) {
	if p.Monitor == nil {
		return
	}
	sub := p.Monitor.Subscribe("policy-verdicts", verdictBuffer)
	p.Jobs.Add(job.OneShot("count-verdicts", func(ctx context.Context, health cell.Health) error {
		health.OK("Counting")
		for {
			select {
			case <-ctx.Done():
				sub.Close()
				return nil
			case ev, ok := <-sub.Events():
				if !ok {
					return nil
				}
				p.Counter.count(ev)
			}
		}
	}))
}
