package lbmap_test

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/cilium/ebpf/btf"

	"github.com/cellium/cellium/bpf"
	"github.com/cellium/cellium/bpf/bpftest"
	"github.com/cellium/cellium/pkg/lbmap"
)

// layouts pairs each map of the compiled sock_lb object with the Go types
// of its key and value.
var layouts = []struct {
	name       string
	key, value reflect.Type
}{
	{bpf.SockLBMapCelliumLb4Services, reflect.TypeFor[lbmap.Service4Key](), reflect.TypeFor[lbmap.ServiceValue]()},
	{bpf.SockLBMapCelliumLb6Services, reflect.TypeFor[lbmap.Service6Key](), reflect.TypeFor[lbmap.ServiceValue]()},
	{bpf.SockLBMapCelliumLb4Backends, reflect.TypeFor[lbmap.BackendID](), reflect.TypeFor[lbmap.Backend4]()},
	{bpf.SockLBMapCelliumLb6Backends, reflect.TypeFor[lbmap.BackendID](), reflect.TypeFor[lbmap.Backend6]()},
	{bpf.SockLBMapCelliumLb4Revnat, reflect.TypeFor[lbmap.RevNATIndex](), reflect.TypeFor[lbmap.RevNAT4]()},
	{bpf.SockLBMapCelliumLb6Revnat, reflect.TypeFor[lbmap.RevNATIndex](), reflect.TypeFor[lbmap.RevNAT6]()},
	{bpf.SockLBMapCelliumLbAffinity, reflect.TypeFor[lbmap.AffinityKey](), reflect.TypeFor[lbmap.AffinityValue]()},
	{bpf.SockLBMapCelliumLb4SockRevnat, reflect.TypeFor[lbmap.SockRevNAT4Key](), reflect.TypeFor[lbmap.SockRevNAT4Value]()},
	{bpf.SockLBMapCelliumLb6SockRevnat, reflect.TypeFor[lbmap.SockRevNAT6Key](), reflect.TypeFor[lbmap.SockRevNAT6Value]()},
}

// TestLayoutsMatchBTF compares every Go key and value with the BTF of its C
// type (see bpftest.CompareLayout).
func TestLayoutsMatchBTF(t *testing.T) {
	spec, err := bpf.LoadSockLB()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range layouts {
		m, ok := spec.Maps[l.name]
		if !ok {
			t.Errorf("the object has no map %s", l.name)
			continue
		}
		bpftest.CompareMap(t, l.name, m, l.key, l.value)
	}

	// Maglev: keyed by RevNATIndex; the inner arrays hold backend IDs.
	for _, name := range []string{bpf.SockLBMapCelliumLb4Maglev, bpf.SockLBMapCelliumLb6Maglev} {
		m := spec.Maps[name]
		bpftest.CompareLayout(t, name+" key", m.Key, reflect.TypeFor[lbmap.RevNATIndex]())
		if m.InnerMap == nil {
			t.Fatalf("%s has no inner map", name)
		}
		bpftest.CompareLayout(t, name+" inner key", m.InnerMap.Key, reflect.TypeFor[uint32]())
		table, ok := btf.UnderlyingType(m.InnerMap.Value).(*btf.Array)
		if !ok {
			t.Fatalf("%s: inner value is %v, want an array of backend IDs", name, m.InnerMap.Value)
		}
		bpftest.CompareLayout(t, name+" table entry", table.Type, reflect.TypeFor[lbmap.BackendID]())
	}
}

