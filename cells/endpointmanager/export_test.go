package endpointmanager

import (
	"context"
)

// RefreshHostRoutes compares every endpoint's host routes with the kernel
// and puts back what is missing, as the periodic refresh does.
func (m *Manager) RefreshHostRoutes() { m.repairHostRoutes(context.Background(), m.Endpoints()) }

// ReidentifyFrom moves the endpoint last seen as stale to the identity of
// the inputs derive gives it, as a pod or namespace event does.
func (m *Manager) ReidentifyFrom(stale *Endpoint, derive func(*Endpoint) *Endpoint) {
	m.reidentify(context.Background(), stale, "test", derive)
}

// FailStateWrites makes the manager's writes of state files in phase ph
// fail with err.
func (m *Manager) FailStateWrites(ph string, err error) {
	m.states.fault = func(p phase) error {
		if string(p) == ph {
			return err
		}
		return nil
	}
}

// MarkRoutingFailed marks ep not ready with err as a restored endpoint's
// routing that failed does, after it let go of the container's lock.
func (m *Manager) MarkRoutingFailed(ep *Endpoint, err error) error {
	return m.markState(ep, Starting, NotReady, err)
}
