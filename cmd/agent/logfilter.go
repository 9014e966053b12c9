package main

import (
	"context"
	"log/slog"
)

// invokeFailed is what hive logs when building the graph fails. It names
// the invoke function that needed the failing constructor, not the
// constructor (an invalid --pod-cidr shows up as "api.serveAPI"), and the
// command prints the same error, root cause first, as it exits. So it is
// left out of the agent's log.
const invokeFailed = "Invoke failed"

// withoutInvokeFailed passes every record on but hive's "Invoke failed".
type withoutInvokeFailed struct{ slog.Handler }

func (h withoutInvokeFailed) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == invokeFailed {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h withoutInvokeFailed) WithAttrs(attrs []slog.Attr) slog.Handler {
	return withoutInvokeFailed{h.Handler.WithAttrs(attrs)}
}

func (h withoutInvokeFailed) WithGroup(name string) slog.Handler {
	return withoutInvokeFailed{h.Handler.WithGroup(name)}
}