// TestFlagsMatchC compares the Go service flags with lb.h's #defines, which
// BTF does not carry.
func TestFlagsMatchC(t *testing.T) {
	src, err := os.ReadFile("../../bpf/include/lb.h")
	if err != nil {
		t.Fatal(err)
	}
	defines := map[string]uint64{}
	for _, m := range regexp.MustCompile(`(?m)^#define (SVC_F_\w+) \(1 << (\d+)\)$`).FindAllSubmatch(src, -1) {
		shift, _ := strconv.Atoi(string(m[2]))
		defines[string(m[1])] = 1 << shift
	}
	want := map[string]lbmap.ServiceFlags{
		"SVC_F_AFFINITY":          lbmap.ServiceAffinity,
		"SVC_F_MAGLEV":            lbmap.ServiceMaglev,
		"SVC_F_NODEPORT_WILDCARD": lbmap.ServiceNodePortWildcard,
		"SVC_F_LOCAL":             lbmap.ServiceLocal,
	}
	if len(defines) != len(want) {
		t.Errorf("lb.h defines %v, Go has %v", defines, want)
	}
	for name, flag := range want {
		if defines[name] != uint64(flag) {
			t.Errorf("%s is %#x in lb.h, %#x in Go", name, defines[name], uint8(flag))
		}
	}
}

// The maps hold addresses and ports in network byte order: check the bytes
// the kernel gets.
func TestNetworkByteOrder(t *testing.T) {
	for _, tc := range []struct {
		name  string
		value any
		want  []byte
	}{
		{
			"service4 key",
			lbmap.NewService4Key(netip.MustParseAddr("10.96.0.10"), 8080, lbmap.TCP, 3),
			[]byte{10, 96, 0, 10, 0x1f, 0x90, 3, 0, 6, 0, 0, 0},
		},
		{
			"service4 key from IPv4-mapped",
			lbmap.NewService4Key(netip.MustParseAddr("::ffff:10.96.0.10"), 53, lbmap.UDP, 0),
			[]byte{10, 96, 0, 10, 0, 53, 0, 0, 17, 0, 0, 0},
		},
		{
			"service6 key",
			lbmap.NewService6Key(netip.MustParseAddr("fd00::1"), 443, lbmap.TCP, 1),
			[]byte{0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0x01, 0xbb, 1, 0, 6, 0, 0, 0},
		},
		{
			"master",
			lbmap.NewServiceMaster(2, 0x0107, lbmap.ServiceAffinity|lbmap.ServiceMaglev, 90*time.Second),
			[]byte{90, 0, 0, 0, 2, 0, 7, 1, 3, 0, 0, 0},
		},
		{
			"backend4",
			lbmap.NewBackend4(netip.MustParseAddr("127.0.0.2"), 80, lbmap.UDP),
			[]byte{127, 0, 0, 2, 0, 80, 17, 0},
		},
		{
			"revnat4",
			lbmap.NewRevNAT4(netip.MustParseAddr("10.96.0.10"), 80),
			[]byte{10, 96, 0, 10, 0, 80, 0, 0},
		},
		{
			"sock revnat4 key",
			lbmap.NewSockRevNAT4Key(1, netip.MustParseAddrPort("127.0.0.2:80")),
			[]byte{1, 0, 0, 0, 0, 0, 0, 0, 127, 0, 0, 2, 0, 80, 0, 0},
		},
	} {
		var buf bytes.Buffer
		if err := binary.Write(&buf, binary.LittleEndian, tc.value); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf.Bytes(), tc.want) {
			t.Errorf("%s: bytes %v, want %v", tc.name, buf.Bytes(), tc.want)
		}
	}
}

func TestAccessorsRoundTrip(t *testing.T) {
	v4 := netip.MustParseAddrPort("10.96.0.10:8080")
	v6 := netip.MustParseAddrPort("[fd00::a:1]:53")
	for _, tc := range []struct {
		name      string
		got, want netip.AddrPort
	}{
		{"service4 key", lbmap.NewService4Key(v4.Addr(), v4.Port(), lbmap.TCP, 0).AddrPort(), v4},
		{"service6 key", lbmap.NewService6Key(v6.Addr(), v6.Port(), lbmap.UDP, 0).AddrPort(), v6},
		{"backend4", lbmap.NewBackend4(v4.Addr(), v4.Port(), lbmap.TCP).AddrPort(), v4},
		{"backend6", lbmap.NewBackend6(v6.Addr(), v6.Port(), lbmap.TCP).AddrPort(), v6},
		{"revnat4", lbmap.NewRevNAT4(v4.Addr(), v4.Port()).AddrPort(), v4},
		{"revnat6", lbmap.NewRevNAT6(v6.Addr(), v6.Port()).AddrPort(), v6},
		{"sock revnat4 key", lbmap.NewSockRevNAT4Key(9, v4).AddrPort(), v4},
		{"sock revnat6 key", lbmap.NewSockRevNAT6Key(9, v6).AddrPort(), v6},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, tc.got, tc.want)
		}
	}
	if got := lbmap.NewServiceMaster(1, 1, lbmap.ServiceAffinity, 3*time.Hour).AffinityTimeout(); got != 3*time.Hour {
		t.Errorf("affinity timeout %v, want 3h", got)
	}
}

