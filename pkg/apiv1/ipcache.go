package apiv1

// PathIPCache serves the ipcache: GET lists every prefix, GET
// PathIPCache/{ip} the longest prefix that holds an address.
const PathIPCache = "/v1/ipcache"

// IPCacheEntry is a prefix, the identity the datapath gets for it, and
// where that comes from.
type IPCacheEntry struct {
	Prefix   string `json:"prefix"`
	Identity uint32 `json:"identity"`
	// Source is the winning claim's: local, reserved, kvstore, k8s or
	// restored.
	Source    string `json:"source"`
	HostIP    string `json:"hostIP,omitempty"`
	Namespace string `json:"namespace,omitempty"`
	PodName   string `json:"podName,omitempty"`
	// Shadowed are the weaker sources that claim the prefix too.
	Shadowed []string `json:"shadowed,omitempty"`
	// Status says whether the map has it yet.
	Status string `json:"status"`
}
