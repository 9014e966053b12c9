package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/cilium/api/v1/flow"
	"github.com/cilium/cilium/api/v1/observer"
	"github.com/cilium/ebpf"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cellium/cellium/cells"
	"github.com/cellium/cellium/cells/api"
	"github.com/cellium/cellium/cells/hubble"
	"github.com/cellium/cellium/cells/monitor/monitortest"
	"github.com/cellium/cellium/pkg/monitorapi"
)

// agentFlagSet is the agent's flags, as the root command registers them.
func agentFlagSet() *pflag.FlagSet {
	f := pflag.NewFlagSet("agent", pflag.ContinueOnError)
	cells.NewHive().RegisterFlags(f)
	return f
}

// observeCmd runs `agent observe args...` in this process with the
// agent's flags, as the root command registers them.
func observeCmd(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := newObserveCmd(&out, agentFlagSet())
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(args)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	err = cmd.Execute()
	return out.String(), errOut.String(), err
}

// observeRequest is the request `agent observe args...` would send.
func observeRequest(t *testing.T, now time.Time, args ...string) (*observer.GetFlowsRequest, error) {
	t.Helper()
	cmd, o := newObserveCmdOpts(&bytes.Buffer{}, agentFlagSet())
	if err := cmd.ParseFlags(args); err != nil {
		return nil, err
	}
	return o.request(now)
}

// syncBuffer is a buffer that a command writes while the test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
	// grew is closed and replaced at each write.
	grew chan struct{}
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.grew != nil {
		close(b.grew)
		b.grew = nil
	}
	return b.buf.Write(p)
}

// contents is what was written and a channel closed at the next write.
func (b *syncBuffer) contents() (string, <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.grew == nil {
		b.grew = make(chan struct{})
	}
	return b.buf.String(), b.grew
}

// waitForOutput waits until b holds s.
func waitForOutput(t *testing.T, b *syncBuffer, s, what string) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		out, grew := b.contents()
		if strings.Contains(out, s) {
			return
		}
		select {
		case <-grew:
		case <-timeout:
			t.Fatalf("no %s (%q) within 30s; output:\n%s", what, s, out)
		}
	}
}

func TestObserveRequest(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	ts := timestamppb.New
	tests := []struct {
		name string
		args []string
		want *observer.GetFlowsRequest
	}{
		{"default: the last 20", nil, &observer.GetFlowsRequest{Number: 20}},
		{"last", []string{"--last", "5"}, &observer.GetFlowsRequest{Number: 5}},
		{"first", []string{"--first", "3"}, &observer.GetFlowsRequest{Number: 3, First: true}},
		{"all", []string{"--all"}, &observer.GetFlowsRequest{Number: 1<<64 - 1}},
		{"follow: new flows only", []string{"-f"}, &observer.GetFlowsRequest{Follow: true}},
		{"follow after the last 2", []string{"--follow", "--last", "2"}, &observer.GetFlowsRequest{Follow: true, Number: 2}},
		{"window: every flow in it", []string{"--since", "5m", "--until", "2026-01-02T03:03:00Z"},
			&observer.GetFlowsRequest{Since: ts(now.Add(-5 * time.Minute)), Until: ts(time.Date(2026, 1, 2, 3, 3, 0, 0, time.UTC))}},
		{"either side: a filter per side", []string{"--ip", "10.244.0.5", "--port", "53"}, &observer.GetFlowsRequest{Number: 20, Whitelist: []*flow.FlowFilter{
			{SourceIp: []string{"10.244.0.5"}, SourcePort: []string{"53"}},
			{DestinationIp: []string{"10.244.0.5"}, DestinationPort: []string{"53"}},
		}}},
		{"one side: one filter", []string{"--from-ip", "10.244.0.0/16", "--to-port", "80", "--verdict", "dropped", "--protocol", "tcp"},
			&observer.GetFlowsRequest{Number: 20, Whitelist: []*flow.FlowFilter{{
				SourceIp: []string{"10.244.0.0/16"}, DestinationPort: []string{"80"},
				Verdict: []flow.Verdict{flow.Verdict_DROPPED}, Protocol: []string{"tcp"},
			}}}},
		{"pod in a namespace", []string{"--pod", "web", "--namespace", "shop"}, &observer.GetFlowsRequest{Number: 20, Whitelist: []*flow.FlowFilter{
			{SourcePod: []string{"shop/web"}}, {DestinationPod: []string{"shop/web"}},
		}}},
		{"namespace", []string{"--namespace", "shop"}, &observer.GetFlowsRequest{Number: 20, Whitelist: []*flow.FlowFilter{
			{SourcePod: []string{"shop/"}}, {DestinationPod: []string{"shop/"}},
		}}},
		{"from a namespace to a pod", []string{"--from-namespace", "shop", "--to-pod", "db/postgres"}, &observer.GetFlowsRequest{Number: 20, Whitelist: []*flow.FlowFilter{
			{SourcePod: []string{"shop/"}, DestinationPod: []string{"db/postgres"}},
		}}},
		{"identity and labels", []string{"--from-identity", "world", "--to-identity", "300", "--label", "app=web"},
			&observer.GetFlowsRequest{Number: 20, Whitelist: []*flow.FlowFilter{
				{SourceIdentity: []uint32{2}, DestinationIdentity: []uint32{300}, SourceLabel: []string{"app=web"}},
				{SourceIdentity: []uint32{2}, DestinationIdentity: []uint32{300}, DestinationLabel: []string{"app=web"}},
			}}},
		{"deny", []string{"--not", "namespace=kube-system", "--not", "verdict=FORWARDED"}, &observer.GetFlowsRequest{Number: 20, Blacklist: []*flow.FlowFilter{
			{SourcePod: []string{"kube-system/"}}, {DestinationPod: []string{"kube-system/"}},
			{Verdict: []flow.Verdict{flow.Verdict_FORWARDED}},
		}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := observeRequest(t, now, tc.args...)
			if err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(got, tc.want) {
				t.Fatalf("request\n got %v\nwant %v", got, tc.want)
			}
		})
	}
}

func TestObserveBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--first", "1", "--follow"}, "--first and --follow exclude each other"},
		{[]string{"--first", "1", "--last", "1"}, "--last, --first and --all exclude each other"},
		{[]string{"--since", "yesterday"}, `invalid --since "yesterday": want a time such as 2026-01-02T15:04:05Z or a duration ago such as 5m`},
		{[]string{"--to-ip", "10.0.0.300"}, `invalid --to-ip "10.0.0.300": want an address such as 10.244.0.5 or a CIDR such as 10.244.0.0/16`},
		{[]string{"--port", "http"}, `invalid --port "http": want a port number 0-65535`},
		{[]string{"--verdict", "MAYBE"}, `invalid --verdict "MAYBE": want FORWARDED, DROPPED or TRANSLATED`},
		{[]string{"--protocol", "gopher"}, `invalid --protocol "gopher": want tcp, udp, sctp, icmp, icmpv4 or icmpv6`},
		{[]string{"--to-namespace", "a/b"}, `invalid --to-namespace "a/b": want a namespace name`},
		{[]string{"--from-port", "65536"}, `invalid --from-port "65536": want a port number 0-65535`},
		{[]string{"--verdict", "verdict_unknown"}, `invalid --verdict "verdict_unknown"`},
		{[]string{"--namespace", "a/b"}, `invalid --namespace "a/b": want a namespace name`},
		{[]string{"--to-identity", "nobody"}, `invalid --to-identity "nobody": want a security identity number or a reserved name`},
		{[]string{"--not", "colour=red"}, `invalid --not "colour=red": want KEY=VALUE with KEY one of ip, from-ip`},
		{[]string{"--not", "port=x"}, `--not port=x: invalid --port "x"`},
		{[]string{"-o", "yaml"}, `invalid --output "yaml": want table or json`},
		{[]string{"--run-dir", "relative"}, `invalid --run-dir "relative": must be an absolute path`},
		{[]string{"--hubble-listen-address", "nowhere"}, `invalid --hubble-listen-address "nowhere"`},
	} {
		_, _, err := observeCmd(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("observe %v = %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
}

// serveObserver serves o, as the agent's hubble cell does, at
// <runDir>/hubble.sock.
func serveObserver(t *testing.T, o *hubble.Observer) (runDir string) {
	t.Helper()
	runDir = t.TempDir()
	ln, err := api.ListenUnix("hubble-listen-address", filepath.Join(runDir, hubble.SocketName))
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	observer.RegisterObserverServer(srv, o)
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return runDir
}

func TestObserveOutput(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.Local)
	o := hubble.NewObserver(16, "node-1", func() time.Time { return at })
	web := &flow.Endpoint{ID: 1, Namespace: "default", PodName: "web-1"}
	o.AddFlow(&flow.Flow{
		Time: timestamppb.New(at), Verdict: flow.Verdict_FORWARDED, NodeName: "node-1",
		IP:     &flow.IP{Source: "10.244.0.5", Destination: "10.244.0.9", IpVersion: flow.IPVersion_IPv4},
		L4:     &flow.Layer4{Protocol: &flow.Layer4_TCP{TCP: &flow.TCP{SourcePort: 40000, DestinationPort: 5432}}},
		Source: web, TraceObservationPoint: flow.TraceObservationPoint_FROM_ENDPOINT, Summary: "TCP Flags: SYN",
	})
	o.AddLost(flow.LostEventSource_PERF_EVENT_RING_BUFFER, 3)
	o.AddFlow(&flow.Flow{
		Time: timestamppb.New(at.Add(time.Second)), Verdict: flow.Verdict_DROPPED, DropReasonDesc: flow.DropReason_CT_MAP_INSERTION_FAILED,
		IP:     &flow.IP{Source: "fd00::5", Destination: "fd00::53", IpVersion: flow.IPVersion_IPv6},
		L4:     &flow.Layer4{Protocol: &flow.Layer4_UDP{UDP: &flow.UDP{SourcePort: 33000, DestinationPort: 53}}},
		Source: web, Summary: "UDP",
	})
	o.AddFlow(&flow.Flow{
		Time: timestamppb.New(at.Add(2 * time.Second)), Verdict: flow.Verdict_TRANSLATED, Type: flow.FlowType_SOCK,
		IP:                 &flow.IP{Destination: "10.244.0.9", IpVersion: flow.IPVersion_IPv4},
		L4:                 &flow.Layer4{Protocol: &flow.Layer4_TCP{TCP: &flow.TCP{DestinationPort: 5432}}},
		DestinationService: &flow.Service{Namespace: "db", Name: "postgres"},
		SockXlatePoint:     flow.SocketTranslationPoint_SOCK_XLATE_POINT_POST_DIRECTION_FWD,
		Summary:            "TCP connect 10.96.0.10:5432 -> 10.244.0.9:5432 (service db/postgres)",
	})
	runDir := serveObserver(t, o)

	out, _, err := observeCmd(t, "--run-dir", runDir)
	if err != nil {
		t.Fatal(err)
	}
	row := func(cols ...string) string {
		return fmt.Sprintf(flowRow, cols[0], cols[1], cols[2], cols[3], cols[4], cols[5])
	}
	want := row("TIME", "SOURCE", "DESTINATION", "VERDICT", "TYPE", "SUMMARY") +
		row("Jan  2 03:04:05.000", "default/web-1:40000", "10.244.0.9:5432", "FORWARDED", "from-endpoint", "TCP Flags: SYN") +
		"Jan  2 03:04:05.000  EVENTS LOST: 3 (PERF_EVENT_RING_BUFFER)\n" +
		row("Jan  2 03:04:06.000", "default/web-1:33000", "[fd00::53]:53", "DROPPED", "drop", "UDP; drop reason CT_MAP_INSERTION_FAILED") +
		row("Jan  2 03:04:07.000", "-", "10.244.0.9:5432 (service db/postgres)", "TRANSLATED", "post-xlate-fwd",
			"TCP connect 10.96.0.10:5432 -> 10.244.0.9:5432 (service db/postgres)")
	if out != want {
		t.Fatalf("observe:\n%s\nwant\n%s", out, want)
	}

	// JSON: a GetFlowsResponse per line; the server applies the filters,
	// which lost-event records pass: flows after the one shown may be
	// missing.
	out, _, err = observeCmd(t, "--run-dir", runDir, "-o", "json", "--last", "1", "--verdict", "FORWARDED")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	var resp, lostResp observer.GetFlowsResponse
	if len(lines) != 2 || protojson.Unmarshal([]byte(lines[0]), &resp) != nil || resp.GetFlow().GetSource().GetPodName() != "web-1" || resp.GetNodeName() != "node-1" ||
		protojson.Unmarshal([]byte(lines[1]), &lostResp) != nil || lostResp.GetLostEvents().GetNumEventsLost() != 3 {
		t.Fatalf("observe -o json --last 1 --verdict FORWARDED:\n%s\nwant two lines, the flow of web-1 and the lost events", out)
	}

	// Nothing selected: the header alone, or nothing in JSON.
	out, _, err = observeCmd(t, "--run-dir", runDir, "--until", "2020-01-01T00:00:00Z")
	if err != nil || out != row("TIME", "SOURCE", "DESTINATION", "VERDICT", "TYPE", "SUMMARY") {
		t.Fatalf("observe --until 2020 = %v\n%s\nwant the header alone", err, out)
	}
	out, _, err = observeCmd(t, "--run-dir", runDir, "--until", "2020-01-01T00:00:00Z", "-o", "json")
	if err != nil || out != "" {
		t.Fatalf("observe --until 2020 -o json = %v %q, want nothing", err, out)
	}

	// Follow: the last flow, then new ones, until the context ends.
	ctx, cancel := context.WithCancel(context.Background())
	var followOut syncBuffer
	cmd := newObserveCmd(&followOut, agentFlagSet())
	cmd.SetArgs([]string{"--run-dir", runDir, "-f", "--last", "1", "-o", "json"})
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	waitForOutput(t, &followOut, "SOCK_XLATE_POINT_POST_DIRECTION_FWD", "the last flow held")
	o.AddFlow(&flow.Flow{Time: timestamppb.New(at.Add(3 * time.Second)), Verdict: flow.Verdict_FORWARDED, Summary: "followed"})
	waitForOutput(t, &followOut, `"Summary":"followed"`, "the new flow")
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("observe -f after its context ended: %v, want a clean end", err)
	}
}

