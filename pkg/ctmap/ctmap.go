package ctmap

import (
	"fmt"
	"net/netip"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Flags of Key4.Flags and Key6.Flags (CT_KEY_F_* in ct.h).
const (
	// KeyIncoming marks the entry of the to-endpoint program: the
	// connection was opened towards the local endpoint. Clear: the
	// from-endpoint program's entry, a connection the endpoint opened.
	KeyIncoming uint8 = 1 << 1
)

// Flags of Entry.Flags (CTF_* in ct.h).
const (
	// CTFSynSeen: the connection started with a SYN (TCP).
	CTFSynSeen uint16 = 1 << iota
	// CTFEstablished: a reply was seen, or a TCP connection was first seen
	// after its handshake.
	CTFEstablished
	// CTFTxClosing: the original direction sent a FIN.
	CTFTxClosing
	// CTFRxClosing: the reply direction sent a FIN.
	CTFRxClosing
	// CTFRstSeen: either direction sent a RST.
	CTFRstSeen
	// CTFSeenReply: a packet of the reply direction was seen.
	CTFSeenReply
)

var entryFlagNames = []string{"SYN_SEEN", "ESTABLISHED", "TX_CLOSING", "RX_CLOSING", "RST_SEEN", "SEEN_REPLY"}

// Key4 is the key of the IPv4 maps, struct ct4_key.
type Key4 struct {
	SrcAddr [4]byte
	DstAddr [4]byte
	// SrcPort and DstPort are in network byte order.
	SrcPort [2]byte
	DstPort [2]byte
	Proto   uint8
	Flags   uint8
	_       [2]byte
}

// Key6 is the key of the IPv6 maps, struct ct6_key.
type Key6 struct {
	SrcAddr [16]byte
	DstAddr [16]byte
	SrcPort [2]byte
	DstPort [2]byte
	Proto   uint8
	Flags   uint8
	_       [2]byte
}

// Entry is the value of every conntrack map, struct ct_entry.
type Entry struct {
	// Lifetime is when the entry expires, in seconds of CLOCK_BOOTTIME.
	Lifetime uint32
	// Flags are CTF* bits.
	Flags uint16
	// EndpointID is the local endpoint the connection belongs to, 0 for
	// none.
	EndpointID uint16
	// Tx counts the original direction, Rx the reply direction.
	PacketsTx uint64
	BytesTx   uint64
	PacketsRx uint64
	BytesRx   uint64
	// LastTx and LastRx are when the last packet of each direction was
	// seen, in seconds of CLOCK_BOOTTIME; 0 for never.
	LastTx uint32
	LastRx uint32
}

// Now is the current time on the clock of the entries: seconds of
// CLOCK_BOOTTIME, which the programs read with bpf_ktime_get_boot_ns.
func Now() uint32 {
	var ts unix.Timespec
	// CLOCK_BOOTTIME cannot fail on Linux: the clock ID is valid and ts
	// is writable.
	_ = unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts)
	return uint32(ts.Sec)
}

func port(p uint16) [2]byte { return [2]byte{byte(p >> 8), byte(p)} }

func hostPort(p [2]byte) uint16 { return uint16(p[0])<<8 | uint16(p[1]) }

// NewKey4 is the key of a connection from src to dst, IPv4 addresses.
func NewKey4(proto uint8, src, dst netip.AddrPort, flags uint8) Key4 {
	return Key4{
		SrcAddr: src.Addr().As4(), DstAddr: dst.Addr().As4(),
		SrcPort: port(src.Port()), DstPort: port(dst.Port()),
		Proto: proto, Flags: flags,
	}
}

// NewKey6 is the key of a connection from src to dst, IPv6 addresses.
func NewKey6(proto uint8, src, dst netip.AddrPort, flags uint8) Key6 {
	return Key6{
		SrcAddr: src.Addr().As16(), DstAddr: dst.Addr().As16(),
		SrcPort: port(src.Port()), DstPort: port(dst.Port()),
		Proto: proto, Flags: flags,
	}
}

// Src is the initiator's address and port.
func (k Key4) Src() netip.AddrPort {
	return netip.AddrPortFrom(netip.AddrFrom4(k.SrcAddr), hostPort(k.SrcPort))
}

// Dst is the responder's address and port.
func (k Key4) Dst() netip.AddrPort {
	return netip.AddrPortFrom(netip.AddrFrom4(k.DstAddr), hostPort(k.DstPort))
}

// Reverse is the tuple as a reply packet carries it, which is how the
// programs look a reply up, with the same flags.
func (k Key4) Reverse() Key4 {
	k.SrcAddr, k.DstAddr = k.DstAddr, k.SrcAddr
	k.SrcPort, k.DstPort = k.DstPort, k.SrcPort
	return k
}

// String reads "TCP 10.244.0.2:40000 -> 10.244.0.3:80 out".
func (k Key4) String() string { return keyString(k.Proto, k.Src(), k.Dst(), k.Flags) }

