package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"

	"github.com/cellium/cellium/pkg/apiv1"
)

// ObjectPrinter prints the running hive's object listing (hive.PrintObjects).
// The agent provides it; a test hive may leave it out.
type ObjectPrinter func(w io.Writer) error

type introspectParams struct {
	cell.In

	DB       *statedb.DB
	Settings cell.AllSettings
	Printer  ObjectPrinter `optional:"true"`
}

// introspectionRoutes are the routes that describe the agent itself: its
// configuration, its graph and its tables.
func introspectionRoutes(p introspectParams) Routes {
	return NewRoutes(
		Route{Method: http.MethodGet, Path: apiv1.PathConfig, Handler: func(r *http.Request) (any, error) {
			if _, err := QueryParams(r); err != nil {
				return nil, err
			}
			return apiv1.Config(p.Settings), nil
		}},
		Route{Method: http.MethodGet, Path: apiv1.PathHive, Handler: func(r *http.Request) (any, error) {
			if p.Printer == nil {
				return nil, NotFound("this agent was built without an object printer")
			}
			var buf bytes.Buffer
			if err := p.Printer(&buf); err != nil {
				return nil, err
			}
			return apiv1.Hive{Objects: buf.String()}, nil
		}},
		Route{Method: http.MethodGet, Path: apiv1.PathStateDB, Handler: func(r *http.Request) (any, error) {
			if _, err := QueryParams(r); err != nil {
				return nil, err
			}
			return listTables(p.DB), nil
		}},
		Route{Method: http.MethodGet, Path: apiv1.PathStateDB + "/{table}", Handler: func(r *http.Request) (any, error) {
			return showTable(p.DB, r)
		}},
	)
}

func listTables(db *statedb.DB) []apiv1.TableInfo {
	txn := db.ReadTxn()
	var out []apiv1.TableInfo
	for _, meta := range db.GetTables(txn) {
		initialized, _ := meta.Initialized(txn)
		out = append(out, apiv1.TableInfo{
			Name:                meta.Name(),
			Objects:             meta.NumObjects(txn),
			Indexes:             meta.Indexes(),
			Initialized:         initialized,
			PendingInitializers: meta.PendingInitializers(txn),
		})
	}
	slices.SortFunc(out, func(a, b apiv1.TableInfo) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// showTable answers GET /v1/statedb/{table}[?format=json|table][&index=I&key=K].
func showTable(db *statedb.DB, r *http.Request) (any, error) {
	q, err := QueryParams(r, "format", "index", "key")
	if err != nil {
		return nil, err
	}
	txn := db.ReadTxn()
	name := r.PathValue("table")
	meta := db.GetTable(txn, name)
	if meta == nil {
		var names []string
		for _, m := range db.GetTables(txn) {
			names = append(names, m.Name())
		}
		slices.Sort(names)
		return nil, NotFound("no table %q; tables: %s", name, strings.Join(names, ", "))
	}
	tbl := statedb.AnyTable{Meta: meta}

	format := q.Get("format")
	if format == "" {
		format = apiv1.FormatJSON
	}
	if format != apiv1.FormatJSON && format != apiv1.FormatTable {
		return nil, BadRequest("invalid format %q: valid formats are %s and %s", format, apiv1.FormatJSON, apiv1.FormatTable)
	}

	objs := tbl.All(txn)
	if q.Has("index") || q.Has("key") {
		if !q.Has("index") || !q.Has("key") {
			return nil, BadRequest("query parameters index and key go together")
		}
		index := q.Get("index")
		if !slices.Contains(meta.Indexes(), index) {
			return nil, BadRequest("table %q has no index %q; indexes: %s", name, index, strings.Join(meta.Indexes(), ", "))
		}
		if objs, err = tbl.List(txn, index, q.Get("key")); err != nil {
			return nil, BadRequest("index %q, key %q: %v", index, q.Get("key"), err)
		}
	}

	if format == apiv1.FormatTable {
		rows := apiv1.TableRows{Header: tbl.TableHeader(), Rows: [][]string{}}
		for obj := range objs {
			rows.Rows = append(rows.Rows, tbl.TableRow(obj))
		}
		return rows, nil
	}
	out := apiv1.TableObjects{}
	for obj := range objs {
		raw, err := json.Marshal(obj)
		if err != nil {
			return nil, fmt.Errorf("table %q: encode object: %w", name, err)
		}
		out = append(out, raw)
	}
	return out, nil
}
