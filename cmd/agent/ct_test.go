package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/netip"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/api"
	"github.com/cellium/cellium/cells/bpfmaps"
	"github.com/cellium/cellium/cells/bpfmaps/bpfmapstest"
	"github.com/cellium/cellium/cells/ctgc"
	"github.com/cellium/cellium/cells/ctmaps"
	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/health"
	"github.com/cellium/cellium/pkg/apiv1"
	"github.com/cellium/cellium/pkg/ctmap"
	"github.com/cellium/cellium/pkg/nodeportmap"
)

// startCells runs cells with statedb, jobs, health, the API and the BPF
// maps cell in this process, as the agent's hive does, over a bpffs of the
// test's. It returns the API socket, and stop, which stops the hive once
// (the test's end calls it too).
func startCells(t *testing.T, cells ...cell.Cell) (socket string, stop func() error) {
	socket = filepath.Join(t.TempDir(), "agent.sock")
	opts := hive.DefaultOptions()
	opts.ModuleDecorators = health.ModuleDecorators
	all := append([]cell.Cell{statedb.Cell, job.Cell, health.Cell, api.Cell, bpfmaps.Cell}, cells...)
	h := hive.NewWithOptions(opts, append(all, health.StartedMarker)...)
	hive.AddConfigOverride(h, func(c *health.Config) { c.HealthAddr = "" })
	hive.AddConfigOverride(h, func(c *api.Config) { c.APISocket = socket })
	hive.AddConfigOverride(h, func(c *bpfmaps.Config) { c.BPFRoot = bpfmapstest.Root(t) })
	log := hivetest.Logger(t)
	if err := h.Start(log, context.Background()); err != nil {
		t.Fatal(err)
	}
	stop = sync.OnceValue(func() error { return h.Stop(log, context.Background()) })
	t.Cleanup(func() { stop() })
	return socket, stop
}

// startCTAgent runs the conntrack maps, a NodePort NAT map as the loader
// declares it, their GC and the API in this process and returns the API
// socket and the maps once the GC's first pass is done.
func startCTAgent(t *testing.T) (string, *ctmaps.Maps) {
	socket, maps, _ := startCTAgentNAT(t)
	return socket, maps
}

func startCTAgentNAT(t *testing.T) (string, *ctmaps.Maps, *ctgc.NodePortNAT) {
	var (
		maps *ctmaps.Maps
		nat  *ctgc.NodePortNAT
		gc   *ctgc.GC
	)
	socket, _ := startCells(t, ctmaps.Cell, ctgc.Cell,
		cell.Provide(endpointmanager.NewTable, statedb.RWTable[*endpointmanager.Endpoint].ToTable),
		cell.Provide(func(lc cell.Lifecycle, reg *bpfmaps.Registry) (*ctgc.NodePortNAT, error) {
			return bpfmaps.NewMap[nodeportmap.Key4, nodeportmap.NAT4](lc, reg, bpfmaps.Spec{
				Name: nodeportmap.MapName, Type: ebpf.LRUHash, MaxEntries: 1024,
			})
		}),
		cell.Invoke(func(m *ctmaps.Maps, n *ctgc.NodePortNAT, g *ctgc.GC) { maps, nat, gc = m, n, g }),
	)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := gc.Run(ctx); err != nil {
		t.Fatal(err)
	}
	return socket, maps, nat
}

