package metrics

import (
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"

	"github.com/cellium/cellium/pkg/heapprofile"
)

// The profiles are served, and the heap profile sampled, only with --pprof.
func TestPprofRouteOnlyWhenAsked(t *testing.T) {
	defer func(rate int) { runtime.MemProfileRate = rate }(runtime.MemProfileRate)
	heapprofile.Off() // as the agent's binary does at its start
	if routes := pprofRoute(Config{}).Routes; len(routes) != 0 {
		t.Fatalf("routes without --pprof: %v", routes)
	}
	if runtime.MemProfileRate != 0 {
		t.Fatalf("without --pprof the heap profile is sampled (runtime.MemProfileRate %d)", runtime.MemProfileRate)
	}
	routes := pprofRoute(Config{Pprof: true}).Routes
	if runtime.MemProfileRate != heapprofile.Rate() || runtime.MemProfileRate == 0 {
		t.Fatalf("with --pprof runtime.MemProfileRate is %d, want Go's %d", runtime.MemProfileRate, heapprofile.Rate())
	}
	if len(routes) != 1 || routes[0].Path != "/debug/pprof/" {
		t.Fatalf("routes with --pprof: %v", routes)
	}
	rec := httptest.NewRecorder()
	routes[0].Handler.ServeHTTP(rec, httptest.NewRequest("GET", "/debug/pprof/heap?debug=1", nil))
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), "heap profile") {
		t.Fatalf("GET /debug/pprof/heap: %d %.200s", rec.Code, rec.Body.String())
	}
}
