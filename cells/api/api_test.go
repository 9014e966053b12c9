package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/cells/api"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/pkg/apiv1"
	"github.com/cellium/cellium/pkg/client"
	"github.com/cellium/cellium/pkg/unixhttp"
)

// widgetRoutes is a test cell's contribution to the API.
func widgetRoutes() api.Routes {
	return api.NewRoutes(
		api.Route{Method: http.MethodGet, Path: "/v1/widgets/{name}", Handler: func(r *http.Request) (any, error) {
			if _, err := api.QueryParams(r, "verbose"); err != nil {
				return nil, err
			}
			if r.PathValue("name") == "missing" {
				return nil, api.NotFound("no widget %q", r.PathValue("name"))
			}
			return map[string]string{"name": r.PathValue("name")}, nil
		}},
		api.Route{Method: http.MethodPut, Path: "/v1/widgets/{name}", Handler: func(r *http.Request) (any, error) {
			var w struct {
				Colour string `json:"colour"`
			}
			if err := api.DecodeJSON(r, &w); err != nil {
				return nil, err
			}
			return map[string]string{"name": r.PathValue("name"), "colour": w.Colour}, nil
		}},
		api.Route{Method: http.MethodGet, Path: "/v1/panic", Handler: func(*http.Request) (any, error) {
			panic("handler bug")
		}},
		api.Route{Method: http.MethodGet, Path: "/v1/fail", Handler: func(*http.Request) (any, error) {
			return nil, errors.New("disk on fire")
		}},
		api.Route{Method: http.MethodGet, Path: "/v1/times", Handler: func(r *http.Request) (any, error) {
			rt, ok := api.TimesOf(r.Context())
			return map[string]any{"ok": ok, "accepted": rt.Accepted, "handled": rt.Handled, "now": time.Now()}, nil
		}},
		api.Route{Method: http.MethodGet, Path: "/v1/widgets", Handler: func(r *http.Request) (any, error) {
			// More than net/http buffers before it chunks an answer.
			var out []map[string]string
			for i := range 1000 {
				out = append(out, map[string]string{"name": fmt.Sprintf("widget-%d", i)})
			}
			return out, nil
		}},
	)
}

func newAPIHive(t *testing.T, socket string, extra ...cell.Cell) *hive.Hive {
	h := celltest.New(append([]cell.Cell{api.Cell}, extra...)...)
	hive.AddConfigOverride(h, func(c *api.Config) { c.APISocket = socket })
	return h
}

func startAPI(t *testing.T) *client.Client {
	socket := filepath.Join(t.TempDir(), "agent.sock")
	celltest.Start(t, newAPIHive(t, socket, cell.Module("widgets", "Test routes", cell.Provide(widgetRoutes))))
	return client.New(socket)
}

// wantAPIError checks that err is an error answer with the status and a
// message containing msg.
func wantAPIError(t *testing.T, err error, status int, msg string) {
	t.Helper()
	apiErr, ok := errors.AsType[*client.APIError](err)
	if !ok {
		t.Fatalf("got error %v, want an API error %d", err, status)
	}
	if apiErr.Status != status || !strings.Contains(apiErr.Message, msg) {
		t.Fatalf("got %d %q, want %d containing %q", apiErr.Status, apiErr.Message, status, msg)
	}
}

func TestContributedRoutes(t *testing.T) {
	c := startAPI(t)
	ctx := context.Background()

	var widget map[string]string
	if err := c.Do(ctx, http.MethodGet, "/v1/widgets/gear", nil, nil, &widget); err != nil {
		t.Fatal(err)
	}
	if widget["name"] != "gear" {
		t.Fatalf("got %v, want the widget named by the path", widget)
	}
	wantAPIError(t, c.Do(ctx, http.MethodGet, "/v1/widgets/missing", nil, nil, nil), http.StatusNotFound, `no widget "missing"`)
	wantAPIError(t, c.Do(ctx, http.MethodGet, "/v1/widgets/gear", map[string][]string{"colour": {"red"}}, nil, nil),
		http.StatusBadRequest, `unknown query parameter "colour": /v1/widgets/gear takes verbose`)
	wantAPIError(t, c.Do(ctx, http.MethodGet, "/v1/widgets/gear", map[string][]string{"verbose": {"1", "2"}}, nil, nil),
		http.StatusBadRequest, `query parameter "verbose" given 2 times`)
	wantAPIError(t, c.Do(ctx, http.MethodGet, "/v1/fail", nil, nil, nil), http.StatusInternalServerError, "disk on fire")
}

