package monitor

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/cellium/cellium/cells/api"
	"github.com/cellium/cellium/pkg/apiv1"
	"github.com/cellium/cellium/pkg/monitorapi"
)

// apiRoutes serves GET /v1/monitor, the stream `agent monitor` reads.
func apiRoutes(m *Monitor) api.Routes {
	return api.NewRoutes(api.Route{Method: http.MethodGet, Path: apiv1.PathMonitor, Stream: m.stream})
}

// lostCheck is how often a stream checks whether it or the datapath lost
// events, to tell its client.
const lostCheck = time.Second

// parseKinds reads ?type=trace,drop: nil for every kind.
func parseKinds(param string) (map[string]bool, error) {
	if param == "" {
		return nil, nil
	}
	kinds := map[string]bool{}
	for _, k := range strings.Split(param, ",") {
		if !slices.Contains(monitorapi.Kinds, k) {
			return nil, api.BadRequest("invalid type %q: want one or more of %s, separated by commas", k, strings.Join(monitorapi.Kinds, ", "))
		}
		kinds[k] = true
	}
	return kinds, nil
}

// stream sends the monitor's events to one client until it goes or the
// agent stops. Its subscription has --monitor-api-buffer events of room:
// a client that reads more slowly than events come loses some, and a lost
// marker says how many, as it does for events the datapath lost.
func (m *Monitor) stream(r *http.Request, s *api.Stream) error {
	q, err := api.QueryParams(r, "type")
	if err != nil {
		return err
	}
	kinds, err := parseKinds(q.Get("type"))
	if err != nil {
		return err
	}
	sub := m.Subscribe("api", m.cfg.MonitorAPIBuffer)
	defer sub.Close()
	// The client learns that it is subscribed from the status line.
	if err := s.Flush(); err != nil {
		return err
	}

	reported := apiv1.MonitorLost{Datapath: m.Lost()}
	tick := time.NewTicker(lostCheck)
	defer tick.Stop()
	for {
		select {
		case <-r.Context().Done():
			return nil
		case <-tick.C:
		case ev, ok := <-sub.Events():
			if !ok {
				// The monitor stopped.
				return nil
			}
			if err := m.send(s, ev, kinds); err != nil {
				return err
			}
			// Send what else is waiting in the same write.
			for range len(sub.Events()) {
				if err := m.send(s, <-sub.Events(), kinds); err != nil {
					return err
				}
			}
		}
		// Losses since the last marker: after the events, and at least
		// every lostCheck when none come.
		if now := (apiv1.MonitorLost{Stream: sub.Lost(), Datapath: m.Lost()}); now != reported {
			delta := apiv1.MonitorLost{Stream: now.Stream - reported.Stream, Datapath: now.Datapath - reported.Datapath}
			reported = now
			if err := s.Send(apiv1.MonitorMessage{Kind: apiv1.MonitorLostKind, Lost: &delta}); err != nil {
				return err
			}
		}
		if err := s.Flush(); err != nil {
			return err
		}
	}
}

func (m *Monitor) send(s *api.Stream, ev monitorapi.Event, kinds map[string]bool) error {
	if ev == nil || (kinds != nil && !kinds[ev.Kind()]) {
		return nil
	}
	raw, err := json.Marshal(ev)
	if err != nil {
		return fmt.Errorf("encode %s event: %w", ev.Kind(), err)
	}
	return s.Send(apiv1.MonitorMessage{Kind: ev.Kind(), Event: raw})
}
