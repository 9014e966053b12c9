// Package nodeportmap mirrors the NAT map of the NodePort programs on the
// node's devices (bpf/nodeport.c), struct nodeport4_nat_key and struct
// nodeport4_nat, and the DSR map of the endpoint programs (bpf/lxc.c,
// bpf/include/dsr.h), struct lb4_dsr_key and struct lb4_dsr, whose
// layouts the datapath's tests compare with the BTF of the C structs.
package nodeportmap

import (
	"fmt"
	"net/netip"

	"github.com/cellium/cellium/pkg/lbmap"
)

// MapName is the NAT map's name: its pin, and its name in the program.
const MapName = "cellium_nodeport4_nat"

// Dir is struct nodeport4_nat_key.dir.
type Dir uint8

const (
	// DirIn keys the client's tuple (client -> frontend): the value is
	// the backend.
	DirIn Dir = 0
	// DirOut keys the reply's tuple (backend -> client): the value is the
	// frontend.
	DirOut Dir = 1
)

func (d Dir) String() string {
	switch d {
	case DirIn:
		return "in"
	case DirOut:
		return "out"
	}
	return fmt.Sprintf("dir(%d)", uint8(d))
}

// Key4 is struct nodeport4_nat_key: a packet's tuple and direction.
type Key4 struct {
	SrcAddr lbmap.Addr4
	DstAddr lbmap.Addr4
	SrcPort lbmap.Port
	DstPort lbmap.Port
	Proto   lbmap.Proto
	Dir     Dir
	_       [2]byte
}

// NewKey4 is the key of the tuple src -> dst.
func NewKey4(proto lbmap.Proto, src, dst netip.AddrPort, dir Dir) Key4 {
	return Key4{
		SrcAddr: lbmap.NewAddr4(src.Addr()), DstAddr: lbmap.NewAddr4(dst.Addr()),
		SrcPort: lbmap.NewPort(src.Port()), DstPort: lbmap.NewPort(dst.Port()),
		Proto: proto, Dir: dir,
	}
}

func (k Key4) String() string {
	return fmt.Sprintf("%s %s:%s -> %s:%s/%s", k.Dir, k.SrcAddr, k.SrcPort, k.DstAddr, k.DstPort, k.Proto)
}

// NAT4 is struct nodeport4_nat: the address a packet of the key's tuple
// is translated to, and the frontend's reverse NAT index. With FlagSNAT
// (a backend on another node), the SNAT address is, in, the node address
// and port the packet is sent from and, out, the client's.
type NAT4 struct {
	Address     lbmap.Addr4
	Port        lbmap.Port
	RevNATIndex lbmap.RevNATIndex
	SNATAddress lbmap.Addr4
	SNATPort    lbmap.Port
	Flags       uint8
	_           uint8
	// Lifetime is when the connection's entries expire, in seconds of
	// CLOCK_BOOTTIME (ctmap.Now): the conntrack maps' clock and lifetimes
	// (--conntrack-lifetime-*). Both entries of a connection carry the
	// same Lifetime and State.
	Lifetime uint32
	// State is what passed of the connection: State* bits.
	State uint32
}

// Expired says whether v's connection outlived its lifetime at now
// (ctmap.Now()).
func (v NAT4) Expired(now uint32) bool { return v.Lifetime < now }

// Bits of NAT4.State: NODEPORT_NAT_S_* of bpf/include/nodeport_nat.h.
const (
	// StateReply: the backend answered (or, for TCP, the client ACKed
	// the handshake).
	StateReply = 1 << 0
	// StateInFIN: the client sent a FIN.
	StateInFIN = 1 << 1
	// StateOutFIN: the backend sent a FIN.
	StateOutFIN = 1 << 2
	// StateRST: either side sent a RST.
	StateRST = 1 << 3
)

// PairKey is the key of the other entry of the connection whose entry
// under k is v: the reply's for a DirIn entry, the client's for a DirOut
// one.
func PairKey(k Key4, v NAT4) Key4 {
	snat := v.Flags&FlagSNAT != 0
	p := Key4{Proto: k.Proto}
	if k.Dir == DirIn {
		p.Dir, p.SrcAddr, p.SrcPort = DirOut, v.Address, v.Port
		p.DstAddr, p.DstPort = k.SrcAddr, k.SrcPort
		if snat {
			p.DstAddr, p.DstPort = v.SNATAddress, v.SNATPort
		}
		return p
	}
	p.Dir, p.DstAddr, p.DstPort = DirIn, v.Address, v.Port
	p.SrcAddr, p.SrcPort = k.DstAddr, k.DstPort
	if snat {
		p.SrcAddr, p.SrcPort = v.SNATAddress, v.SNATPort
	}
	return p
}

// FlagSNAT is NODEPORT_NAT_F_SNAT: the source is translated too.
const FlagSNAT = 1

// NewNAT4 is the translation to to, for the frontend rev.
func NewNAT4(to netip.AddrPort, rev lbmap.RevNATIndex) NAT4 {
	return NAT4{Address: lbmap.NewAddr4(to.Addr()), Port: lbmap.NewPort(to.Port()), RevNATIndex: rev}
}

// NewSNAT4 is the translation to to, from (or back to) snat.
func NewSNAT4(to netip.AddrPort, rev lbmap.RevNATIndex, snat netip.AddrPort) NAT4 {
	v := NewNAT4(to, rev)
	v.SNATAddress, v.SNATPort, v.Flags = lbmap.NewAddr4(snat.Addr()), lbmap.NewPort(snat.Port()), FlagSNAT
	return v
}

func (v NAT4) String() string {
	s := fmt.Sprintf("%s:%s (frontend %d)", v.Address, v.Port, v.RevNATIndex)
	if v.Flags&FlagSNAT != 0 {
		s += fmt.Sprintf(" snat %s:%s", v.SNATAddress, v.SNATPort)
	}
	if v.Flags&FlagDSR != 0 {
		s += " dsr"
	}
	if v.Lifetime != 0 || v.State != 0 {
		s += fmt.Sprintf(" lifetime %d state %#x", v.Lifetime, v.State)
	}
	return s
}

// DevicesMapName is the map of the selected devices' IPv4 node addresses,
// which a connection to a remote backend is sent from.
const DevicesMapName = "cellium_nodeport4_devices"

// Device4 is struct nodeport4_device.
type Device4 struct {
	Address lbmap.Addr4
}