// A handler learns when its request's connection was accepted and when
// the handler began (what the CNI benchmark's breakdown reads from the
// endpoint manager's log line), both before the handler's own time.
func TestRequestTimes(t *testing.T) {
	c := startAPI(t)
	before := time.Now()
	var got struct {
		OK                     bool
		Accepted, Handled, Now time.Time
	}
	if err := c.Do(context.Background(), http.MethodGet, "/v1/times", nil, nil, &got); err != nil {
		t.Fatal(err)
	}
	if !got.OK || got.Accepted.Before(before) || got.Handled.Before(got.Accepted) || got.Now.Before(got.Handled) {
		t.Fatalf("request %v..., got accepted %v, handled %v, handler ran %v (ok %v): want them in that order",
			before, got.Accepted, got.Handled, got.Now, got.OK)
	}
	if _, ok := api.TimesOf(context.Background()); ok {
		t.Fatal("TimesOf says a context that is not a request's has times")
	}
}

// The CNI plugin's client (pkg/unixhttp, no net/http) against the API
// server: a body in, an answer out, an answer net/http chunks, error
// answers with their status and message.
func TestUnixHTTPClient(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "agent.sock")
	celltest.Start(t, newAPIHive(t, socket, cell.Module("widgets", "Test routes", cell.Provide(widgetRoutes))))
	ctx := context.Background()
	var widget map[string]string
	if err := unixhttp.Do(ctx, socket, http.MethodPut, "/v1/widgets/gear", map[string]string{"colour": "red"}, &widget); err != nil {
		t.Fatal(err)
	}
	if widget["name"] != "gear" || widget["colour"] != "red" {
		t.Fatalf("got %v, want the widget named by the path with the body's colour", widget)
	}
	var widgets []map[string]string
	if err := unixhttp.Do(ctx, socket, http.MethodGet, "/v1/widgets", nil, &widgets); err != nil {
		t.Fatal(err)
	}
	if len(widgets) != 1000 || widgets[999]["name"] != "widget-999" {
		t.Fatalf("got %d widgets, want the 1000 of the chunked answer", len(widgets))
	}
	err := unixhttp.Do(ctx, socket, http.MethodGet, "/v1/widgets/missing", nil, nil)
	wantAPIError(t, err, http.StatusNotFound, `no widget "missing"`)
	if want := `agent answered 404 Not Found: no widget "missing"`; err.Error() != want {
		t.Fatalf("got %q, want %q", err, want)
	}
	wantAPIError(t, unixhttp.Do(ctx, socket, http.MethodGet, "/v1/fail", nil, nil), http.StatusInternalServerError, "disk on fire")
	wantAPIError(t, unixhttp.Do(ctx, socket, http.MethodPut, "/v1/widgets/gear", nil, nil), http.StatusBadRequest, "")
}

func TestDecodeJSON(t *testing.T) {
	c := startAPI(t)
	ctx := context.Background()
	var got map[string]string
	if err := c.Do(ctx, http.MethodPut, "/v1/widgets/gear", nil, map[string]string{"colour": "red"}, &got); err != nil {
		t.Fatal(err)
	}
	if got["colour"] != "red" {
		t.Fatalf("PUT answered %v, want the decoded colour", got)
	}
	for _, tc := range []struct {
		name string
		body any
		want string
	}{
		{"unknown field", map[string]string{"color": "red"}, `invalid body: json: unknown field "color"`},
		{"not an object", []int{1}, "invalid body: json: cannot unmarshal array"},
		{"too large", map[string]string{"colour": strings.Repeat("x", api.MaxBody)}, "body larger than 65536 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantAPIError(t, c.Do(ctx, http.MethodPut, "/v1/widgets/gear", nil, tc.body, nil), http.StatusBadRequest, tc.want)
		})
	}
}

func TestUnknownRoutesAnswerJSON(t *testing.T) {
	c := startAPI(t)
	ctx := context.Background()
	wantAPIError(t, c.Do(ctx, http.MethodGet, "/v1/nothing", nil, nil, nil), http.StatusNotFound, "no route for GET /v1/nothing")
	wantAPIError(t, c.Do(ctx, http.MethodDelete, "/v1/widgets/gear", nil, nil, nil),
		http.StatusMethodNotAllowed, "method DELETE not allowed for /v1/widgets/gear (allowed: GET, HEAD, PUT)")
}

