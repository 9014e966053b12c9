package health

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"

	"github.com/cellium/cellium/pkg/apiv1"
	"github.com/cellium/cellium/pkg/netlimit"
	"github.com/cellium/cellium/pkg/netlimit/netlimittest"
)

// TestProbes drives the probe server over HTTP: /healthz follows "every cell
// started", /readyz also waits for barriers, contributed routes are served.
func TestProbes(t *testing.T) {
	addr := freePort(t)
	var restoreDone func()
	h := hive.NewWithOptions(hive.Options{ModuleDecorators: ModuleDecorators},
		statedb.Cell, job.Cell, Cell,
		cell.Module("restorer", "Test module holding a barrier",
			cell.Provide(func() ProbeRoutes {
				return ProbeRoutes{Routes: []ProbeRoute{{Path: "/extra", Handler: http.HandlerFunc(
					func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "extra") })}}}
			}),
			cell.Invoke(func(r *Readiness) { restoreDone = r.Add("restore") }),
		),
		StartedMarker,
	)
	hive.AddConfigOverride(h, func(c *Config) { c.HealthAddr = addr })
	log := hivetest.Logger(t)
	if err := h.Start(log, context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Stop(log, context.Background()) })
	base := "http://" + addr

	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	decode := func(body string) apiv1.Healthz {
		t.Helper()
		var hz apiv1.Healthz
		if err := json.Unmarshal([]byte(body), &hz); err != nil {
			t.Fatalf("decode %q: %v", body, err)
		}
		return hz
	}

	if code, body := get("/healthz"); code != http.StatusOK || !decode(body).Started {
		t.Fatalf("/healthz after start = %d %s, want 200 started", code, body)
	}
	code, body := get("/readyz")
	if code != http.StatusServiceUnavailable || !slices.Equal(decode(body).Pending, []string{"restore"}) {
		t.Fatalf("/readyz with a pending barrier = %d %s, want 503 pending [restore]", code, body)
	}
	restoreDone()
	if code, body := get("/readyz"); code != http.StatusOK || !decode(body).Ready {
		t.Fatalf("/readyz after the barrier = %d %s, want 200 ready", code, body)
	}
	if code, body := get("/extra"); code != http.StatusOK || body != "extra" {
		t.Fatalf("contributed route = %d %q, want 200 extra", code, body)
	}
}

// freePort returns a loopback address whose port was free a moment ago.
func freePort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func TestInvalidHealthAddr(t *testing.T) {
	h := hive.New(statedb.Cell, job.Cell, Cell)
	hive.AddConfigOverride(h, func(c *Config) { c.HealthAddr = "9879" })
	err := h.Populate(hivetest.Logger(t))
	if err == nil {
		t.Fatal("populate with --health-addr=9879 succeeded, want an error")
	}
	if want := `invalid --health-addr "9879"`; !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not name the flag: want %q", err, want)
	}
}

// The probe server may be bound to a node address (--health-addr): it caps
// the header and the connections it serves at once.
func TestProbeServerLimits(t *testing.T) {
	addr := freePort(t)
	h := hive.NewWithOptions(hive.Options{ModuleDecorators: ModuleDecorators},
		statedb.Cell, job.Cell, Cell, StartedMarker)
	hive.AddConfigOverride(h, func(c *Config) { c.HealthAddr = addr })
	log := hivetest.Logger(t)
	if err := h.Start(log, context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Stop(log, context.Background()) })
	netlimittest.HeaderCapped(t, addr, "/healthz", netlimit.Default.MaxHeaderBytes)
	netlimittest.ConnCapped(t, addr, "/healthz", netlimit.Default.MaxConns)
}
