package apiv1

import "encoding/json"

// PathMonitor streams the monitor's events (GET): datapath events and the
// agent's notifications, one MonitorMessage per line, for as long as the
// client stays. ?type=trace,drop narrows it to those kinds (trace, drop,
// sock-lb, agent).
const PathMonitor = "/v1/monitor"

// MonitorLostKind is the Kind of a MonitorMessage that reports lost
// events.
const MonitorLostKind = "lost"

// MonitorMessage is one line of GET /v1/monitor: an event, or a marker
// saying that events were lost.
type MonitorMessage struct {
	// Kind is the event's kind (pkg/monitorapi: trace, drop, sock-lb,
	// agent), or MonitorLostKind.
	Kind string `json:"kind"`
	// Event is the event as pkg/monitorapi encodes it in JSON.
	Event json.RawMessage `json:"event,omitempty"`
	// Lost is set on a marker.
	Lost *MonitorLost `json:"lost,omitempty"`
}

// MonitorLost counts events lost since the previous marker.
type MonitorLost struct {
	// Stream is how many events this stream lost because the client read
	// more slowly than they came: the agent never waits for a client. It
	// counts events of every kind, filtered or not.
	Stream uint64 `json:"stream,omitempty"`
	// Datapath is how many events the datapath could not write because
	// the ring buffer was full; every stream sees these.
	Datapath uint64 `json:"datapath,omitempty"`
}
