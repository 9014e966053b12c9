package main

import (
	"bufio"
	"context"
	"io"
	"net/netip"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/cells/ctmaps"
	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/loadbalancer"
	"github.com/cellium/cellium/cells/monitor"
	"github.com/cellium/cellium/cells/monitor/monitortest"
	"github.com/cellium/cellium/pkg/apiv1"
	"github.com/cellium/cellium/pkg/client"
	"github.com/cellium/cellium/pkg/monitorapi"
	"github.com/cellium/cellium/pkg/polltest"
)

func TestMonitorRefusesUnknownType(t *testing.T) {
	// The type is checked before the agent is asked: no agent runs here.
	socket := filepath.Join(t.TempDir(), "agent.sock")
	var out, errOut strings.Builder
	code := execute([]string{"monitor", "-t", "trace,bogus", "--api-socket", socket}, &out, &errOut)
	if code != 1 || !strings.Contains(errOut.String(), `invalid --type "bogus"`) {
		t.Errorf("monitor -t trace,bogus = %d %q, want an error naming the type", code, errOut.String())
	}
}

// monitorCells are the monitor cell, its maps and the tables it watches.
func monitorCells(extra ...cell.Cell) []cell.Cell {
	return append([]cell.Cell{
		ctmaps.Cell, monitor.Cell,
		cell.Provide(
			endpointmanager.NewTable, statedb.RWTable[*endpointmanager.Endpoint].ToTable,
			loadbalancer.NewFrontendsTable, statedb.RWTable[*loadbalancer.Frontend].ToTable,
			loadbalancer.NewServicesTable, statedb.RWTable[*loadbalancer.Service].ToTable,
		),
	}, extra...)
}

// TestMonitorEndsWhenInterrupted: an interrupt (the command's context
// ending) ends a stream that is waiting for its next event, cleanly.
func TestMonitorEndsWhenInterrupted(t *testing.T) {
	socket, _ := startCells(t, monitorCells()...)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// No event of this kind comes: Recv waits until the interrupt.
	s, err := client.New(socket).Monitor(ctx, monitorapi.KindDrop)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	done := make(chan error, 1)
	go func() { done <- printMonitor(ctx, io.Discard, s, false) }()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("monitor ended with %v on an interrupt, want no error", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("monitor still waits after the interrupt")
	}
}

// TestMonitorTable streams a datapath trace event through the monitor cell
// and the API to `agent monitor`, and checks its line: the local time, then
// the event as it prints itself. The stream ends when the agent stops.
func TestMonitorTable(t *testing.T) {
	var events *ctmaps.Events
	socket, stop := startCells(t, monitorCells(cell.Invoke(func(ev *ctmaps.Events) { events = ev }))...)
	w, err := monitortest.NewRecordWriter(events.Ring.EBPF(), events.Lost.EBPF())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })

	r, pw := io.Pipe()
	var errOut strings.Builder
	done := make(chan int, 1)
	go func() {
		code := execute([]string{"monitor", "-t", "trace", "--api-socket", socket}, pw, &errOut)
		pw.Close()
		done <- code
	}()
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()

	ev := &monitorapi.TraceEvent{
		Time: time.Now().Round(time.Microsecond), EndpointID: 7, IfIndex: 42, Point: monitorapi.TraceFromEndpoint,
		Flow: monitorapi.Flow{
			Src: netip.MustParseAddr("10.244.0.7"), Dst: netip.MustParseAddr("10.244.0.9"),
			Proto: unix.IPPROTO_TCP, SrcPort: 40000, DstPort: 80,
			TCPFlags: monitorapi.TCPSyn, CTState: monitorapi.CTNew, Len: 74,
		},
	}
	rec, err := monitorapi.Encode(ev, monitorapi.SystemBootClock())
	if err != nil {
		t.Fatal(err)
	}
	// The command subscribes some time after it starts: write the record
	// until a line comes.
	want := regexp.MustCompile(`^\d\d:\d\d:\d\d\.\d{6} ` + regexp.QuoteMeta(ev.String()) + `$`)
	var line string
	// No interval: the wait for a line between writes is one.
	polltest.Until(t, "agent monitor printing the record", 30*time.Second, 0, func() (bool, string) {
		if err := w.Write(rec, 1); err != nil {
			t.Fatal(err)
		}
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("agent monitor ended before printing an event: %q", errOut.String())
			}
			line = l
			return true, ""
		case <-time.After(50 * time.Millisecond):
			return false, "no line printed"
		}
	})
	if !want.MatchString(line) {
		t.Errorf("agent monitor printed %q, want %s", line, want)
	}

	// The agent stopping ends the stream, and the command with it.
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	go func() {
		for range lines {
		}
	}()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("agent monitor exited %d when the agent stopped: %q", code, errOut.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("agent monitor still runs after the agent stopped")
	}
}

// TestMonitorMarkerLines checks the lines of what is not a known event: a
// lost marker, and an event of a kind a newer agent may send, shown raw.
func TestMonitorMarkerLines(t *testing.T) {
	for _, tc := range []struct {
		msg  apiv1.MonitorMessage
		want string
	}{
		{apiv1.MonitorMessage{Kind: apiv1.MonitorLostKind, Lost: &apiv1.MonitorLost{Stream: 3, Datapath: 5}},
			"lost: 3 events (this client fell behind), 5 events (datapath ring buffer full)\n"},
		{apiv1.MonitorMessage{Kind: "l7-request", Event: []byte(`{"method":"GET"}`)},
			"l7-request {\"method\":\"GET\"}\n"},
	} {
		var out strings.Builder
		if err := printMonitorLine(&out, tc.msg); err != nil || out.String() != tc.want {
			t.Errorf("line of %+v = %q, %v; want %q", tc.msg, out.String(), err, tc.want)
		}
	}
}
