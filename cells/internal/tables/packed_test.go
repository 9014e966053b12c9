package tables

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/statedb/reconciler"
)

// A status packs and unpacks to itself (the time to the nanosecond, without
// its monotonic reading), and its JSON is the Status's, both ways.
func TestPackedStatus(t *testing.T) {
	if size := unsafe.Sizeof(PackedStatus{}); size != 24 {
		t.Errorf("PackedStatus is %d bytes, want 24", size)
	}
	errStatus := reconciler.StatusError(errors.New("map full"))
	errStatus.ID = 1<<61 - 1 // the largest ID it keeps
	for _, s := range []reconciler.Status{
		{},
		reconciler.StatusPending(),
		reconciler.StatusRefreshing(),
		reconciler.StatusDone(),
		errStatus,
		{Kind: reconciler.StatusKindDone, UpdatedAt: time.Date(2026, 11, 26, 8, 0, 0, 123456789, time.UTC), ID: 7},
	} {
		p := PackStatus(s)
		got := p.Unpack()
		want := s
		want.UpdatedAt = s.UpdatedAt.Round(0) // no monotonic reading
		if got.Kind != want.Kind || got.ID != want.ID || !got.UpdatedAt.Equal(want.UpdatedAt) ||
			got.UpdatedAt.IsZero() != want.UpdatedAt.IsZero() || !reflect.DeepEqual(got.Error, want.Error) {
			t.Errorf("%+v unpacked as %+v", want, got)
		}
		if p.Kind() != s.Kind {
			t.Errorf("%+v: Kind() = %s", s, p.Kind())
		}

		wantJSON, _ := json.Marshal(want)
		gotJSON, err := json.Marshal(p)
		if err != nil || string(gotJSON) != string(wantJSON) {
			t.Errorf("JSON %s (%v), want %s", gotJSON, err, wantJSON)
		}
		var back PackedStatus
		if err := json.Unmarshal(wantJSON, &back); err != nil || back.Kind() != s.Kind || back.Unpack().ID != s.ID ||
			!back.Unpack().UpdatedAt.Equal(want.UpdatedAt) || back.Unpack().GetError() != s.GetError() {
			t.Errorf("JSON %s read back as %+v (%v)", wantJSON, back.Unpack(), err)
		}
	}
	var bad PackedStatus
	if err := json.Unmarshal([]byte(`{"kind": 3}`), &bad); err == nil {
		t.Errorf("a status with a numeric kind was read: %+v", bad.Unpack())
	}
}
