package endpointmanager

import (
	"context"
	"time"
)

// RefreshHostRoutes compares every endpoint's host routes with the kernel
// and puts back what is missing, as the periodic refresh does.
func (m *Manager) RefreshHostRoutes() { m.repairHostRoutes(context.Background(), m.Endpoints()) }

// ReidentifyFrom moves the endpoint last seen as stale to the identity of
// the inputs derive gives it, as a pod or namespace event does.
func (m *Manager) ReidentifyFrom(stale *Endpoint, derive func(*Endpoint) *Endpoint) {
	m.reidentify(context.Background(), stale, "test", derive)
}

// SetRestoreLiveBound sets how long a restored endpoint waits to be live
// before health says so, until the returned func puts the default back.
func SetRestoreLiveBound(d time.Duration) (reset func()) {
	old := restoreLiveBound.Swap(int64(d))
	return func() { restoreLiveBound.Store(old) }
}
