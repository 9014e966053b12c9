package logging

import (
	"context"
	"errors"
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
// are slog level -n, kept only at --log-level=debug. An error caused by a
// cancelled context is a Debug line: client-go reports an informer that
// the agent stops on purpose as a failed watch.
func RouteKlog(log *slog.Logger) {
	klog.SetSlogLogger(slog.New(canceledIsDebug{log.Handler()}))
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

// canceledIsDebug lowers to Debug the records whose error attribute is a
// context cancellation.
type canceledIsDebug struct{ slog.Handler }

func (h canceledIsDebug) Handle(ctx context.Context, r slog.Record) error {
	if r.Level > slog.LevelDebug {
		canceled := false
		r.Attrs(func(a slog.Attr) bool {
			if err, ok := a.Value.Any().(error); ok && errors.Is(err, context.Canceled) {
				canceled = true
				return false
			}
			return true
		})
		if canceled {
			if !h.Handler.Enabled(ctx, slog.LevelDebug) {
				return nil
			}
			r.Level = slog.LevelDebug
		}
	}
	return h.Handler.Handle(ctx, r)
}

func (h canceledIsDebug) WithAttrs(attrs []slog.Attr) slog.Handler {
	return canceledIsDebug{h.Handler.WithAttrs(attrs)}
}

func (h canceledIsDebug) WithGroup(name string) slog.Handler {
	return canceledIsDebug{h.Handler.WithGroup(name)}
}
