package loadbalancer

// BackendHealth takes backends out of service and puts them back: the hook
// for a backend health checker. A quarantined backend stays in the backends
// table, shown as quarantined, and no frontend uses it. Quarantine belongs
// to the backend's address, across all the services it serves, and lasts
// until Unquarantine or until the backend leaves its last EndpointSlice.
type BackendHealth struct {
	w *writer
}

func newBackendHealth(w *writer) *BackendHealth { return &BackendHealth{w} }

// Quarantine stops every frontend from using the backend at addr. It fails
// only when there is no such backend.
func (h *BackendHealth) Quarantine(addr L3n4Addr) error { return h.w.setQuarantined(addr, true) }

// Unquarantine lets frontends use the backend at addr again.
func (h *BackendHealth) Unquarantine(addr L3n4Addr) error { return h.w.setQuarantined(addr, false) }
