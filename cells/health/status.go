package health

import (
	"strings"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
)

// Status is one row of the "health" table: the latest report of one module
// or of one scope within a module.
type Status struct {
	// Path is the scope's place in the tree: the module id first, then the
	// names of the nested scopes.
	Path    []string   `json:"path"`
	Level   cell.Level `json:"level"`
	Message string     `json:"message,omitempty"`
	Error   string     `json:"error,omitempty"`
	// Since is when Level last changed.
	Since time.Time `json:"since"`
	// Updated is when the scope last reported.
	Updated time.Time `json:"updated"`
}

// ID is the dotted path, the table's primary key.
func (s *Status) ID() string { return strings.Join(s.Path, ".") }

var _ statedb.TableWritable = &Status{}

func (s *Status) TableHeader() []string {
	return []string{"ID", "Level", "Message", "Error", "Since"}
}

func (s *Status) TableRow() []string {
	return []string{s.ID(), string(s.Level), s.Message, s.Error, sinceString(s.Since)}
}

func sinceString(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return time.Since(t).Truncate(time.Second).String() + " ago"
}

var (
	// StatusID indexes the health table by dotted path.
	StatusID = statedb.Index[*Status, string]{
		Name:       "id",
		FromObject: func(s *Status) index.KeySet { return index.NewKeySet(index.String(s.ID())) },
		FromKey:    index.String,
		FromString: index.FromString,
		Unique:     true,
	}
	// StatusLevel indexes the health table by level, to find what is degraded.
	StatusLevel = statedb.Index[*Status, cell.Level]{
		Name:       "level",
		FromObject: func(s *Status) index.KeySet { return index.NewKeySet(index.String(string(s.Level))) },
		FromKey:    func(l cell.Level) index.Key { return index.String(string(l)) },
		FromString: index.FromString,
	}
)

// TableName is the name of the health table.
const TableName = "health"

func newStatusTable(db *statedb.DB) (statedb.RWTable[*Status], error) {
	return statedb.NewTable(db, TableName, StatusID, StatusLevel)
}
