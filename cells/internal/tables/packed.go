package tables

import (
	"encoding/json"
	"time"

	"github.com/cilium/statedb/reconciler"
)

// PackedStatus holds a reconciler.Status in 24 bytes instead of 56, for a
// row kept per object of a large table (a frontend per Service address):
// the time as Unix nanoseconds instead of a time.Time, and the kind in the
// low bits of the ID. The reconciler's IDs count up from 1 in one process,
// so the 61 bits left are never short. Its JSON is the Status's.
//
// The time loses its monotonic reading, so "how long ago" follows the
// wall clock: what a status shows, and what the reconciler's refresh
// interval is measured with, which a clock step moves by the step once.
type PackedStatus struct {
	updatedAt int64
	err       *string
	// idKind is the ID shifted left by kindBits, ORed with the kind's
	// position in packedKinds.
	idKind uint64
}

const kindBits = 3

// packedKinds are the kinds a PackedStatus holds, by position; Unset, the
// zero Status's, is 0 so that the zero PackedStatus is the zero Status.
var packedKinds = [...]reconciler.StatusKind{
	reconciler.StatusKindUnset, reconciler.StatusKindPending, reconciler.StatusKindRefreshing,
	reconciler.StatusKindDone, reconciler.StatusKindError,
}

// PackStatus is s packed.
func PackStatus(s reconciler.Status) PackedStatus {
	p := PackedStatus{err: s.Error, idKind: s.ID << kindBits}
	if !s.UpdatedAt.IsZero() {
		p.updatedAt = s.UpdatedAt.UnixNano()
	}
	for i, k := range packedKinds {
		if k == s.Kind {
			p.idKind |= uint64(i)
			break
		}
	}
	return p
}

// Unpack is the Status p holds.
func (p PackedStatus) Unpack() reconciler.Status {
	s := reconciler.Status{
		Error: p.err,
		ID:    p.idKind >> kindBits,
		Kind:  p.Kind(),
	}
	if p.updatedAt != 0 {
		s.UpdatedAt = time.Unix(0, p.updatedAt)
	}
	return s
}

// Kind is the status's kind, without unpacking the rest.
func (p PackedStatus) Kind() reconciler.StatusKind {
	if i := p.idKind & (1<<kindBits - 1); i < uint64(len(packedKinds)) {
		return packedKinds[i]
	}
	return reconciler.StatusKindUnset // not written by PackStatus

}

func (p PackedStatus) MarshalJSON() ([]byte, error) { return json.Marshal(p.Unpack()) }

func (p *PackedStatus) UnmarshalJSON(b []byte) error {
	var s reconciler.Status
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	*p = PackStatus(s)
	return nil
}