func TestObserveWithoutServer(t *testing.T) {
	runDir := t.TempDir()
	_, _, err := observeCmd(t, "--run-dir", runDir, "--timeout", "10s")
	want := "cannot reach the Hubble server at unix://" + filepath.Join(runDir, "hubble.sock")
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("observe without a server = %v, want an error containing %q", err, want)
	}
}

// TestObserveAgainstTheAgent runs the built agent and asks it with the
// built `agent observe`: records written into the agent's pinned event
// ring buffer come back as flows.
func TestObserveAgainstTheAgent(t *testing.T) {
	requireRoot(t)
	env := newAgentEnv(t)
	runDir := filepath.Join(env.dir, "run")
	agent := startAgent(t, env.runFlags()...)
	agent.waitFor("Started hive")

	out, errOut, code := agentCmd(t, "observe", "-o", "json", "--last", "5", "--run-dir", runDir)
	if code != 0 {
		t.Fatalf("agent observe = %d: %s", code, errOut)
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var resp observer.GetFlowsResponse
		if line != "" && protojson.Unmarshal([]byte(line), &resp) != nil {
			t.Fatalf("agent observe -o json printed a line that is no GetFlowsResponse: %s", line)
		}
	}

	// A record as the datapath writes it, into the agent's ring buffer.
	events, err := ebpf.LoadPinnedMap(filepath.Join(env.bpfRoot, "cellium", "cellium_events"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer events.Close()
	lost, err := ebpf.LoadPinnedMap(filepath.Join(env.bpfRoot, "cellium", "cellium_events_lost"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer lost.Close()
	w, err := monitortest.NewRecordWriter(events, lost)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	rec, err := monitorapi.Encode(&monitorapi.DropEvent{
		Time: time.Now(), EndpointID: 7, IfIndex: 1, Reason: monitorapi.DropInvalidPacket,
		Flow: monitorapi.Flow{Src: netip.MustParseAddr("10.244.0.5"), Dst: netip.MustParseAddr("10.244.0.9"), Proto: 6, SrcPort: 40000, DstPort: 80},
	}, monitorapi.SystemBootClock())
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Write(rec, 1); err != nil {
		t.Fatal(err)
	}
	// The monitor reads it when it can: follow until it comes, then
	// interrupt, which ends a follow cleanly.
	follow := exec.Command(agentBin, "observe", "-f", "--all", "--verdict", "DROPPED", "--to-port", "80", "--run-dir", runDir, "-o", "json")
	stdout, err := follow.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var followErr bytes.Buffer
	follow.Stderr = &followErr
	if err := follow.Start(); err != nil {
		t.Fatal(err)
	}
	defer follow.Process.Kill()
	firstLine := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		firstLine <- line
		io.Copy(io.Discard, stdout)
	}()
	var line string
	select {
	case line = <-firstLine:
	case <-time.After(30 * time.Second):
		t.Fatal("agent observe -f showed no flow within 30s")
	}
	var resp observer.GetFlowsResponse
	if err := protojson.Unmarshal([]byte(line), &resp); err != nil ||
		resp.GetFlow().GetDropReasonDesc() != flow.DropReason_INVALID_PACKET_DROPPED || resp.GetFlow().GetIP().GetSource() != "10.244.0.5" {
		t.Fatalf("agent observe -f printed %q, want the dropped flow (%v)", line, err)
	}
	if err := follow.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if err := follow.Wait(); err != nil {
		t.Fatalf("agent observe -f after SIGINT: %v (%s), want exit 0", err, followErr.String())
	}

	// The table, and a clear error where no server listens.
	out, _, code = agentCmd(t, "observe", "--run-dir", runDir, "--verdict", "DROPPED")
	if code != 0 || !strings.Contains(out, "10.244.0.5:40000") || !strings.Contains(out, "drop reason INVALID_PACKET_DROPPED") {
		t.Fatalf("agent observe (table) = %d:\n%s", code, out)
	}
	elsewhere := t.TempDir()
	_, errOut, code = agentCmd(t, "observe", "--run-dir", elsewhere)
	if want := "cannot reach the Hubble server at unix://" + filepath.Join(elsewhere, "hubble.sock"); code != 1 || !strings.Contains(errOut, want) {
		t.Fatalf("agent observe without an agent = %d %q, want an error containing %q", code, errOut, want)
	}

	agent.stop()
	if _, err := os.Lstat(filepath.Join(runDir, hubble.SocketName)); !os.IsNotExist(err) {
		t.Fatalf("hubble.sock after the agent stopped: %v, want it removed", err)
	}
}
