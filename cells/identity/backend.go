package identity

import (
	"github.com/cellium/cellium/pkg/apiv1"
)

// Backend is where the cluster's identities live, how many of them this
// agent holds, and how far it follows the store (GET /v1/identity-backend,
// `agent status`).
func (a *Allocator) Backend() apiv1.IdentityBackend {
	b := apiv1.IdentityBackend{Mode: string(a.mode)}
	if s := a.backendState.Load(); s != nil {
		b.State = *s
	}
	var counts func(*Identity) bool
	switch a.mode {
	case ModeCRD:
		b.Store = "CelliumIdentity objects"
		counts = func(id *Identity) bool { return id.Source == SourceCRD }
	case ModeKVStore:
		b.Store = "kvstore master keys"
		counts = func(id *Identity) bool { return id.Source == SourceKVStore }
	default:
		b.Store = "node-local, checkpointed in " + a.path
		counts = func(id *Identity) bool { return id.Kind == KindLocal }
	}
	for id := range a.tbl.All(a.db.ReadTxn()) {
		if counts(id) {
			b.Known++
		}
	}
	return b
}

// Backend states.
const (
	stateRegistering  = "registering CRDs"
	stateListing      = "listing"
	stateWatching     = "watching"
	stateWatchFailing = "watch failing, retrying"
	stateCheckpointed = "checkpointed"
)

func (a *Allocator) setBackendState(s string) { a.backendState.Store(&s) }