// Src is the initiator's address and port.
func (k Key6) Src() netip.AddrPort {
	return netip.AddrPortFrom(netip.AddrFrom16(k.SrcAddr), hostPort(k.SrcPort))
}

// Dst is the responder's address and port.
func (k Key6) Dst() netip.AddrPort {
	return netip.AddrPortFrom(netip.AddrFrom16(k.DstAddr), hostPort(k.DstPort))
}

// Reverse: see Key4.Reverse.
func (k Key6) Reverse() Key6 {
	k.SrcAddr, k.DstAddr = k.DstAddr, k.SrcAddr
	k.SrcPort, k.DstPort = k.DstPort, k.SrcPort
	return k
}

// String reads "TCP [fd00::2]:40000 -> [fd00::3]:80 in".
func (k Key6) String() string { return keyString(k.Proto, k.Src(), k.Dst(), k.Flags) }

func keyString(proto uint8, src, dst netip.AddrPort, flags uint8) string {
	dir := "out"
	if flags&KeyIncoming != 0 {
		dir = "in"
	}
	if rest := flags &^ KeyIncoming; rest != 0 {
		dir += fmt.Sprintf(" flags=%#x", rest)
	}
	switch proto {
	case unix.IPPROTO_ICMP, unix.IPPROTO_ICMPV6:
		return fmt.Sprintf("%s %s -> %s id=%d %s", ProtoName(proto), src.Addr(), dst.Addr(), src.Port(), dir)
	case unix.IPPROTO_TCP, unix.IPPROTO_UDP, unix.IPPROTO_SCTP:
		return fmt.Sprintf("%s %s -> %s %s", ProtoName(proto), src, dst, dir)
	}
	return fmt.Sprintf("%s %s -> %s %s", ProtoName(proto), src.Addr(), dst.Addr(), dir)
}

// ProtoName names an IP protocol: "TCP", "UDP", "ICMP", "ICMPv6", or
// "proto-N" for the others.
func ProtoName(proto uint8) string {
	switch proto {
	case unix.IPPROTO_TCP:
		return "TCP"
	case unix.IPPROTO_UDP:
		return "UDP"
	case unix.IPPROTO_ICMP:
		return "ICMP"
	case unix.IPPROTO_ICMPV6:
		return "ICMPv6"
	case unix.IPPROTO_SCTP:
		return "SCTP"
	}
	return fmt.Sprintf("proto-%d", proto)
}

// Connection states, as State names them.
const (
	// StateNew: no reply yet (UDP, ICMP, others), or a TCP connection
	// whose first packet was no SYN and no reply has been seen.
	StateNew = "NEW"
	// StateSynSent: a TCP SYN without a reply.
	StateSynSent = "SYN_SENT"
	// StateEstablished: a reply was seen.
	StateEstablished = "ESTABLISHED"
	// StateHalfClosed: one direction of a TCP connection sent a FIN.
	StateHalfClosed = "HALF_CLOSED"
	// StateClosing: both directions sent a FIN, or one sent a RST; the
	// entry lives for the close lifetime.
	StateClosing = "CLOSING"
)

// State names the connection's state from the entry's flags.
func (e Entry) State() string {
	switch {
	case e.Flags&CTFRstSeen != 0, e.Flags&(CTFTxClosing|CTFRxClosing) == CTFTxClosing|CTFRxClosing:
		return StateClosing
	case e.Flags&(CTFTxClosing|CTFRxClosing) != 0:
		return StateHalfClosed
	case e.Flags&CTFEstablished != 0:
		return StateEstablished
	case e.Flags&CTFSynSeen != 0:
		return StateSynSent
	}
	return StateNew
}

// FlagNames are the names of the entry's flags, "SYN_SEEN|ESTABLISHED", or
// "none".
func (e Entry) FlagNames() string {
	f := e.Flags
	if f == 0 {
		return "none"
	}
	var names []string
	for i, name := range entryFlagNames {
		if f&(1<<i) != 0 {
			names = append(names, name)
			f &^= 1 << i
		}
	}
	if f != 0 {
		names = append(names, fmt.Sprintf("%#x", f))
	}
	return strings.Join(names, "|")
}

// ExpiresIn is how long the entry has left at now (a Now reading); negative
// when it has expired.
func (e Entry) ExpiresIn(now uint32) time.Duration {
	return time.Duration(int64(e.Lifetime)-int64(now)) * time.Second
}

// String reads "ESTABLISHED expires=1234567 endpoint=3 tx=3/180 rx=2/120
// flags=SYN_SEEN|ESTABLISHED|SEEN_REPLY": packets/bytes per direction.
// Times stay boot-time seconds: an entry knows no current time.
func (e Entry) String() string {
	return fmt.Sprintf("%s expires=%d endpoint=%d tx=%d/%d rx=%d/%d last-tx=%d last-rx=%d flags=%s",
		e.State(), e.Lifetime, e.EndpointID, e.PacketsTx, e.BytesTx, e.PacketsRx, e.BytesRx, e.LastTx, e.LastRx, e.FlagNames())
}
