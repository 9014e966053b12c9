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

// TestReleaseStartPages: once the last readiness barrier is done, the
// executable's pages are paged out and the health scope daemon.start-pages
// says how much of the resident set that gave back.
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

	readyAt := time.Now()
	done()
	var row *health.Status
	celltest.Eventually(t, "daemon.start-pages reported", func() bool {
		s, _, found := status.Get(db.ReadTxn(), health.StatusID.Query("daemon.start-pages"))
		row = s
		return found && s.Level != cell.StatusUnknown
	})
	if strings.Contains(row.Message, "not released") {
		t.Skip(row.Message)
	}
	if row.Level != cell.StatusOK || !strings.HasPrefix(row.Message, "Executable's pages released once ready: resident file-backed memory ") {
		t.Fatalf("daemon.start-pages: %+v, want OK and how much was released", row)
	}
	if row.Since.Before(readyAt) {
		t.Errorf("pages released at %s, before the last barrier was done (%s)", row.Since, readyAt)
	}
}