func TestWrongFamilyPanics(t *testing.T) {
	for _, tc := range []struct {
		name string
		fn   func()
	}{
		{"IPv6 in an IPv4 key", func() { lbmap.NewService4Key(netip.MustParseAddr("fd00::1"), 80, lbmap.TCP, 0) }},
		{"IPv4 in an IPv6 backend", func() { lbmap.NewBackend6(netip.MustParseAddr("10.0.0.1"), 80, lbmap.TCP) }},
		{"IPv4-mapped in an IPv6 key", func() { lbmap.NewService6Key(netip.MustParseAddr("::ffff:10.0.0.1"), 80, lbmap.TCP, 0) }},
		{"zero address", func() { lbmap.NewRevNAT4(netip.Addr{}, 80) }},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", tc.name)
				}
			}()
			tc.fn()
		}()
	}
}

func TestStrings(t *testing.T) {
	fe := netip.MustParseAddr("10.96.0.10")
	for _, tc := range []struct {
		value interface{ String() string }
		want  string
	}{
		{lbmap.NewService4Key(fe, 80, lbmap.TCP, 2), "10.96.0.10:80/TCP slot 2"},
		{lbmap.NewService6Key(netip.MustParseAddr("fd00::1"), 53, lbmap.UDP, 0), "[fd00::1]:53/UDP slot 0"},
		{lbmap.Service4Key{Address: lbmap.NewAddr4(fe), DPort: lbmap.NewPort(80), Proto: 132, Scope: 1}, "10.96.0.10:80/proto-132 slot 0 scope 1"},
		{lbmap.NewServiceMaster(3, 7, lbmap.ServiceAffinity|lbmap.ServiceNodePortWildcard, 30*time.Second),
			"backend 30, count 3, revnat 7, flags affinity|nodeport-wildcard"},
		{lbmap.NewServiceSlot(12, 7), "backend 12, count 0, revnat 7, flags none"},
		{lbmap.ServiceFlags(0x81), "affinity|0x80"},
		{lbmap.NewBackend4(netip.MustParseAddr("127.0.0.2"), 8080, lbmap.TCP), "127.0.0.2:8080/TCP"},
		{lbmap.Backend6{Address: lbmap.NewAddr6(netip.MustParseAddr("fd00::2")), Port: lbmap.NewPort(80), Proto: lbmap.UDP, Flags: 1}, "[fd00::2]:80/UDP flags 0x1"},
		{lbmap.NewRevNAT6(netip.MustParseAddr("fd00::10"), 443), "[fd00::10]:443"},
		{lbmap.AffinityKey{NetNSCookie: 4096, RevNATIndex: 7}, "netns 4096 revnat 7"},
		{lbmap.AffinityValue{BackendID: 3, LastUsed: 120}, "backend 3, last used 120s after boot"},
		{lbmap.NewSockRevNAT4Key(77, netip.MustParseAddrPort("127.0.0.2:80")), "socket 77 backend 127.0.0.2:80"},
		{lbmap.SockRevNAT4Value{Address: lbmap.NewAddr4(fe), Port: lbmap.NewPort(80), RevNATIndex: 7}, "frontend 10.96.0.10:80 revnat 7"},
	} {
		if got := tc.value.String(); got != tc.want {
			t.Errorf("String() = %q, want %q", got, tc.want)
		}
	}
}
