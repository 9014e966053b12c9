// Package refused keeps the objects a watcher refuses, each with why, and
// names them in a health scope: "Ignoring N bad <kind> objects" with the
// first few and their reasons, OK once none is left.
package refused

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"github.com/cilium/hive/cell"
)

// shown is how many refused objects health names.
const shown = 5

// Set is the refused objects of one kind.
type Set struct {
	log    *slog.Logger
	health cell.Health
	kind   string

	mu  sync.Mutex
	bad map[string]string
}

// New is the set of refused objects of kind, reported in health.
func New(log *slog.Logger, health cell.Health, kind string) *Set {
	return &Set{log: log, health: health, kind: kind, bad: map[string]string{}}
}

// Note records why the object name is refused, or with err nil that it is
// not (any more); a new reason is logged once.
func (s *Set) Note(name string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil {
		if _, was := s.bad[name]; !was {
			return
		}
		delete(s.bad, name)
	} else {
		if s.bad[name] == err.Error() {
			return
		}
		s.bad[name] = err.Error()
		s.log.Error("Ignoring a bad "+s.kind, "name", name, "error", err)
	}
	s.report()
}

// Listed reports the set in health once the watcher has listed every
// object: OK when none was refused. Before it the scope has said nothing,
// and a scope that never reports keeps the agent's health Unknown.
func (s *Set) Listed() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.report()
}

// report names the refused objects in health, or says none is.
func (s *Set) report() {
	if len(s.bad) == 0 {
		s.health.OK("Every " + s.kind + " is valid")
		return
	}
	names := make([]string, 0, len(s.bad))
	for n, why := range s.bad {
		names = append(names, n+": "+why)
	}
	slices.Sort(names)
	if len(names) > shown {
		names = append(names[:shown], fmt.Sprintf("and %d more", len(s.bad)-shown))
	}
	s.health.Degraded(fmt.Sprintf("Ignoring %d bad %s objects", len(s.bad), s.kind), errors.New(strings.Join(names, "; ")))
}
