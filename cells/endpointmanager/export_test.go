package endpointmanager

import "context"

// RefreshHostRoutes compares every endpoint's host routes with the kernel
// and puts back what is missing, as the periodic refresh does.
func (m *Manager) RefreshHostRoutes() { m.repairHostRoutes(context.Background(), m.Endpoints()) }
