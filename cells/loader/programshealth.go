package loader

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"golang.org/x/time/rate"

	"github.com/cellium/cellium/cells/endpointmanager"
)

// The reconciler's own health row reflects its last round only: the round
// that fails an attach reports Degraded, and the next one, which the
// status it wrote back triggers, has nothing to do and reports OK again.
// So the failure shows for an instant. This job's row
// (loader.job-endpoint-programs-status) says what the table says: Degraded
// while any endpoint's programs are in error, naming them, OK otherwise.
func registerProgramsHealth(jobs job.Group, db *statedb.DB, endpoints statedb.Table[*endpointmanager.Endpoint]) {
	jobs.Add(job.OneShot("endpoint-programs-status", func(ctx context.Context, health cell.Health) error {
		limit := rate.NewLimiter(10, 1)
		for {
			if err := limit.Wait(ctx); err != nil {
				return nil
			}
			eps, watch := endpoints.AllWatch(db.ReadTxn())
			var failed []string
			n := 0
			for ep := range eps {
				if !ep.InDatapath() {
					continue
				}
				n++
				if ep.ProgramStatus.Kind == reconciler.StatusKindError {
					failed = append(failed, fmt.Sprintf("endpoint %d (%s): %s", ep.ID, ep.HostIfName, ep.ProgramStatus.GetError()))
				}
			}
			if len(failed) > 0 {
				slices.Sort(failed)
				health.Degraded(fmt.Sprintf("%d of %d endpoints without their programs", len(failed), n), errors.New(strings.Join(failed, "; ")))
			} else {
				health.OK(fmt.Sprintf("programs of %d endpoints attached or pending", n))
			}
			select {
			case <-ctx.Done():
				return nil
			case <-watch:
			}
		}
	}))
}
