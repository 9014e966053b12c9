package clusterhealth

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
)

// Probe is the result of one probe of one path to a node.
type Probe struct {
	// Addr is what was probed; invalid when the node has no such address
	// (no health endpoint, say): then nothing was probed.
	Addr    netip.Addr    `json:"addr,omitzero"`
	OK      bool          `json:"ok"`
	Latency time.Duration `json:"latency,omitempty"`
	Error   string        `json:"error,omitempty"`
}

func (p Probe) probed() bool { return p.Addr.IsValid() }

func (p Probe) String() string {
	switch {
	case !p.probed():
		return "-"
	case p.OK:
		return "ok " + p.Latency.Round(10*time.Microsecond).String()
	}
	return "failed: " + p.Error
}

// NodeHealth is one row of the table "node-health": the last probes of one
// node's paths. Rows are immutable.
type NodeHealth struct {
	Node  string `json:"node"`
	Local bool   `json:"local"`
	// HostICMP and HostHTTP probe the node's address; EndpointHTTP its
	// health endpoint, through the pod network (the tunnel or the native
	// routes).
	HostICMP     Probe     `json:"hostICMP"`
	HostHTTP     Probe     `json:"hostHTTP"`
	EndpointHTTP Probe     `json:"endpointHTTP"`
	LastProbe    time.Time `json:"lastProbe"`
}

var _ statedb.TableWritable = &NodeHealth{}

// Reachable says whether every path probed answered.
func (n *NodeHealth) Reachable() bool { return len(n.Failed()) == 0 }

// Failed names the paths that did not answer.
func (n *NodeHealth) Failed() []string {
	var out []string
	for _, p := range []struct {
		name  string
		probe Probe
	}{{"host ICMP", n.HostICMP}, {"host HTTP", n.HostHTTP}, {"endpoint HTTP", n.EndpointHTTP}} {
		if p.name != "endpoint HTTP" && !p.probe.probed() {
			out = append(out, p.name+" (no node address)")
		} else if p.probe.probed() && !p.probe.OK {
			out = append(out, p.name+": "+p.probe.Error)
		}
	}
	return out
}

func (n *NodeHealth) TableHeader() []string {
	return []string{"Node", "Local", "HostICMP", "HostHTTP", "EndpointHTTP", "LastProbe"}
}

func (n *NodeHealth) TableRow() []string {
	return []string{n.Node, strconv.FormatBool(n.Local), n.HostICMP.String(), n.HostHTTP.String(), n.EndpointHTTP.String(),
		n.LastProbe.Format(time.RFC3339)}
}

// Summary is the line operators read first: "Cluster health: 2/3
// reachable".
func Summary(rows []*NodeHealth) string {
	ok := 0
	var failed []string
	for _, r := range rows {
		if r.Reachable() {
			ok++
		} else {
			failed = append(failed, fmt.Sprintf("%s (%s)", r.Node, strings.Join(r.Failed(), "; ")))
		}
	}
	s := fmt.Sprintf("Cluster health: %d/%d reachable", ok, len(rows))
	if len(failed) > 0 {
		s += "; unreachable: " + strings.Join(failed, ", ")
	}
	return s
}

// NodeHealthNode indexes the table by node name.
var NodeHealthNode = statedb.Index[*NodeHealth, string]{
	Name:       "node",
	FromObject: func(n *NodeHealth) index.KeySet { return index.NewKeySet(index.String(n.Node)) },
	FromKey:    index.String,
	FromString: index.FromString,
	Unique:     true,
}

// TableName is the name of the node-health table.
const TableName = "node-health"

func newTable(db *statedb.DB) (statedb.RWTable[*NodeHealth], error) {
	return statedb.NewTable(db, TableName, NodeHealthNode)
}
