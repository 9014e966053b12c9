package ctmap_test

import (
	"net/netip"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/pkg/ctmap"
)

func TestKeyString(t *testing.T) {
	for _, tc := range []struct {
		key  interface{ String() string }
		want string
	}{
		{ctmap.NewKey4(unix.IPPROTO_TCP, netip.MustParseAddrPort("10.244.0.2:40000"), netip.MustParseAddrPort("10.244.0.3:80"), 0),
			"TCP 10.244.0.2:40000 -> 10.244.0.3:80 out"},
		{ctmap.NewKey4(unix.IPPROTO_UDP, netip.MustParseAddrPort("10.244.0.2:5353"), netip.MustParseAddrPort("10.96.0.10:53"), ctmap.KeyIncoming),
			"UDP 10.244.0.2:5353 -> 10.96.0.10:53 in"},
		{ctmap.NewKey4(unix.IPPROTO_ICMP, netip.MustParseAddrPort("10.244.0.2:77"), netip.MustParseAddrPort("10.244.0.3:0"), 0),
			"ICMP 10.244.0.2 -> 10.244.0.3 id=77 out"},
		{ctmap.NewKey6(unix.IPPROTO_TCP, netip.MustParseAddrPort("[fd00::2]:40000"), netip.MustParseAddrPort("[fd00::3]:80"), ctmap.KeyIncoming),
			"TCP [fd00::2]:40000 -> [fd00::3]:80 in"},
		{ctmap.NewKey6(unix.IPPROTO_ICMPV6, netip.MustParseAddrPort("[fd00::2]:9"), netip.MustParseAddrPort("[fd00::3]:0"), 0),
			"ICMPv6 fd00::2 -> fd00::3 id=9 out"},
		{ctmap.NewKey6(47, netip.MustParseAddrPort("[fd00::2]:0"), netip.MustParseAddrPort("[fd00::3]:0"), 1<<7),
			"proto-47 fd00::2 -> fd00::3 out flags=0x80"},
	} {
		if got := tc.key.String(); got != tc.want {
			t.Errorf("String() = %q, want %q", got, tc.want)
		}
	}
}

// Ports are stored in network byte order, and Reverse swaps the ends.
func TestKeyBytesAndReverse(t *testing.T) {
	k := ctmap.NewKey4(unix.IPPROTO_TCP, netip.MustParseAddrPort("10.244.0.2:258"), netip.MustParseAddrPort("10.244.0.3:80"), ctmap.KeyIncoming)
	if k.SrcPort != [2]byte{1, 2} || k.DstPort != [2]byte{0, 80} || k.SrcAddr != [4]byte{10, 244, 0, 2} {
		t.Fatalf("key %+v: want ports and addresses in network byte order", k)
	}
	r := k.Reverse()
	if r.Src() != k.Dst() || r.Dst() != k.Src() || r.Proto != k.Proto || r.Flags != k.Flags {
		t.Fatalf("Reverse of %v = %v", k, r)
	}
	k6 := ctmap.NewKey6(unix.IPPROTO_UDP, netip.MustParseAddrPort("[fd00::2]:258"), netip.MustParseAddrPort("[fd00::3]:53"), 0)
	if k6.SrcPort != [2]byte{1, 2} || k6.SrcAddr[0] != 0xfd || k6.SrcAddr[15] != 2 {
		t.Fatalf("key %+v: want ports and addresses in network byte order", k6)
	}
	if r6 := k6.Reverse(); r6.Src() != k6.Dst() || r6.Dst() != k6.Src() {
		t.Fatalf("Reverse of %v = %v", k6, r6)
	}
}

