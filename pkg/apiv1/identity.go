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

// PathIdentityBackend serves the identity backend's state: GET.
const PathIdentityBackend = "/v1/identity-backend"

// IdentityBackend is where the cluster's identities live and how far the
// agent follows them: `agent status`'s Identities line.
type IdentityBackend struct {
	// Mode is crd, kvstore or local: --identity-allocation-mode, auto
	// resolved.
	Mode string `json:"mode"`
	// Store is what holds them: CelliumIdentity objects, the kvstore's
	// master keys, or this node's checkpoint file.
	Store string `json:"store"`
	// Known is how many identities of the store the agent holds: cluster
	// ones (crd, kvstore), or this node's local ones.
	Known int `json:"known"`
	// State is crd: registering CRDs, listing, watching, "watch failing,
	// retrying"; kvstore: listing, watching; local: checkpointed.
	State string `json:"state"`
}
