// Package refused keeps the objects a watcher refuses, each with why: the
// custom resources (CelliumIdentity, CelliumEndpoint objects) and the
// kvstore keys kvsync follows.
//
// The contract: each refusal is logged once per reason, with the name and
// why ("Refusing a bad <kind>"); Err names the refused objects, sorted,
// the first few with their reasons and how many more. A Set made with a
// health scope reports in it once the watcher has listed everything
// (Listed), never before: OK "Every <kind> is valid", or Degraded
// "Ignoring N bad <kind> objects" with Err. A Set without one leaves the
// reporting to its watcher, which reads Len and Err.
package refused

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/cilium/hive/cell"
)

// shown is how many refused objects Err names.
const shown = 8

// Set is the refused objects of one kind.
type Set struct {
	log    *slog.Logger
	health cell.Health
	kind   string

	mu     sync.Mutex
	bad    map[string]string
	listed bool
}

// New is the set of refused objects of kind, reported in health once
// listed, or nowhere when health is nil.
func New(log *slog.Logger, health cell.Health, kind string) *Set {
	return &Set{log: log, health: health, kind: kind, bad: map[string]string{}}
}

// Note records why the object name is refused, or with err nil that it is
// not (any more); a new reason is logged once, and Note says whether err
// is one.
func (s *Set) Note(name string, err error) (newReason bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil {
		if _, was := s.bad[name]; !was {
			return false
		}
		delete(s.bad, name)
	} else {
		if s.bad[name] == err.Error() {
			return false
		}
		s.bad[name] = err.Error()
		s.log.Warn("Refusing a bad "+s.kind, "name", name, "error", err)
		newReason = true
	}
	s.report()
	return newReason
}

// Listed says the watcher has listed every object: from now on the set is
// reported in its health. Before it the scope has said nothing, and a
// scope that never reports keeps the agent's health Unknown.
func (s *Set) Listed() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.listed = true
	s.report()
}

// Len is how many objects are refused.
func (s *Set) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.bad)
}

// Err names the refused objects and why ("name: why; ..."), the first
// few by name and how many more; nil when none is.
func (s *Set) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err()
}

func (s *Set) err() error {
	if len(s.bad) == 0 {
		return nil
	}
	names := slices.Sorted(maps.Keys(s.bad))
	var b strings.Builder
	for i, n := range names {
		if i == shown {
			fmt.Fprintf(&b, "; and %d more", len(names)-shown)
			break
		}
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%s: %s", n, s.bad[n])
	}
	return errors.New(b.String())
}

// report names the refused objects in health, or says none is, once
// listed.
func (s *Set) report() {
	if s.health == nil || !s.listed {
		return
	}
	if len(s.bad) == 0 {
		s.health.OK("Every " + s.kind + " is valid")
		return
	}
	s.health.Degraded(fmt.Sprintf("Ignoring %d bad %s objects", len(s.bad), s.kind), s.err())
}
