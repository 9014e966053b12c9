package daemon_test

import (
	"strings"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/daemon"
	"github.com/cellium/cellium/cells/health"
	"github.com/cellium/cellium/cells/internal/celltest"
)

// TestReleaseStartPages: the executable's pages are paged out when the
// agent starts, while a readiness barrier is still pending, and again once
// the last barrier is done; the health scope daemon.start-pages says each
// time how much of the resident set that gave back.
func TestReleaseStartPages(t *testing.T) {
	var (
		done   func()
		db     *statedb.DB
		status statedb.Table[*health.Status]
	)
	h := celltest.New(daemon.Cell, cell.Invoke(func(r *health.Readiness, d *statedb.DB, s statedb.Table[*health.Status]) {
		done, db, status = r.Add("test-barrier"), d, s
	}))
	hive.AddConfigOverride(h, func(c *daemon.Config) { c.StateDir, c.RunDir = t.TempDir(), t.TempDir() })
	celltest.Start(t, h)

	reported := func(what string) *health.Status {
		t.Helper()
		var row *health.Status
		celltest.Eventually(t, "daemon.start-pages reports "+what, func() bool {
			s, _, found := status.Get(db.ReadTxn(), health.StatusID.Query("daemon.start-pages"))
			row = s
			return found && s.Level != cell.StatusUnknown && (strings.Contains(s.Message, what) || strings.Contains(s.Message, "not released"))
		})
		if strings.Contains(row.Message, "not released") {
			t.Skip(row.Message)
		}
		want := "Executable's pages released " + what + ": resident file-backed memory "
		if row.Level != cell.StatusOK || !strings.HasPrefix(row.Message, want) {
			t.Fatalf("daemon.start-pages: %+v, want OK and %q", row, want)
		}
		return row
	}

	reported("at start")
	readyAt := time.Now()
	done()
	if row := reported("once ready"); row.Updated.Before(readyAt) {
		t.Errorf("pages released once ready at %s, before the last barrier was done (%s)", row.Updated, readyAt)
	}
}
