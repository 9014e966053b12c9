package apiv1

// PathIdentities serves the security identities: GET lists them, GET
// PathIdentities/{id} shows one (a number or a reserved name).
const PathIdentities = "/v1/identities"

// Identity is a security identity and its label set.
type Identity struct {
	ID uint32 `json:"id"`
	// Kind is reserved, cluster or local.
	Kind string `json:"kind"`
	// Source is where it comes from: reserved, local, kvstore (a master
	// key) or crd (a CelliumIdentity object).
	Source string   `json:"source"`
	Labels []string `json:"labels"`
	// Refs is how many endpoints of this node use it.
	Refs int `json:"refs"`
}
