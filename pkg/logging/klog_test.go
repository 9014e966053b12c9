package logging

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"k8s.io/klog/v2"
)

// klog's lines, client-go's, come out as the agent's: JSON records at the
// agent's level, V lines only at debug.
func TestRouteKlog(t *testing.T) {
	records := func(buf *bytes.Buffer) []map[string]any {
		t.Helper()
		var out []map[string]any
		for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
			if line == "" {
				continue
			}
			var rec map[string]any
			if err := json.Unmarshal([]byte(line), &rec); err != nil {
				t.Fatalf("klog line is not a JSON record: %q", line)
			}
			out = append(out, rec)
		}
		return out
	}
	t.Cleanup(klog.ClearLogger)

	var buf bytes.Buffer
	log, err := New(&buf, "info", FormatJSON)
	if err != nil {
		t.Fatal(err)
	}
	RouteKlog(log)
	klog.InfoS("Caches populated", "type", "*v1.Service")
	klog.ErrorS(errors.New("forbidden"), "Failed to watch", "resource", "services")
	klog.V(4).InfoS("Watch close")
	// An informer stopped on purpose.
	klog.ErrorS(fmt.Errorf("Get %q: %w", "https://127.0.0.1/api/v1/nodes", context.Canceled), "Failed to watch")
	klog.Flush()
	recs := records(&buf)
	if len(recs) != 2 {
		t.Fatalf("at info, klog wrote %d records, want 2 (no V(4)):\n%s", len(recs), buf.String())
	}
	if recs[0]["msg"] != "Caches populated" || recs[0]["level"] != "INFO" || recs[0]["type"] != "*v1.Service" {
		t.Errorf("klog InfoS = %v", recs[0])
	}
	if recs[1]["msg"] != "Failed to watch" || recs[1]["level"] != "ERROR" || recs[1]["err"] != "forbidden" {
		t.Errorf("klog ErrorS = %v", recs[1])
	}

	buf.Reset()
	log, err = New(&buf, "debug", FormatJSON)
	if err != nil {
		t.Fatal(err)
	}
	RouteKlog(log)
	klog.V(4).InfoS("Watch close", "resource", "services")
	klog.V(5).InfoS("too much")
	klog.ErrorS(context.Canceled, "Failed to watch")
	klog.Flush()
	recs = records(&buf)
	if len(recs) != 2 || recs[0]["msg"] != "Watch close" || recs[1]["level"] != "DEBUG" {
		t.Fatalf("at debug, klog V(4), V(5) and a cancelled watch wrote %v, want V(4) and the watch at DEBUG", recs)
	}
}
