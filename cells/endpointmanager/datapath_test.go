package endpointmanager

import (
	"errors"
	"slices"
	"testing"

	"github.com/cilium/statedb/reconciler"
)

// The API's datapath status joins the endpoint map's and the programs':
// done only when both are, an error when either failed.
func TestDatapathStatus(t *testing.T) {
	done, pending := reconciler.StatusDone(), reconciler.StatusPending()
	mapErr := reconciler.StatusError(errors.New("endpoint 1, 10.244.0.2: map full"))
	progErr := reconciler.StatusError(errors.New("endpoint 1: attach the ingress program to lxc1 (ifindex 9): no such device"))
	for _, tc := range []struct {
		name              string
		mapStatus, progs  reconciler.Status
		wantKind, wantErr string
	}{
		{"both done", done, done, "Done", ""},
		{"programs pending", done, pending, "Pending", ""},
		{"map pending", pending, done, "Pending", ""},
		{"programs failed", done, progErr, "Error", progErr.GetError()},
		{"both failed", mapErr, progErr, "Error", mapErr.GetError() + "; " + progErr.GetError()},
		{"map failed, programs pending", mapErr, pending, "Error", mapErr.GetError()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ep := &Endpoint{ID: 1, State: Ready, MapStatus: tc.mapStatus, ProgramStatus: tc.progs}
			kind, errText := datapath(ep)
			if kind != tc.wantKind || errText != tc.wantErr {
				t.Fatalf("datapath = %q, %q; want %q, %q", kind, errText, tc.wantKind, tc.wantErr)
			}
			// The table shows both statuses, and every error.
			header, row := ep.TableHeader(), ep.TableRow()
			col := func(name string) string { return row[slices.Index(header, name)] }
			if col("Map") != tc.mapStatus.Kind.String() || col("Programs") != tc.progs.Kind.String() || col("Error") != tc.wantErr {
				t.Fatalf("row Map %q Programs %q Error %q; want %q %q %q", col("Map"), col("Programs"), col("Error"),
					tc.mapStatus.Kind, tc.progs.Kind, tc.wantErr)
			}
		})
	}
}
