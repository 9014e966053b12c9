package health

import (
	"errors"
	"log/slog"
	"slices"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
)

// ModuleDecorators scope the graph's cell.Health per module: a cell in module
// "sysctl" reports under "sysctl", a nested module under "parent.child".
// Pass them in hive.Options.
var ModuleDecorators = cell.ModuleDecorators{
	func(h cell.Health, id cell.ModuleID) cell.Health { return h.NewScope(string(id)) },
}

// rootPath is where reports made on the unscoped cell.Health land: only
// cells outside any module have it.
var rootPath = []string{"agent"}

// store writes reports into the health table.
type store struct {
	log *slog.Logger
	db  *statedb.DB
	tbl statedb.RWTable[*Status]
}

func newHealth(log *slog.Logger, db *statedb.DB, tbl statedb.RWTable[*Status]) cell.Health {
	return &reporter{store: &store{log: log, db: db, tbl: tbl}}
}

// reporter implements cell.Health for one scope.
type reporter struct {
	store *store
	path  []string
}

func (r *reporter) NewScope(name string) cell.Health {
	child := &reporter{store: r.store, path: append(slices.Clone(r.path), name)}
	r.store.declare(child.path)
	return child
}

func (r *reporter) OK(message string) {
	r.store.report(r.scopePath(), cell.StatusOK, message, nil)
}

func (r *reporter) Degraded(reason string, err error) {
	if err == nil {
		// Degraded without an error still needs something to show.
		err = errors.New(reason)
	}
	r.store.report(r.scopePath(), cell.StatusDegraded, reason, err)
}

func (r *reporter) Stopped(reason string) {
	r.store.report(r.scopePath(), cell.StatusStopped, reason, nil)
}

func (r *reporter) Close() {
	r.store.remove(r.scopePath())
}

func (r *reporter) scopePath() []string {
	if len(r.path) == 0 {
		return rootPath
	}
	return r.path
}

// declare adds an Unknown row for a new scope, so that a scope that never
// reports still shows up.
func (s *store) declare(path []string) {
	txn := s.db.WriteTxn(s.tbl)
	defer txn.Abort()
	key := &Status{Path: path}
	if _, _, found := s.tbl.Get(txn, StatusID.Query(key.ID())); found {
		return
	}
	now := time.Now()
	s.tbl.Insert(txn, &Status{Path: path, Level: cell.StatusUnknown, Since: now, Updated: now})
	txn.Commit()
}

func (s *store) report(path []string, level cell.Level, message string, err error) {
	var errString string
	if err != nil {
		errString = err.Error()
	}
	now := time.Now()
	next := &Status{Path: path, Level: level, Message: message, Error: errString, Since: now, Updated: now}

	txn := s.db.WriteTxn(s.tbl)
	defer txn.Abort()
	old, _, found := s.tbl.Get(txn, StatusID.Query(next.ID()))
	if found {
		if old.Level == level && old.Message == message && old.Error == errString {
			return
		}
		if old.Level == level {
			next.Since = old.Since
		}
	}
	s.tbl.Insert(txn, next)
	txn.Commit()

	if found && old.Level != level {
		s.logTransition(next, old.Level)
	}
}

// logTransition logs level changes, so that the log says when and why a
// module became unhealthy without repeating every report.
func (s *store) logTransition(st *Status, from cell.Level) {
	attrs := []any{"scope", st.ID(), "from", from, "to", st.Level, "message", st.Message}
	switch {
	case st.Level == cell.StatusDegraded:
		s.log.Warn("Health degraded", append(attrs, "error", st.Error)...)
	case from == cell.StatusDegraded:
		s.log.Info("Health recovered", attrs...)
	}
}

func (s *store) remove(path []string) {
	txn := s.db.WriteTxn(s.tbl)
	defer txn.Abort()
	s.tbl.Delete(txn, &Status{Path: path})
	txn.Commit()
}

// severity orders levels from healthy to unhealthy, for aggregation.
func severity(l cell.Level) int {
	switch l {
	case cell.StatusStopped:
		return 0
	case cell.StatusOK:
		return 1
	case cell.StatusUnknown:
		return 2
	default: // Degraded
		return 3
	}
}
