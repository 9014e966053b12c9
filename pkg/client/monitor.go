package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"

	"github.com/cellium/cellium/pkg/apiv1"
	"github.com/cellium/cellium/pkg/monitorapi"
)

// Monitor streams the agent's monitor events (GET /v1/monitor) of the given
// kinds (monitorapi.KindTrace, ...; none means all). It returns once the
// agent has subscribed the stream: every event from then on reaches it,
// unless the stream reads too slowly, which lost markers report.
func (c *Client) Monitor(ctx context.Context, kinds ...string) (*Stream[apiv1.MonitorMessage], error) {
	var q url.Values
	if len(kinds) > 0 {
		q = url.Values{"type": {strings.Join(kinds, ",")}}
	}
	return OpenStream[apiv1.MonitorMessage](ctx, c, apiv1.PathMonitor, q)
}

// MonitorEvent decodes the event of a monitor message; a lost marker has
// none.
func MonitorEvent(m apiv1.MonitorMessage) (monitorapi.Event, error) {
	var ev monitorapi.Event
	switch m.Kind {
	case monitorapi.KindTrace:
		ev = &monitorapi.TraceEvent{}
	case monitorapi.KindDrop:
		ev = &monitorapi.DropEvent{}
	case monitorapi.KindSockLB:
		ev = &monitorapi.SockLBEvent{}
	case monitorapi.KindPolicy:
		ev = &monitorapi.PolicyVerdictEvent{}
	case monitorapi.KindAgent:
		ev = &monitorapi.AgentEvent{}
	case apiv1.MonitorLostKind:
		return nil, fmt.Errorf("a %s marker carries no event", m.Kind)
	default:
		return nil, fmt.Errorf("monitor message of unknown kind %q: is the agent newer than this client?", m.Kind)
	}
	if err := json.Unmarshal(m.Event, ev); err != nil {
		return nil, fmt.Errorf("decode %s event: %w", m.Kind, err)
	}
	return ev, nil
}
