package logging

import (
	"context"
	"flag"
	"log/slog"
	"strconv"

	"k8s.io/klog/v2"
)

// klogDebugVerbosity is klog's -v when the agent logs at debug: client-go
// logs its reflectors' and watches' progress up to 4; above it, every
// request.
const klogDebugVerbosity = 4

// RouteKlog sends klog's output, which is client-go's, through log: the
// same handler, so the same format and level as the agent's own lines. A
// klog info line is an slog Info, an error an slog Error, and V(n) lines
// are slog level -n, kept only at --log-level=debug.
func RouteKlog(log *slog.Logger) {
	klog.SetSlogLogger(log)
	verbosity := 0
	if log.Enabled(context.Background(), slog.LevelDebug) {
		verbosity = klogDebugVerbosity
	}
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	// klog's own flags: only where its output goes and how much of it.
	fs.Set("logtostderr", "false")
	fs.Set("v", strconv.Itoa(verbosity))
}
