package loadbalancer

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Problem reporting: invalid fields and frontend conflicts, by object, in
// the log once and in the cell's health while they last.

// setProblem records (or with no invalid fields, clears) the invalid
// fields of an object, logging each change once. object builds the
// object's key, only when there is something to record or clear: the
// common case, a valid object and no problems, costs nothing.
func (w *writer) setProblem(object func() string, invalid []invalidField) {
	if len(invalid) == 0 && len(w.problems) == 0 {
		return
	}
	var msg string
	if len(invalid) > 0 {
		parts := make([]string, len(invalid))
		for i, f := range invalid {
			parts[i] = f.Error()
		}
		msg = strings.Join(parts, "; ")
	}
	w.setProblemMessage(object(), msg)
}

func (w *writer) setProblemMessage(object, msg string) {
	old, had := w.problems[object]
	switch {
	case msg == "" && had:
		delete(w.problems, object)
		w.log.Info("Problem resolved", "object", object)
	case msg != "" && old != msg:
		w.problems[object] = msg
		w.log.Warn("Skipping invalid or conflicting parts of a Kubernetes object", "object", object, "problem", msg)
	}
	if msg != old {
		w.reported = false
	}
}

// maxProblemsShown keeps the health message short; the log has them all.
const maxProblemsShown = 3

func (w *writer) reportHealth() {
	if w.reported {
		return
	}
	w.reported = true
	if len(w.problems) == 0 {
		w.health.OK("No problem with Services or EndpointSlices")
		return
	}
	keys := slices.Sorted(maps.Keys(w.problems))
	shown := keys[:min(len(keys), maxProblemsShown)]
	parts := make([]string, len(shown))
	for i, k := range shown {
		parts[i] = k + ": " + w.problems[k]
	}
	msg := strings.Join(parts, "; ")
	if len(keys) > len(shown) {
		msg += fmt.Sprintf("; and %d more", len(keys)-len(shown))
	}
	w.health.Degraded(fmt.Sprintf("%d Kubernetes objects skipped in part", len(keys)), fmt.Errorf("%s", msg))
}
