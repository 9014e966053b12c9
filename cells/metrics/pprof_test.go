package metrics

import (
	"net/http/httptest"
	"strings"
	"testing"
)

// The profiles are served only with --pprof.
func TestPprofRouteOnlyWhenAsked(t *testing.T) {
	if routes := pprofRoute(Config{}).Routes; len(routes) != 0 {
		t.Fatalf("routes without --pprof: %v", routes)
	}
	routes := pprofRoute(Config{Pprof: true}).Routes
	if len(routes) != 1 || routes[0].Path != "/debug/pprof/" {
		t.Fatalf("routes with --pprof: %v", routes)
	}
	rec := httptest.NewRecorder()
	routes[0].Handler.ServeHTTP(rec, httptest.NewRequest("GET", "/debug/pprof/heap?debug=1", nil))
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), "heap profile") {
		t.Fatalf("GET /debug/pprof/heap: %d %.200s", rec.Code, rec.Body.String())
	}
}
