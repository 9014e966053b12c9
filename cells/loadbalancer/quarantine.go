package loadbalancer

import (
	"context"
	"fmt"
	"slices"
)

// BackendHealth takes backends out of service and puts them back: the hook
// for a backend health checker. A quarantined backend stays in the backends
// table, shown as quarantined, and no frontend uses it. Quarantine belongs
// to the backend's address, across all the services it serves, and lasts
// until Unquarantine or until the backend leaves its last EndpointSlice.
//
// The backends table has no index by address: quarantine is rare, and
// finding an address's rows is a scan of the table.
type BackendHealth struct {
	w *writer
}

func newBackendHealth(w *writer) *BackendHealth { return &BackendHealth{w} }

// Quarantine stops every frontend from using the backend at addr. It fails
// only when there is no such backend.
func (h *BackendHealth) Quarantine(addr L3n4Addr) error { return h.w.setQuarantined(addr, true) }

// Unquarantine lets frontends use the backend at addr again.
func (h *BackendHealth) Unquarantine(addr L3n4Addr) error { return h.w.setQuarantined(addr, false) }

// setQuarantined takes the backend at addr out of service or puts it back;
// see BackendHealth.
func (w *writer) setQuarantined(addr L3n4Addr, quarantined bool) (err error) {
	w.update(context.Background(), func(b *batch) {
		rows := w.rowsListing(b, addr)
		if len(rows) == 0 {
			err = fmt.Errorf("no backend %s", addr)
			return
		}
		if quarantined {
			w.quarantined[addr] = struct{}{}
		} else {
			delete(w.quarantined, addr)
		}
		for _, row := range rows {
			w.setSliceBackends(b, row.key(), row.Backends)
		}
	})
	return err
}

// withQuarantine is backends with Quarantined set as w.quarantined says:
// backends itself when that changes nothing, else a copy.
func (w *writer) withQuarantine(backends []Backend) []Backend {
	var out []Backend
	for i, be := range backends {
		_, q := w.quarantined[be.Address]
		if q != be.Quarantined {
			if out == nil {
				out = slices.Clone(backends)
			}
			out[i].Quarantined = q
		}
	}
	if out == nil {
		return backends
	}
	return out
}

// forgetQuarantined ends the quarantine of the addresses of removed that
// no backends row lists any more.
func (w *writer) forgetQuarantined(b *batch, removed []Backend) {
	if len(w.quarantined) == 0 {
		return
	}
	for _, be := range removed {
		if _, q := w.quarantined[be.Address]; q && len(w.rowsListing(b, be.Address)) == 0 {
			delete(w.quarantined, be.Address)
		}
	}
}

// rowsListing are the backends rows that list addr, as of the
// transaction: a scan of the table.
func (w *writer) rowsListing(b *batch, addr L3n4Addr) []*SliceBackends {
	var out []*SliceBackends
	for row := range w.tables.backends.All(b.txn) {
		if slices.ContainsFunc(row.Backends, func(be Backend) bool { return be.Address == addr }) {
			out = append(out, row)
		}
	}
	return out
}
