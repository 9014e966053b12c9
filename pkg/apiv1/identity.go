package apiv1

// PathIdentities serves the security identities: GET lists them, GET
// PathIdentities/{id} shows one (a number or a reserved name).
const PathIdentities = "/v1/identities"

// Identity is a security identity and its label set.
type Identity struct {
	ID uint32 `json:"id"`
	// Kind is reserved, cluster (through the kvstore) or local.
	Kind   string   `json:"kind"`
	Labels []string `json:"labels"`
	// Refs is how many endpoints of this node use it.
	Refs int `json:"refs"`
}