func TestPanickingHandlerIsA500AndTheServerLives(t *testing.T) {
	c := startAPI(t)
	ctx := context.Background()
	wantAPIError(t, c.Do(ctx, http.MethodGet, "/v1/panic", nil, nil, nil), http.StatusInternalServerError, "handler bug")
	if _, err := c.Healthz(ctx); err != nil {
		t.Fatalf("server after a panicking handler: %v", err)
	}
}

func TestIntrospectionRoutes(t *testing.T) {
	c := startAPI(t)
	ctx := context.Background()

	cfg, err := c.Config(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if sock, _ := cfg["api-socket"].(string); !strings.HasSuffix(sock, "agent.sock") {
		t.Fatalf("config api-socket = %v, want the socket the test set", cfg["api-socket"])
	}

	tables, err := c.Tables(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tbl := range tables {
		names = append(names, tbl.Name)
	}
	if got := strings.Join(names, ","); got != "health,readiness" {
		t.Fatalf("tables = %s, want health,readiness", got)
	}

	rows, err := c.TableRows(ctx, "readiness", client.TableQuery{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows.Header) == 0 || rows.Header[0] != "Name" || len(rows.Rows) != 1 || rows.Rows[0][0] != "cells-started" {
		t.Fatalf("readiness rows = %+v, want the cells-started barrier", rows)
	}
	objs, err := c.TableObjects(ctx, "health", client.TableQuery{Index: "id", Key: "api"})
	if err != nil {
		t.Fatal(err)
	}
	var row struct{ Path []string }
	if len(objs) != 1 || json.Unmarshal(objs[0], &row) != nil || strings.Join(row.Path, ".") != "api" {
		t.Fatalf("health objects for id=api = %s, want the api module's row", objs)
	}

	wantAPIError(t, get(c, "/v1/statedb/nope"), http.StatusNotFound, `no table "nope"; tables: health, readiness`)
	wantAPIError(t, get(c, "/v1/statedb/health?format=xml"), http.StatusBadRequest, `invalid format "xml"`)
	wantAPIError(t, get(c, "/v1/statedb/health?index=colour&key=x"), http.StatusBadRequest, `table "health" has no index "colour"; indexes: id, level`)
	wantAPIError(t, get(c, "/v1/statedb/health?key=x"), http.StatusBadRequest, "index and key go together")
	wantAPIError(t, get(c, apiv1.PathHive), http.StatusNotFound, "without an object printer")
}

// get sends a raw GET, query string included.
func get(c *client.Client, pathAndQuery string) error {
	path, query, _ := strings.Cut(pathAndQuery, "?")
	values, err := url.ParseQuery(query)
	if err != nil {
		return err
	}
	return c.Do(context.Background(), http.MethodGet, path, values, nil, nil)
}

func TestSocketLifecycle(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "run", "agent.sock")
	h := newAPIHive(t, socket)
	log := hivetest.Logger(t)
	if err := h.Start(log, context.Background()); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(socket)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o660 {
		t.Fatalf("socket mode = %v, want a socket with 0660", fi.Mode())
	}

	// A second agent on the same socket must not take it over.
	second := newAPIHive(t, socket)
	err = second.Start(log, context.Background())
	if err == nil || !strings.Contains(err.Error(), "another agent is serving on it") {
		t.Fatalf("second agent start: %v, want refusal", err)
	}
	second.Stop(log, context.Background())

	if err := h.Stop(log, context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(socket); !os.IsNotExist(err) {
		t.Fatalf("socket after stop: %v, want it removed", err)
	}
}

func TestStaleSocketIsReplaced(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "agent.sock")
	// A socket nobody listens on, as a killed agent leaves behind.
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()

	celltest.Start(t, newAPIHive(t, socket))
	if _, err := client.New(socket).Healthz(context.Background()); err != nil {
		t.Fatalf("API on a replaced stale socket: %v", err)
	}
}

func TestSocketPathThatIsNotASocket(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "agent.sock")
	if err := os.WriteFile(socket, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	h := newAPIHive(t, socket)
	err := h.Start(hivetest.Logger(t), context.Background())
	if err == nil || !strings.Contains(err.Error(), "exists and is not a socket") {
		t.Fatalf("start over a regular file: %v, want a refusal naming it", err)
	}
	h.Stop(hivetest.Logger(t), context.Background())
	if b, _ := os.ReadFile(socket); string(b) != "precious" {
		t.Fatal("the file at --api-socket was changed")
	}
}

func TestUnreachableAgent(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "agent.sock")
	_, err := client.New(socket).Health(context.Background())
	if _, ok := errors.AsType[*client.UnreachableError](err); !ok || !strings.Contains(err.Error(), socket) {
		t.Fatalf("health from no agent: %v, want an unreachable error naming the socket", err)
	}
}

func TestConflictingRoutesFailPopulate(t *testing.T) {
	dup := func() api.Routes {
		return api.NewRoutes(api.Route{Method: http.MethodGet, Path: apiv1.PathHealth, Handler: func(*http.Request) (any, error) { return nil, nil }})
	}
	h := newAPIHive(t, filepath.Join(t.TempDir(), "agent.sock"), cell.Module("dup", "Conflicting route", cell.Provide(dup)))
	err := h.Populate(hivetest.Logger(t))
	if err == nil || !strings.Contains(err.Error(), `api route "GET /v1/health"`) {
		t.Fatalf("populate with a conflicting route: %v, want an error naming it", err)
	}
}

func TestRelativeSocketRejected(t *testing.T) {
	h := newAPIHive(t, "agent.sock")
	err := h.Populate(hivetest.Logger(t))
	if err == nil || !strings.Contains(err.Error(), `invalid --api-socket "agent.sock": must be an absolute path`) {
		t.Fatalf("populate with a relative socket: %v", err)
	}
}

// rawGet sends a GET for exactly path over the socket (the client would
// not send an unclean one), returning the status and body.
func rawGet(t *testing.T, socket, path string) (int, string) {
	t.Helper()
	hc := &http.Client{
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", socket)
		}},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	req, err := http.NewRequest(http.MethodGet, "http://agent", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.URL.Path = path
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var e apiv1.Error
	if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
		t.Fatalf("GET %s: %d with a body that is not a JSON error: %v", path, resp.StatusCode, err)
	}
	return resp.StatusCode, e.Message
}

