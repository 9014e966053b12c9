package apiv1

import "time"

// Paths of the kvstore routes.
const (
	// PathKVStore: GET the kvstore connection's status.
	PathKVStore = "/v1/kvstore"
	// PathKVStoreKeys: GET ?key=KEY[&recursive=true], keys relative to
	// --kvstore-prefix; read-only.
	PathKVStoreKeys = "/v1/kvstore/keys"
)

// KVStore is the kvstore connection's status.
type KVStore struct {
	// State is disabled, connecting, connected or quorum-lost.
	State     string    `json:"state"`
	Endpoints []string  `json:"endpoints,omitempty"`
	LastError string    `json:"lastError,omitempty"`
	Since     time.Time `json:"since"`
	// Leases and LeasedKeys count the agent's leases and the keys on them.
	Leases     int `json:"leases"`
	LeasedKeys int `json:"leasedKeys"`
}

// KVStoreKey is one key read from the kvstore.
type KVStoreKey struct {
	// Key is relative to --kvstore-prefix.
	Key         string `json:"key"`
	Value       string `json:"value"`
	ModRevision int64  `json:"modRevision,omitempty"`
	// Lease is the etcd lease the key lives on, 0 for none.
	Lease int64 `json:"lease,omitempty"`
}
