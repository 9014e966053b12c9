package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"

	"github.com/cellium/cellium/cells/health"
	"github.com/cellium/cellium/pkg/pageout"
)

// registerPageOut adds the job that hands the executable's pages back to the
// kernel once the agent is first ready, and reports what it did under the
// health scope "daemon.start-pages".
//
// Of an idle agent's resident set, most is its executable's clean pages,
// read by ~390 package initializers and by the start (decoding manifests,
// restoring state, first listings) and not used again; the process keeps
// them mapped for as long as it runs. Once every readiness barrier is done
// the start is over: the pages are paged out (pkg/pageout), and those the
// running agent uses are mapped back on their next access. Once per run:
// later bursts (a relist) leave their pages to the kernel's own reclaim.
func registerPageOut(cfg Config, jobs job.Group, r *health.Readiness, h cell.Health, log *slog.Logger) {
	if !cfg.ReleaseStartPages {
		return
	}
	jobs.Add(job.OneShot("release-start-pages", func(ctx context.Context, _ cell.Health) error {
		if err := r.Wait(ctx); err != nil {
			return nil // stopped before ready
		}
		report := h.NewScope("start-pages")
		start := time.Now()
		res, err := pageout.Executable()
		switch {
		case errors.Is(err, pageout.ErrUnsupported):
			report.OK("Executable's pages not released: " + err.Error())
		case err != nil:
			// Only memory is at stake: say so, and let the agent run.
			report.Degraded("Releasing the executable's pages", err)
		default:
			msg := fmt.Sprintf("Executable's pages released once ready: resident file-backed memory %.1f MB -> %.1f MB",
				mb(res.FileBefore), mb(res.FileAfter))
			log.Info(msg, "mappings", res.Mappings, "mapped-mb", mb(res.MappedBytes), "duration", time.Since(start))
			report.OK(msg)
		}
		return nil
	}))
}

func mb(b uint64) float64 { return float64(b) / (1 << 20) }
