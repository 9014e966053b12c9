package nodeportmap

import (
	"fmt"
	"net/netip"

	"github.com/cellium/cellium/pkg/lbmap"
)

// FlagDSR is NODEPORT_NAT_F_DSR, of an in entry: the backend is on
// another node, which answers the client directly (--lb-mode=dsr). Such a
// connection has no out entry.
const FlagDSR = 2

// NewDSR4 is the in entry of a connection sent to the remote backend to
// with DSR.
func NewDSR4(to netip.AddrPort, rev lbmap.RevNATIndex) NAT4 {
	v := NewNAT4(to, rev)
	v.Flags = FlagDSR
	return v
}

// DSRMapName is the map of the backend's node that the endpoint programs
// (bpf/lxc.c) keep DSR connections in: struct lb4_dsr_key -> struct
// lb4_dsr of bpf/include/dsr.h.
const DSRMapName = "cellium_lb4_dsr"

// DSRKey4 is struct lb4_dsr_key: a DSR connection as the backend pod sees
// it.
type DSRKey4 struct {
	PodAddr    lbmap.Addr4
	ClientAddr lbmap.Addr4
	PodPort    lbmap.Port
	ClientPort lbmap.Port
	Proto      lbmap.Proto
	_          [3]byte
}

// NewDSRKey4 is the key of the connection between pod and client.
func NewDSRKey4(proto lbmap.Proto, pod, client netip.AddrPort) DSRKey4 {
	return DSRKey4{
		PodAddr: lbmap.NewAddr4(pod.Addr()), ClientAddr: lbmap.NewAddr4(client.Addr()),
		PodPort: lbmap.NewPort(pod.Port()), ClientPort: lbmap.NewPort(client.Port()),
		Proto: proto,
	}
}

func (k DSRKey4) String() string {
	return fmt.Sprintf("pod %s:%s client %s:%s/%s", k.PodAddr, k.PodPort, k.ClientAddr, k.ClientPort, k.Proto)
}

// DSR4 is struct lb4_dsr: the frontend the pod's replies leave from.
type DSR4 struct {
	Address lbmap.Addr4
	Port    lbmap.Port
	_       uint16
}

// NewDSR4Frontend is the value for frontend fe.
func NewDSR4Frontend(fe netip.AddrPort) DSR4 {
	return DSR4{Address: lbmap.NewAddr4(fe.Addr()), Port: lbmap.NewPort(fe.Port())}
}

func (v DSR4) String() string { return fmt.Sprintf("frontend %s:%s", v.Address, v.Port) }
