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
// kernel when the agent starts and again once it is first ready, and
// reports what it did under the health scope "daemon.start-pages".
//
// Of an idle agent's resident set, most is its executable's clean pages,
// read by ~390 package initializers, the cells' constructors and the start
// (decoding manifests, restoring state, first listings) and not used again;
// the process keeps them mapped for as long as it runs. The job starts with
// the daemon cell, once every constructor has run: the initializers' and
// constructors' pages go then, so they are not held through the start's
// own peak. Once every readiness barrier is done the start is over and
// its pages go too. Pages the running agent uses are mapped back on their
// next access (pkg/pageout). Later bursts (a relist) leave their pages to
// the kernel's own reclaim.
func registerPageOut(cfg Config, jobs job.Group, r *health.Readiness, h cell.Health, log *slog.Logger) {
	if !cfg.ReleaseStartPages {
		return
	}
	jobs.Add(job.OneShot("release-start-pages", func(ctx context.Context, _ cell.Health) error {
		report := h.NewScope("start-pages")
		if !releasePages(report, log, "at start") {
			return nil
		}
		if err := r.Wait(ctx); err != nil {
			return nil // stopped before ready
		}
		releasePages(report, log, "once ready")
		return nil
	}))
}

// releasePages pages out the executable's resident pages, and reports and
// logs how much of the resident set that gave back. It says whether the
// kernel can do it at all.
func releasePages(report cell.Health, log *slog.Logger, when string) bool {
	start := time.Now()
	res, err := pageout.Executable()
	switch {
	case errors.Is(err, pageout.ErrUnsupported):
		report.OK("Executable's pages not released: " + err.Error())
		return false
	case err != nil:
		// Only memory is at stake: say so, and let the agent run.
		report.Degraded("Releasing the executable's pages "+when, err)
	default:
		msg := fmt.Sprintf("Executable's pages released %s: resident file-backed memory %.1f MB -> %.1f MB",
			when, mb(res.FileBefore), mb(res.FileAfter))
		log.Info(msg, "mappings", res.Mappings, "mapped-mb", mb(res.MappedBytes), "duration", time.Since(start))
		report.OK(msg)
	}
	return true
}

func mb(b uint64) float64 { return float64(b) / (1 << 20) }
