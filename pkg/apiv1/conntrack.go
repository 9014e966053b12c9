package apiv1

import "time"

// Paths of the conntrack routes.
const (
	// PathConntrack lists conntrack entries (GET; ?family=4|6,
	// ?endpoint=ID and ?limit=N narrow the list; ?after=CURSOR continues
	// one that was cut short).
	PathConntrack = "/v1/conntrack"
	// PathConntrackFlush deletes every conntrack entry (POST).
	PathConntrackFlush = "/v1/conntrack/flush"
	// PathConntrackGC is the garbage collector's status (GET); POST runs a
	// pass now and answers when it is done.
	PathConntrackGC = "/v1/conntrack/gc"
)

// ConntrackEntries is the answer of GET /v1/conntrack.
type ConntrackEntries struct {
	Entries []ConntrackEntry `json:"entries"`
	// Truncated is true when more entries matched than ?limit.
	Truncated bool `json:"truncated,omitempty"`
	// Next, when Truncated, is the cursor of the last entry: ?after=Next
	// lists the entries that follow it.
	Next string `json:"next,omitempty"`
}

// ConntrackEntry is one connection the datapath tracks, decoded. The tuple
// is as the initiator sent it; replies travel the other way.
type ConntrackEntry struct {
	// Map is the conntrack map that holds the entry, e.g. cellium_ct4_tcp.
	Map    string `json:"map"`
	Family int    `json:"family"`
	// Protocol is TCP, UDP, ICMP, ICMPv6, SCTP, or proto-N.
	Protocol string `json:"protocol"`
	// Direction is "out" for a connection the endpoint opened (the entry
	// of the from-endpoint program), "in" for one opened towards it (the
	// to-endpoint program's).
	Direction string `json:"direction"`
	Source    string `json:"source"`
	SrcPort   uint16 `json:"srcPort"`
	// Destination and DstPort: for ICMP echo, SrcPort is the echo
	// identifier and DstPort is 0.
	Destination string `json:"destination"`
	DstPort     uint16 `json:"dstPort"`
	// State is the connection's state: NEW, SYN_SENT, ESTABLISHED,
	// HALF_CLOSED or CLOSING.
	State string `json:"state"`
	// Flags are the entry's CTF_* flags by name.
	Flags []string `json:"flags,omitempty"`
	// LifetimeSeconds is how long the entry has left before the garbage
	// collector may remove it; 0 or less when it has expired.
	LifetimeSeconds int64 `json:"lifetimeSeconds"`
	// EndpointID is the local endpoint the connection belongs to; 0 for
	// none.
	EndpointID uint16 `json:"endpointID"`
	PacketsTx  uint64 `json:"packetsTx"`
	BytesTx    uint64 `json:"bytesTx"`
	PacketsRx  uint64 `json:"packetsRx"`
	BytesRx    uint64 `json:"bytesRx"`
	// LastTxSecondsAgo and LastRxSecondsAgo: when a packet last went each
	// way; -1 for never.
	LastTxSecondsAgo int64 `json:"lastTxSecondsAgo"`
	LastRxSecondsAgo int64 `json:"lastRxSecondsAgo"`
}

// ConntrackFlush is the answer of POST /v1/conntrack/flush.
type ConntrackFlush struct {
	// Deleted is the number of entries removed from all maps.
	Deleted int                 `json:"deleted"`
	Maps    []ConntrackMapFlush `json:"maps"`
}

// ConntrackMapFlush is what a flush removed from one map.
type ConntrackMapFlush struct {
	Map     string `json:"map"`
	Deleted int    `json:"deleted"`
}

// ConntrackGC is the answer of GET /v1/conntrack/gc.
type ConntrackGC struct {
	// Waiting, while not empty, says what the first pass waits for.
	Waiting string `json:"waiting,omitempty"`
	// Passes counts the passes since the agent started, failed ones
	// included.
	Passes uint64 `json:"passes"`
	// IntervalMode is "adaptive", or "fixed" by --conntrack-gc-interval.
	IntervalMode string `json:"intervalMode"`
	// IntervalSeconds is the current wait between passes.
	IntervalSeconds int64 `json:"intervalSeconds"`
	// Last is the latest pass, if there was one.
	Last *ConntrackGCPass `json:"last,omitempty"`
}

// ConntrackGCPass is one garbage collection pass, the answer of POST
// /v1/conntrack/gc.
type ConntrackGCPass struct {
	// Number counts passes from 1, the first after the agent started:
	// the one that also removes the entries of endpoints that are gone.
	Number          uint64    `json:"number"`
	Start           time.Time `json:"start"`
	DurationSeconds float64   `json:"durationSeconds"`
	Scanned         int       `json:"scanned"`
	Deleted         int       `json:"deleted"`
	// Share is the largest share of a map's capacity that the pass found
	// expired, which the adaptive interval follows.
	Share float64 `json:"share"`
	// IntervalSeconds is the wait until the next pass, as this pass
	// decided it.
	IntervalSeconds int64            `json:"intervalSeconds"`
	Maps            []ConntrackGCMap `json:"maps"`
	// Error says why the pass failed; a failed pass may have deleted some
	// entries.
	Error string `json:"error,omitempty"`
}

// ConntrackGCMap is what a pass did in one map.
type ConntrackGCMap struct {
	Map      string `json:"map"`
	Capacity int    `json:"capacity"`
	Scanned  int    `json:"scanned"`
	// Expired entries had outlived their lifetime; EndpointGone entries
	// (first pass only) belonged to an endpoint the agent no longer has.
	Expired      int `json:"expired"`
	EndpointGone int `json:"endpointGone"`
}