func TestCTCommands(t *testing.T) {
	socket, maps, nat := startCTAgentNAT(t)
	now := ctmap.Now()
	expiredNAT := nodeportmap.NewNAT4(netip.MustParseAddrPort("10.244.0.2:8080"), 1)
	expiredNAT.Lifetime = now - 5
	if err := nat.Put(nodeportmap.NewKey4(6, netip.MustParseAddrPort("192.0.2.1:40000"), netip.MustParseAddrPort("10.90.0.11:30080"), nodeportmap.DirIn), expiredNAT); err != nil {
		t.Fatal(err)
	}
	if err := maps.TCP4.Put(
		ctmap.NewKey4(6, netip.MustParseAddrPort("10.244.0.2:40000"), netip.MustParseAddrPort("10.96.0.10:80"), 0),
		ctmap.Entry{Lifetime: now + 3600, Flags: ctmap.CTFSynSeen | ctmap.CTFEstablished, EndpointID: 7, PacketsTx: 3, BytesTx: 180, PacketsRx: 2, BytesRx: 120},
	); err != nil {
		t.Fatal(err)
	}
	if err := maps.Any4.Put(
		ctmap.NewKey4(1, netip.MustParseAddrPort("10.244.0.2:4242"), netip.MustParseAddrPort("10.244.0.3:0"), 0),
		ctmap.Entry{Lifetime: now - 5, EndpointID: 7},
	); err != nil {
		t.Fatal(err)
	}
	if err := maps.Any6.Put(
		ctmap.NewKey6(17, netip.MustParseAddrPort("[fd00::5]:5353"), netip.MustParseAddrPort("[fd00::2]:53"), ctmap.KeyIncoming),
		ctmap.Entry{Lifetime: now + 60},
	); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, string, int) {
		var out, errOut bytes.Buffer
		code := execute(append(args, "--api-socket", socket), &out, &errOut)
		return out.String(), errOut.String(), code
	}

	out, errOut, code := run("ct", "list")
	// EXPIRES counts down: a second may pass between putting and listing.
	wantList := regexp.MustCompile(`^PROTO +SOURCE +DESTINATION +DIR +STATE +EXPIRES +ENDPOINT +TX PKTS/BYTES +RX PKTS/BYTES
TCP +10\.244\.0\.2:40000 +10\.96\.0\.10:80 +out +ESTABLISHED +(1h0m0s|59m5[89]s) +7 +3/180 +2/120
ICMP +10\.244\.0\.2 id 4242 +10\.244\.0\.3 +out +NEW +expired +7 +0/0 +0/0
UDP +\[fd00::5\]:5353 +\[fd00::2\]:53 +in +NEW +(1m0s|5[89]s) +- +0/0 +0/0
$`)
	if code != 0 || !wantList.MatchString(out) {
		t.Errorf("ct list = %d %q\n%s\nwant\n%s", code, errOut, out, wantList)
	}

	out, errOut, code = run("ct", "list", "-o", "json", "--family", "6")
	var entries apiv1.ConntrackEntries
	if code != 0 || json.Unmarshal([]byte(out), &entries) != nil || len(entries.Entries) != 1 || entries.Entries[0].Direction != "in" {
		t.Errorf("ct list -o json --family 6 = %d %q\n%s\nwant the UDP entry, direction in", code, errOut, out)
	}
	out, _, code = run("ct", "list", "--endpoint", "7", "--limit", "1")
	if code != 0 || strings.Count(out, "\n") != 3 || !strings.Contains(out, "10.96.0.10:80") || !regexp.MustCompile(`\(first 1 entries; --after cellium_ct4_tcp/[0-9a-f]+ shows the next, --limit 0 all\)`).MatchString(out) {
		t.Errorf("ct list --endpoint 7 --limit 1 = %d\n%s\nwant the TCP entry and a truncation note with the cursor", code, out)
	}
	_, errOut, code = run("ct", "list", "--after", "nonsense")
	if code != 1 || !strings.Contains(errOut, `invalid after "nonsense": want the next cursor of an earlier listing`) {
		t.Errorf("ct list --after nonsense = %d %q, want a refusal", code, errOut)
	}
	for _, bad := range [][]string{{"--family", "5"}, {"--endpoint", "70000"}, {"--limit", "-1"}} {
		_, errOut, code = run(append([]string{"ct", "list"}, bad...)...)
		if code != 1 || !strings.Contains(errOut, "invalid "+bad[0]+" "+bad[1]) {
			t.Errorf("ct list %v = %d %q, want an error naming the flag", bad, code, errOut)
		}
	}

	out, errOut, code = run("ct", "gc", "--run")
	wantPass := regexp.MustCompile(`^Pass \d+ at \S+: scanned 4, deleted 2 in \S+; next in \S+
MAP +CAPACITY +SCANNED +EXPIRED +ENDPOINT GONE
cellium_ct4_tcp +524288 +1 +0 +0
cellium_ct4_any +262144 +1 +1 +0
cellium_ct6_tcp +524288 +0 +0 +0
cellium_ct6_any +262144 +1 +0 +0
cellium_nodeport4_nat +1024 +1 +1 +0
$`)
	if code != 0 || !wantPass.MatchString(out) {
		t.Errorf("ct gc --run = %d %q\n%s\nwant\n%s", code, errOut, out, wantPass)
	}
	out, errOut, code = run("ct", "gc", "-o", "json")
	var st apiv1.ConntrackGC
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil || st.Last == nil || st.Last.Number != st.Passes || st.Last.Deleted != 2 || st.IntervalMode != "adaptive" {
		t.Errorf("ct gc -o json = %d %q\n%s\nwant the last pass, which deleted 2", code, errOut, out)
	}

	out, errOut, code = run("ct", "flush")
	if want := "Deleted 2 entries (cellium_ct4_tcp 1, cellium_ct4_any 0, cellium_ct6_tcp 0, cellium_ct6_any 1)\n"; code != 0 || out != want {
		t.Errorf("ct flush = %d %q\n%s\nwant\n%s", code, errOut, out, want)
	}
	out, _, code = run("ct", "list")
	if code != 0 || strings.Count(out, "\n") != 1 {
		t.Errorf("ct list after a flush = %d\n%s\nwant only the header", code, out)
	}
}