func TestEntryState(t *testing.T) {
	for _, tc := range []struct {
		flags uint16
		want  string
	}{
		{0, ctmap.StateNew},
		{ctmap.CTFSynSeen, ctmap.StateSynSent},
		{ctmap.CTFSynSeen | ctmap.CTFEstablished | ctmap.CTFSeenReply, ctmap.StateEstablished},
		{ctmap.CTFEstablished | ctmap.CTFTxClosing, ctmap.StateHalfClosed},
		{ctmap.CTFEstablished | ctmap.CTFTxClosing | ctmap.CTFRxClosing, ctmap.StateClosing},
		{ctmap.CTFSynSeen | ctmap.CTFRstSeen, ctmap.StateClosing},
	} {
		if got := (ctmap.Entry{Flags: tc.flags}).State(); got != tc.want {
			t.Errorf("flags %#x: state %s, want %s", tc.flags, got, tc.want)
		}
	}
}

func TestEntryString(t *testing.T) {
	e := ctmap.Entry{
		Lifetime: 1000, Flags: ctmap.CTFSynSeen | ctmap.CTFEstablished | ctmap.CTFSeenReply | 1<<9, EndpointID: 3,
		PacketsTx: 3, BytesTx: 180, PacketsRx: 2, BytesRx: 120, LastTx: 990, LastRx: 989,
	}
	want := "ESTABLISHED expires=1000 endpoint=3 tx=3/180 rx=2/120 last-tx=990 last-rx=989 flags=SYN_SEEN|ESTABLISHED|SEEN_REPLY|0x200"
	if got := e.String(); got != want {
		t.Fatalf("String() = %q, want %q", got, want)
	}
	if got := e.ExpiresIn(940); got != time.Minute {
		t.Fatalf("ExpiresIn = %v, want 1m", got)
	}
	if got := e.ExpiresIn(1010); got != -10*time.Second {
		t.Fatalf("ExpiresIn = %v, want -10s", got)
	}
}

// Now is CLOCK_BOOTTIME, not the wall clock or CLOCK_MONOTONIC.
func TestNowIsBootTime(t *testing.T) {
	var before, after unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &before); err != nil {
		t.Fatal(err)
	}
	now := ctmap.Now()
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &after); err != nil {
		t.Fatal(err)
	}
	if int64(now) < before.Sec || int64(now) > after.Sec {
		t.Fatalf("Now() = %d, want between %d and %d (CLOCK_BOOTTIME seconds)", now, before.Sec, after.Sec)
	}
}

// TestFlagsMatchC compares the Go flags, and the names FlagNames gives
// them, with ct.h's #defines, which BTF does not carry.
func TestFlagsMatchC(t *testing.T) {
	src, err := os.ReadFile("../../bpf/include/ct.h")
	if err != nil {
		t.Fatal(err)
	}
	defines := map[string]uint64{}
	for _, m := range regexp.MustCompile(`(?m)^#define ((?:CTF|CT_KEY_F)_\w+) \(1 << (\d+)\)$`).FindAllSubmatch(src, -1) {
		shift, err := strconv.Atoi(string(m[2]))
		if err != nil {
			t.Fatal(err)
		}
		defines[string(m[1])] = 1 << shift
	}
	want := map[string]uint64{
		"CT_KEY_F_INCOMING": uint64(ctmap.KeyIncoming),
		"CTF_SYN_SEEN":      uint64(ctmap.CTFSynSeen),
		"CTF_ESTABLISHED":   uint64(ctmap.CTFEstablished),
		"CTF_TX_CLOSING":    uint64(ctmap.CTFTxClosing),
		"CTF_RX_CLOSING":    uint64(ctmap.CTFRxClosing),
		"CTF_RST_SEEN":      uint64(ctmap.CTFRstSeen),
		"CTF_SEEN_REPLY":    uint64(ctmap.CTFSeenReply),
	}
	if len(defines) != len(want) {
		t.Errorf("ct.h defines %v, Go has %v", defines, want)
	}
	for name, flag := range want {
		if defines[name] != flag {
			t.Errorf("%s is %#x in ct.h, %#x in Go", name, defines[name], flag)
		}
		// An entry's flag reads as its C name without the prefix.
		if name, ok := strings.CutPrefix(name, "CTF_"); ok {
			if got := (ctmap.Entry{Flags: uint16(flag)}).FlagNames(); got != name {
				t.Errorf("flag %#x is named %s, want %s as in ct.h", flag, got, name)
			}
		}
	}
}
