// Package logtest records what cells log, so that tests can check that a
// log line names what it must (the file, the address, the error).
//
//	rec := logtest.NewRecorder(hivetest.Logger(t).Handler())
//	h.Start(slog.New(rec), ctx)
//	line := rec.Find("Invalid state file", "file", path)
package logtest

import (
	"context"
	"log/slog"
	"slices"
	"sync"
)

// Line is one log record: "msg" and every attribute, as strings.
type Line map[string]string

// Recorder is a slog.Handler that keeps every record and passes it on.
type Recorder struct {
	next  slog.Handler
	attrs []slog.Attr
	lines *lines
}

type lines struct {
	mu  sync.Mutex
	all []Line
}

// NewRecorder records and passes records on to next.
func NewRecorder(next slog.Handler) *Recorder {
	return &Recorder{next: next, lines: &lines{}}
}

func (r *Recorder) Enabled(ctx context.Context, level slog.Level) bool { return true }

func (r *Recorder) Handle(ctx context.Context, rec slog.Record) error {
	line := Line{"msg": rec.Message, "level": rec.Level.String()}
	for _, a := range r.attrs {
		line[a.Key] = a.Value.String()
	}
	rec.Attrs(func(a slog.Attr) bool {
		line[a.Key] = a.Value.String()
		return true
	})
	r.lines.mu.Lock()
	r.lines.all = append(r.lines.all, line)
	r.lines.mu.Unlock()
	if !r.next.Enabled(ctx, rec.Level) {
		return nil
	}
	return r.next.Handle(ctx, rec)
}

func (r *Recorder) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &Recorder{next: r.next.WithAttrs(attrs), attrs: append(slices.Clone(r.attrs), attrs...), lines: r.lines}
}

func (r *Recorder) WithGroup(name string) slog.Handler {
	return &Recorder{next: r.next.WithGroup(name), attrs: r.attrs, lines: r.lines}
}

// Find returns the first line with the message and the given key, value
// pairs, or nil.
func (r *Recorder) Find(msg string, kv ...string) Line {
	r.lines.mu.Lock()
	defer r.lines.mu.Unlock()
next:
	for _, line := range r.lines.all {
		if line["msg"] != msg {
			continue
		}
		for i := 0; i+1 < len(kv); i += 2 {
			if line[kv[i]] != kv[i+1] {
				continue next
			}
		}
		return line
	}
	return nil
}