func TestUncleanPathIsABadRequest(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "agent.sock")
	celltest.Start(t, newAPIHive(t, socket, cell.Module("widgets", "Test routes", cell.Provide(widgetRoutes))))
	for _, tc := range []struct{ path, want string }{
		{"/v1//widgets/gear", `unclean path "/v1//widgets/gear": ask for "/v1/widgets/gear"`},
		{"/v1/x/../widgets/gear", `ask for "/v1/widgets/gear"`},
		{"/v1/./healthz", `ask for "/v1/healthz"`},
	} {
		status, msg := rawGet(t, socket, tc.path)
		if status != http.StatusBadRequest || !strings.Contains(msg, tc.want) {
			t.Errorf("GET %s = %d %q, want 400 containing %q", tc.path, status, msg, tc.want)
		}
	}
	if status, msg := rawGet(t, socket, "/v1/widgets/gear/"); status != http.StatusNotFound {
		t.Errorf("GET with a trailing slash = %d %q, want 404", status, msg)
	}
}

// TestSocketNeverWiderThanItsMode: under umask 000 bind makes a socket
// anyone may connect to. The socket must only ever appear at its path
// already narrowed: by a rename into place, never created there.
func TestSocketNeverWiderThanItsMode(t *testing.T) {
	dir := t.TempDir()
	socket := filepath.Join(dir, "agent.sock")
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		t.Skipf("inotify: %v", err)
	}
	defer unix.Close(fd)
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CREATE|unix.IN_MOVED_TO); err != nil {
		t.Fatal(err)
	}
	old := unix.Umask(0)
	ln, err := api.ListenUnix("api-socket", socket)
	unix.Umask(old)
	if err != nil {
		t.Fatal(err)
	}
	created, moved := false, false
	buf := make([]byte, 64<<10)
	n, err := unix.Read(fd, buf)
	if err != nil {
		t.Fatalf("read inotify events: %v", err)
	}
	for off := 0; off+unix.SizeofInotifyEvent <= n; {
		ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
		name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+int(ev.Len)]), "\x00")
		if name == "agent.sock" {
			created = created || ev.Mask&unix.IN_CREATE != 0
			moved = moved || ev.Mask&unix.IN_MOVED_TO != 0
		}
		off += unix.SizeofInotifyEvent + int(ev.Len)
	}
	if created || !moved {
		t.Fatalf("socket created at its path: %v, renamed there: %v; want it bound elsewhere and renamed into place", created, moved)
	}
	fi, err := os.Stat(socket)
	if err != nil || fi.Mode().Perm() != 0o660 {
		t.Fatalf("socket: %v %v, want mode 0660", fi, err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("directory holds %d entries, want only the socket (the private bind directory removed)", len(entries))
	}
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(socket); !os.IsNotExist(err) {
		t.Fatalf("socket after close: %v, want it removed", err)
	}
}
