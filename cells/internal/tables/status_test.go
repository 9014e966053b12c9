package tables

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"github.com/cilium/statedb/reconciler"
)

type row struct {
	name   string
	status reconciler.Status
}

func (r *row) TableHeader() []string { return []string{"Name", "Status"} }
func (r *row) TableRow() []string    { return []string{r.name, r.status.Kind.String()} }

var rowByName = statedb.Index[*row, string]{
	Name:       "name",
	FromObject: func(r *row) index.KeySet { return index.NewKeySet(index.String(r.name)) },
	FromKey:    index.String,
	FromString: index.FromString,
	Unique:     true,
}

// TestStatusIndexes checks that StatusIndex lists rows of every kind and
// UnsettledStatusIndex those not Done, that both answer by a kind's name,
// and that UnsettledStatusIndex refuses Done with an error that says why.
func TestStatusIndexes(t *testing.T) {
	status := func(r *row) reconciler.Status { return r.status }
	all, unsettled := StatusIndex(status), UnsettledStatusIndex(status)
	unsettled.Name = "unsettled"
	db := statedb.New()
	tbl, err := statedb.NewTable(db, "rows", rowByName, all, unsettled)
	if err != nil {
		t.Fatal(err)
	}
	txn := db.WriteTxn(tbl)
	for _, r := range []*row{
		{"a", reconciler.StatusPending()},
		{"b", reconciler.StatusDone()},
		{"c", reconciler.StatusError(errTest)},
		{"d", reconciler.StatusDone()},
	} {
		if _, _, err := tbl.Insert(txn, r); err != nil {
			t.Fatal(err)
		}
	}
	rtxn := txn.Commit()

	names := func(idx statedb.Index[*row, reconciler.StatusKind], kind reconciler.StatusKind) []string {
		t.Helper()
		// Queries from the command line and the REST API go by name.
		key, err := idx.FromString(kind.String())
		if err != nil {
			t.Fatalf("%s index, %s: %v", idx.Name, kind, err)
		}
		if !bytes.Equal(key, kind.Key()) {
			t.Fatalf("%s index, %s: key %x, want %x", idx.Name, kind, key, kind.Key())
		}
		var got []string
		for r := range tbl.List(rtxn, idx.Query(kind)) {
			got = append(got, r.name)
		}
		slices.Sort(got)
		return got
	}
	for _, c := range []struct {
		idx  statedb.Index[*row, reconciler.StatusKind]
		kind reconciler.StatusKind
		want []string
	}{
		{all, reconciler.StatusKindPending, []string{"a"}},
		{all, reconciler.StatusKindDone, []string{"b", "d"}},
		{all, reconciler.StatusKindError, []string{"c"}},
		{all, reconciler.StatusKindRefreshing, nil},
		{unsettled, reconciler.StatusKindPending, []string{"a"}},
		{unsettled, reconciler.StatusKindError, []string{"c"}},
		{unsettled, reconciler.StatusKindRefreshing, nil},
	} {
		if got := names(c.idx, c.kind); !slices.Equal(got, c.want) {
			t.Errorf("%s index, %s: got %v, want %v", c.idx.Name, c.kind, got, c.want)
		}
	}
	if got := slices.Collect(statedb.ToSeq(tbl.List(rtxn, unsettled.Query(reconciler.StatusKindDone)))); len(got) != 0 {
		t.Errorf("unsettled index holds %d Done rows, want none", len(got))
	}

	for _, c := range []struct {
		idx       statedb.Index[*row, reconciler.StatusKind]
		kind, err string
	}{
		{unsettled, "Done", "holds only rows that are not Done"},
		{unsettled, "done", `invalid status "done": want Pending, Refreshing or Error`},
		{all, "Finished", `invalid status "Finished": want Pending, Refreshing, Done or Error`},
	} {
		_, err := c.idx.FromString(c.kind)
		if err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("%s index, %q: got error %v, want one containing %q", c.idx.Name, c.kind, err, c.err)
		}
	}
}

var errTest = testError("no room")

type testError string

func (e testError) Error() string { return string(e) }
