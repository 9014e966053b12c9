package apiv1

// MapEntry is one entry of a BPF map, decoded: keys and values print as
// their Go types do (pkg/lbmap's print addresses, ports and flags).
type MapEntry struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// MapDump is the answer of GET /v1/maps/{name}/entries[?limit=N].
type MapDump struct {
	Map     Map        `json:"map"`
	Entries []MapEntry `json:"entries"`
	// Truncated is true when the map holds more than the limit.
	Truncated bool `json:"truncated,omitempty"`
}
