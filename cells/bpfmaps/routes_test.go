package bpfmaps_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"

	"github.com/cellium/cellium/cells/api"
	"github.com/cellium/cellium/cells/bpfmaps"
	"github.com/cellium/cellium/cells/bpfmaps/bpfmapstest"
	"github.com/cellium/cellium/pkg/apiv1"
)

// routeCollector hands the test the routes that cells contribute to the API.
func routeCollector(out *[]api.Route) cell.Cell {
	type params struct {
		cell.In
		Routes []api.Route `group:"api-routes"`
	}
	return cell.Invoke(func(p params) { *out = p.Routes })
}

// get serves a GET of target with routes, the way the api server matches
// them, and returns what the matching handler returned.
func get(t *testing.T, routes []api.Route, target string) (any, error) {
	t.Helper()
	mux := http.NewServeMux()
	var (
		res    any
		err    error
		served bool
	)
	for _, route := range routes {
		mux.HandleFunc(route.Method+" "+route.Path, func(_ http.ResponseWriter, r *http.Request) {
			res, err = route.Handler(r)
			served = true
		})
	}
	mux.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, target, nil))
	if !served {
		t.Fatalf("no route serves GET %s", target)
	}
	return res, err
}

func wantStatus(t *testing.T, err error, status int, message string) {
	t.Helper()
	se, ok := errors.AsType[*api.StatusError](err)
	if !ok || se.Status != status || se.Message != message {
		t.Fatalf("error = %#v, want status %d, message %q", err, status, message)
	}
}

func TestMapsRoute(t *testing.T) {
	root := bpfmapstest.Root(t)
	var (
		routes []api.Route
		flows  *bpfmaps.Map[flowKey, flowStats]
		slots  *bpfmaps.Map[uint32, uint64]
	)
	stop := start(t, newHive(root,
		declare("flows", bpfmaps.Spec{Name: "cellium_flows", Type: ebpf.Hash, MaxEntries: 16}, &flows),
		declare("slots", bpfmaps.Spec{Name: "cellium_slots", Type: ebpf.Array, MaxEntries: 4}, &slots),
		routeCollector(&routes),
	))
	for id := range uint32(3) {
		if err := flows.Put(flowKey{ID: id}, flowStats{}); err != nil {
			t.Fatal(err)
		}
	}

	pinDir := filepath.Join(root, "cellium")
	flowsInfo := apiv1.Map{
		Name: "cellium_flows", PinPath: filepath.Join(pinDir, "cellium_flows"), Type: "Hash",
		KeySize: 8, ValueSize: 16, MaxEntries: 16, Entries: 3, Origin: "created",
	}
	slotsInfo := apiv1.Map{
		Name: "cellium_slots", PinPath: filepath.Join(pinDir, "cellium_slots"), Type: "Array",
		KeySize: 4, ValueSize: 8, MaxEntries: 4, Entries: 4, Origin: "created",
	}

	res, err := get(t, routes, apiv1.PathMaps)
	if want := []apiv1.Map{flowsInfo, slotsInfo}; err != nil || !reflect.DeepEqual(res, want) {
		t.Fatalf("GET %s = %+v, %v; want %+v", apiv1.PathMaps, res, err, want)
	}
	res, err = get(t, routes, apiv1.PathMaps+"/cellium_flows")
	if err != nil || !reflect.DeepEqual(res, flowsInfo) {
		t.Fatalf("GET %s/cellium_flows = %+v, %v; want %+v", apiv1.PathMaps, res, err, flowsInfo)
	}
	// Entries, decoded by the key and value types: flowKey has a String
	// method, flowStats prints as a struct.
	res, err = get(t, routes, apiv1.PathMaps+"/cellium_flows/entries?limit=2")
	dump, _ := res.(apiv1.MapDump)
	if err != nil || len(dump.Entries) != 2 || !dump.Truncated || dump.Map.Name != "cellium_flows" {
		t.Fatalf("GET entries?limit=2 = %+v, %v; want 2 entries, truncated", res, err)
	}
	res, err = get(t, routes, apiv1.PathMaps+"/cellium_flows/entries")
	dump, _ = res.(apiv1.MapDump)
	var keys []string
	for _, e := range dump.Entries {
		keys = append(keys, e.Key)
		if e.Value != "{0 0}" {
			t.Errorf("entry %s value = %q, want the struct printed", e.Key, e.Value)
		}
	}
	slices.Sort(keys)
	if want := []string{"flow 0/0", "flow 1/0", "flow 2/0"}; err != nil || dump.Truncated || !slices.Equal(keys, want) {
		t.Fatalf("GET entries = keys %v (truncated %v), %v; want %v", keys, dump.Truncated, err, want)
	}
	_, err = get(t, routes, apiv1.PathMaps+"/cellium_flows/entries?limit=-1")
	wantStatus(t, err, http.StatusBadRequest, `invalid limit "-1": want a non-negative number of entries (0: all)`)
	_, err = get(t, routes, apiv1.PathMaps+"/cellium_nope/entries")
	wantStatus(t, err, http.StatusNotFound, `no bpf map "cellium_nope"; maps: cellium_flows, cellium_slots`)

	_, err = get(t, routes, apiv1.PathMaps+"/cellium_nope")
	wantStatus(t, err, http.StatusNotFound, `no bpf map "cellium_nope"; maps: cellium_flows, cellium_slots`)
	_, err = get(t, routes, apiv1.PathMaps+"?name=cellium_flows")
	wantStatus(t, err, http.StatusBadRequest, `unknown query parameter "name": /v1/maps takes none`)

	// A stopped agent's maps are closed: no count, and the reason.
	stop()
	res, err = get(t, routes, apiv1.PathMaps+"/cellium_flows")
	closed := flowsInfo
	closed.Entries, closed.Error = -1, "not open"
	if err != nil || !reflect.DeepEqual(res, closed) {
		t.Fatalf("GET %s/cellium_flows after stop = %+v, %v; want %+v", apiv1.PathMaps, res, err, closed)
	}
}

func TestDeclareAfterStart(t *testing.T) {
	root := bpfmapstest.Root(t)
	var reg *bpfmaps.Registry
	start(t, newHive(root, cell.Invoke(func(r *bpfmaps.Registry) { reg = r })))
	_, err := bpfmaps.NewMap[uint32, uint64](hivetest.Lifecycle(t), reg, bpfmaps.Spec{Name: "late", Type: ebpf.Hash, MaxEntries: 8})
	if err == nil || err.Error() != "bpf map late declared after the bpf-maps cell started: call NewMap from a constructor" {
		t.Fatalf("NewMap after start: err = %v, want the declared-after-start error", err)
	}
}
