package ctgc_test

import (
	"errors"
	"net/http"
	"net/netip"
	"net/url"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/cellium/cellium/cells/bpfmaps/bpfmapstest"
	"github.com/cellium/cellium/pkg/apiv1"
	"github.com/cellium/cellium/pkg/client"
	"github.com/cellium/cellium/pkg/ctmap"
)

// TestConntrackAPI lists, flushes and collects over the API socket with
// pkg/client, as `agent ct` does.
func TestConntrackAPI(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "agent.sock")
	e := newGCEnv(t, bpfmapstest.Root(t), envOptions{endpoints: []uint16{7}, apiSocket: socket})
	now := ctmap.Now()
	web := ctmap.NewKey4(6, netip.MustParseAddrPort("10.244.0.2:40000"), netip.MustParseAddrPort("10.96.0.10:80"), 0)
	if err := e.maps.TCP4.Put(web, ctmap.Entry{
		Lifetime: now + 3600, Flags: ctmap.CTFSynSeen | ctmap.CTFEstablished | ctmap.CTFSeenReply, EndpointID: 7,
		PacketsTx: 3, BytesTx: 180, PacketsRx: 2, BytesRx: 120, LastTx: now - 1,
	}); err != nil {
		t.Fatal(err)
	}
	dns := ctmap.NewKey6(17, netip.MustParseAddrPort("[fd00::5]:5353"), netip.MustParseAddrPort("[fd00::2]:53"), ctmap.KeyIncoming)
	if err := e.maps.Any6.Put(dns, ctmap.Entry{Lifetime: now + 60, EndpointID: 8, PacketsTx: 1, BytesTx: 60}); err != nil {
		t.Fatal(err)
	}
	ping := ctmap.NewKey4(1, netip.MustParseAddrPort("10.244.0.2:4242"), netip.MustParseAddrPort("10.244.0.3:0"), 0)
	if err := e.maps.Any4.Put(ping, ctmap.Entry{Lifetime: now - 5, EndpointID: 7}); err != nil {
		t.Fatal(err)
	}

	c := client.New(socket)
	ctx := t.Context()
	all, err := c.Conntrack(ctx, client.ConntrackQuery{})
	if err != nil {
		t.Fatal(err)
	}
	if len(all.Entries) != 3 || all.Truncated {
		t.Fatalf("GET %s: %+v, want the 3 entries", apiv1.PathConntrack, all)
	}
	got := all.Entries[0]
	if got.LifetimeSeconds < 3598 || got.LifetimeSeconds > 3600 || got.LastTxSecondsAgo < 1 || got.LastTxSecondsAgo > 3 {
		t.Errorf("web entry: lifetime %ds, last tx %ds ago; want about 3600 and 1", got.LifetimeSeconds, got.LastTxSecondsAgo)
	}
	got.LifetimeSeconds, got.LastTxSecondsAgo = 0, 0
	want := apiv1.ConntrackEntry{
		Map: "cellium_ct4_tcp", Family: 4, Protocol: "TCP", Direction: "out",
		Source: "10.244.0.2", SrcPort: 40000, Destination: "10.96.0.10", DstPort: 80,
		State: "ESTABLISHED", Flags: []string{"SYN_SEEN", "ESTABLISHED", "SEEN_REPLY"},
		EndpointID: 7, PacketsTx: 3, BytesTx: 180, PacketsRx: 2, BytesRx: 120, LastRxSecondsAgo: -1,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("first entry (maps in order TCP4, any4, TCP6, any6):\n%+v\nwant\n%+v", got, want)
	}
	if e := all.Entries[1]; e.Map != "cellium_ct4_any" || e.Protocol != "ICMP" || e.SrcPort != 4242 || e.LifetimeSeconds > -5 || e.State != "NEW" {
		t.Errorf("ping entry: %+v, want ICMP id 4242, expired 5s ago, NEW", e)
	}
	if e := all.Entries[2]; e.Map != "cellium_ct6_any" || e.Family != 6 || e.Direction != "in" || e.Source != "fd00::5" || e.DstPort != 53 || e.EndpointID != 8 {
		t.Errorf("dns entry: %+v, want UDP fd00::5 -> fd00::2:53, in, endpoint 8", e)
	}

	for _, tc := range []struct {
		q    client.ConntrackQuery
		maps []string
		more bool
	}{
		{client.ConntrackQuery{Family: 6}, []string{"cellium_ct6_any"}, false},
		{client.ConntrackQuery{Family: 4}, []string{"cellium_ct4_tcp", "cellium_ct4_any"}, false},
		{client.ConntrackQuery{EndpointID: 7}, []string{"cellium_ct4_tcp", "cellium_ct4_any"}, false},
		{client.ConntrackQuery{EndpointID: 8, Family: 4}, nil, false},
		{client.ConntrackQuery{Limit: 2}, []string{"cellium_ct4_tcp", "cellium_ct4_any"}, true},
		{client.ConntrackQuery{Limit: 3}, []string{"cellium_ct4_tcp", "cellium_ct4_any", "cellium_ct6_any"}, false},
	} {
		got, err := c.Conntrack(ctx, tc.q)
		if err != nil {
			t.Fatalf("%+v: %v", tc.q, err)
		}
		var maps []string
		for _, e := range got.Entries {
			maps = append(maps, e.Map)
		}
		if strings.Join(maps, ",") != strings.Join(tc.maps, ",") || got.Truncated != tc.more {
			t.Errorf("%+v: entries of %v, truncated %v; want %v, %v", tc.q, maps, got.Truncated, tc.maps, tc.more)
		}
	}

	for query, msg := range map[string]string{
		"family=5":          `invalid family "5": want 4 or 6`,
		"endpoint=0":        `invalid endpoint "0"`,
		"endpoint=x":        `invalid endpoint "x"`,
		"limit=-1":          `invalid limit "-1"`,
		"proto=tcp":         `unknown query parameter "proto"`,
		"family=4&family=6": `query parameter "family" given 2 times`,
	} {
		q, _ := url.ParseQuery(query)
		err := c.Do(ctx, http.MethodGet, apiv1.PathConntrack, q, nil, nil)
		if apiErr, ok := errors.AsType[*client.APIError](err); !ok || apiErr.Status != http.StatusBadRequest || !strings.Contains(apiErr.Message, msg) {
			t.Errorf("GET %s?%s: %v, want 400 %q", apiv1.PathConntrack, query, err, msg)
		}
	}

	// A pass on demand deletes the expired ping.
	p, err := c.ConntrackGCRun(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if p.Deleted != 1 || p.Scanned != 3 || len(p.Maps) != 4 || p.Maps[1].Map != "cellium_ct4_any" || p.Maps[1].Expired != 1 {
		t.Errorf("POST %s: %+v, want a pass that scanned 3 and deleted the ping from cellium_ct4_any", apiv1.PathConntrackGC, p)
	}
	st, err := c.ConntrackGC(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Passes != p.Number || st.Last == nil || st.Last.Number != p.Number || st.IntervalMode != "adaptive" || st.IntervalSeconds != p.IntervalSeconds || st.Waiting != "" {
		t.Errorf("GET %s: %+v, want the pass just run (%d) and its interval", apiv1.PathConntrackGC, st, p.Number)
	}

	f, err := c.ConntrackFlush(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wantFlush := apiv1.ConntrackFlush{Deleted: 2, Maps: []apiv1.ConntrackMapFlush{
		{Map: "cellium_ct4_tcp", Deleted: 1}, {Map: "cellium_ct4_any", Deleted: 0},
		{Map: "cellium_ct6_tcp", Deleted: 0}, {Map: "cellium_ct6_any", Deleted: 1},
	}}
	if f.Deleted != wantFlush.Deleted || len(f.Maps) != 4 || f.Maps[0] != wantFlush.Maps[0] || f.Maps[3] != wantFlush.Maps[3] {
		t.Errorf("POST %s: %+v, want %+v", apiv1.PathConntrackFlush, f, wantFlush)
	}
	if left, err := c.Conntrack(ctx, client.ConntrackQuery{}); err != nil || len(left.Entries) != 0 {
		t.Errorf("entries after a flush: %+v, %v; want none", left.Entries, err)
	}
	if metric(t, e.registry, "cellium_ct_gc_entries_deleted_total", "map", "cellium_ct6_any", "reason", "flush") != 1 {
		t.Error("the flush is not counted in cellium_ct_gc_entries_deleted_total{reason=flush}")
	}
	if _, err := e.maps.TCP4.Lookup(web); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Errorf("web entry after a flush: %v, want it gone", err)
	}
}