// TestCTListPages: a listing larger than a page comes page by page, every
// entry once; --limit cuts it with a cursor from which --after goes on.
func TestCTListPages(t *testing.T) {
	socket, maps := startCTAgent(t)
	defer func(size int) { ctPageSize = size }(ctPageSize)
	ctPageSize = 3
	now := ctmap.Now()
	want := map[string]bool{}
	for i := range 8 {
		src := netip.AddrPortFrom(netip.MustParseAddr("10.244.0.2"), uint16(40000+i))
		if err := maps.TCP4.Put(ctmap.NewKey4(6, src, netip.MustParseAddrPort("10.96.0.10:80"), 0), ctmap.Entry{Lifetime: now + 3600}); err != nil {
			t.Fatal(err)
		}
		want[src.String()] = true
	}
	for i := range 2 {
		src := netip.AddrPortFrom(netip.MustParseAddr("fd00::2"), uint16(50000+i))
		if err := maps.Any6.Put(ctmap.NewKey6(17, src, netip.MustParseAddrPort("[fd00::3]:53"), 0), ctmap.Entry{Lifetime: now + 60}); err != nil {
			t.Fatal(err)
		}
		want[src.String()] = true
	}
	run := func(args ...string) apiv1.ConntrackEntries {
		t.Helper()
		var out, errOut bytes.Buffer
		if code := execute(append(args, "--api-socket", socket, "-o", "json"), &out, &errOut); code != 0 {
			t.Fatalf("agent %v = %d: %s", args, code, errOut.String())
		}
		var entries apiv1.ConntrackEntries
		if err := json.Unmarshal(out.Bytes(), &entries); err != nil {
			t.Fatalf("agent %v -o json: %v\n%s", args, err, out.String())
		}
		return entries
	}
	seen := func(entries ...apiv1.ConntrackEntry) map[string]bool {
		got := map[string]bool{}
		for _, e := range entries {
			k := netip.AddrPortFrom(netip.MustParseAddr(e.Source), e.SrcPort).String()
			if got[k] {
				t.Fatalf("entry %s listed twice", k)
			}
			got[k] = true
		}
		return got
	}

	all := run("ct", "list")
	if got := seen(all.Entries...); !sameKeys(got, want) || all.Truncated {
		t.Fatalf("ct list over pages of 3 = %v (truncated %v), want every one of %v once", got, all.Truncated, want)
	}

	first := run("ct", "list", "--limit", "5")
	if len(first.Entries) != 5 || !first.Truncated || first.Next == "" {
		t.Fatalf("ct list --limit 5 = %d entries, truncated %v, next %q; want 5 and a cursor", len(first.Entries), first.Truncated, first.Next)
	}
	rest := run("ct", "list", "--after", first.Next)
	if got := seen(append(first.Entries, rest.Entries...)...); !sameKeys(got, want) {
		t.Fatalf("--limit 5 then --after its cursor = %v, want every one of %v once", got, want)
	}

	var table bytes.Buffer
	if code := execute([]string{"ct", "list", "--api-socket", socket}, &table, io.Discard); code != 0 || strings.Count(table.String(), "\n") != 11 {
		t.Fatalf("ct list (table) over pages = %d\n%s\nwant a header and 10 rows", code, table.String())
	}
}

func sameKeys(a, b map[string]bool) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if !b[k] {
			return false
		}
	}
	return true
}
