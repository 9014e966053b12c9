package lbmap

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"
	"time"
)

// Proto is an IP protocol number, as the maps keep it.
type Proto uint8

const (
	TCP Proto = 6  // IPPROTO_TCP
	UDP Proto = 17 // IPPROTO_UDP
)

func (p Proto) String() string {
	switch p {
	case TCP:
		return "TCP"
	case UDP:
		return "UDP"
	}
	return fmt.Sprintf("proto-%d", uint8(p))
}

// ServiceFlags are the flags of a service's master entry (SVC_F_*).
type ServiceFlags uint8

const (
	// ServiceAffinity keeps a client (a network namespace) on one backend
	// for the master entry's affinity timeout.
	ServiceAffinity ServiceFlags = 1 << iota
	// ServiceMaglev picks backends from the service's Maglev table instead
	// of a random slot.
	ServiceMaglev
	// ServiceNodePortWildcard marks a NodePort at the wildcard address
	// (0.0.0.0, ::), which also answers on loopback.
	ServiceNodePortWildcard
	// ServiceLocal marks a frontend of traffic policy Local (its backends
	// are this node's only): a NodePort with none drops instead of
	// refusing.
	ServiceLocal
)

var serviceFlagNames = []string{"affinity", "maglev", "nodeport-wildcard", "local"}

func (f ServiceFlags) String() string {
	if f == 0 {
		return "none"
	}
	var names []string
	for i, name := range serviceFlagNames {
		if f&(1<<i) != 0 {
			names = append(names, name)
			f &^= 1 << i
		}
	}
	if f != 0 {
		names = append(names, fmt.Sprintf("%#x", uint8(f)))
	}
	return strings.Join(names, "|")
}

// BackendID names a backend: the key of the backend maps. 0 is no backend.
type BackendID uint32

// RevNATIndex is a frontend's ID: the key of the reverse NAT, affinity and
// Maglev maps. 0 is no frontend.
type RevNATIndex uint16

// Port is a port in network byte order.
type Port [2]byte

// NewPort stores the host-order port p in network byte order.
func NewPort(p uint16) Port {
	var n Port
	binary.BigEndian.PutUint16(n[:], p)
	return n
}

// Host is the port in host order.
func (p Port) Host() uint16 { return binary.BigEndian.Uint16(p[:]) }

func (p Port) String() string { return fmt.Sprint(p.Host()) }

// Addr4 is an IPv4 address in network byte order.
type Addr4 [4]byte

// NewAddr4 is addr, which must be IPv4 or IPv4-mapped IPv6.
func NewAddr4(addr netip.Addr) Addr4 {
	if !addr.Unmap().Is4() {
		panic(fmt.Sprintf("lbmap: %v is not an IPv4 address", addr))
	}
	return addr.Unmap().As4()
}

func (a Addr4) Addr() netip.Addr { return netip.AddrFrom4(a) }
func (a Addr4) String() string   { return a.Addr().String() }

// Addr6 is an IPv6 address in network byte order.
type Addr6 [16]byte

// NewAddr6 is addr, which must be IPv6 and not IPv4-mapped: an IPv4
// service or backend belongs in the IPv4 maps.
func NewAddr6(addr netip.Addr) Addr6 {
	if !addr.Is6() || addr.Is4In6() {
		panic(fmt.Sprintf("lbmap: %v is not an IPv6 address", addr))
	}
	return addr.As16()
}

func (a Addr6) Addr() netip.Addr { return netip.AddrFrom16(a) }
func (a Addr6) String() string   { return a.Addr().String() }

// Service4Key is struct lb4_key: a frontend and one of its slots. Slot 0 is
// the master entry; slots 1..count name backends.
type Service4Key struct {
	Address     Addr4
	DPort       Port
	BackendSlot uint16
	Proto       Proto
	// Scope is 0, the only scope the socket programs look up.
	Scope uint8
	_     [2]byte
}

// NewService4Key is the key of slot of the frontend addr:port/proto.
func NewService4Key(addr netip.Addr, port uint16, proto Proto, slot uint16) Service4Key {
	return Service4Key{Address: NewAddr4(addr), DPort: NewPort(port), Proto: proto, BackendSlot: slot}
}

// AddrPort is the frontend.
func (k Service4Key) AddrPort() netip.AddrPort {
	return netip.AddrPortFrom(k.Address.Addr(), k.DPort.Host())
}

func (k Service4Key) String() string {
	return serviceKeyString(k.AddrPort(), k.Proto, k.BackendSlot, k.Scope)
}

// Service6Key is struct lb6_key; see Service4Key.
type Service6Key struct {
	Address     Addr6
	DPort       Port
	BackendSlot uint16
	Proto       Proto
	Scope       uint8
	_           [2]byte
}

// NewService6Key is the key of slot of the frontend addr:port/proto.
func NewService6Key(addr netip.Addr, port uint16, proto Proto, slot uint16) Service6Key {
	return Service6Key{Address: NewAddr6(addr), DPort: NewPort(port), Proto: proto, BackendSlot: slot}
}

// AddrPort is the frontend.
func (k Service6Key) AddrPort() netip.AddrPort {
	return netip.AddrPortFrom(k.Address.Addr(), k.DPort.Host())
}

func (k Service6Key) String() string {
	return serviceKeyString(k.AddrPort(), k.Proto, k.BackendSlot, k.Scope)
}

func serviceKeyString(fe netip.AddrPort, proto Proto, slot uint16, scope uint8) string {
	s := fmt.Sprintf("%s/%s slot %d", fe, proto, slot)
	if scope != 0 {
		s += fmt.Sprintf(" scope %d", scope)
	}
	return s
}

// ServiceValue is struct lb4_service and struct lb6_service, which are the
// same: the value holds no address. What BackendID means depends on the
// slot of the key: see NewServiceMaster and NewServiceSlot.
type ServiceValue struct {
	// BackendID is the backend of a slot; in the master entry it is the
	// affinity timeout in seconds.
	BackendID BackendID
	// Count is, in the master entry, the number of slots.
	Count       uint16
	RevNATIndex RevNATIndex
	// Flags are the master entry's.
	Flags ServiceFlags
	_     [3]byte
}

// NewServiceMaster is the master entry (slot 0) of a frontend with count
// backend slots. With ServiceAffinity, affinityTimeout (whole seconds, at
// most 2^32-1) is how long a client stays on its backend since it last
// connected.
func NewServiceMaster(count uint16, revNAT RevNATIndex, flags ServiceFlags, affinityTimeout time.Duration) ServiceValue {
	secs := affinityTimeout / time.Second
	if secs > 1<<32-1 {
		secs = 1<<32 - 1
	}
	return ServiceValue{BackendID: BackendID(secs), Count: count, RevNATIndex: revNAT, Flags: flags}
}

// NewServiceSlot is the entry of a slot (1..count) that names backend.
func NewServiceSlot(backend BackendID, revNAT RevNATIndex) ServiceValue {
	return ServiceValue{BackendID: backend, RevNATIndex: revNAT}
}

// AffinityTimeout is the affinity timeout of a master entry.
func (v ServiceValue) AffinityTimeout() time.Duration {
	return time.Duration(v.BackendID) * time.Second
}

// String shows every field; which of them mean something depends on the
// slot, which is in the key.
func (v ServiceValue) String() string {
	return fmt.Sprintf("backend %d, count %d, revnat %d, flags %s", v.BackendID, v.Count, v.RevNATIndex, v.Flags)
}

// Backend4 is struct lb4_backend.
type Backend4 struct {
	Address Addr4
	Port    Port
	Proto   Proto
	// Flags are reserved for the backend's state; the socket programs
	// ignore them.
	Flags uint8
}

// NewBackend4 is the backend addr:port/proto.
func NewBackend4(addr netip.Addr, port uint16, proto Proto) Backend4 {
	return Backend4{Address: NewAddr4(addr), Port: NewPort(port), Proto: proto}
}

func (b Backend4) AddrPort() netip.AddrPort {
	return netip.AddrPortFrom(b.Address.Addr(), b.Port.Host())
}

func (b Backend4) String() string { return backendString(b.AddrPort(), b.Proto, b.Flags) }

// Backend6 is struct lb6_backend.
type Backend6 struct {
	Address Addr6
	Port    Port
	Proto   Proto
	Flags   uint8
	_       [4]byte
}

// NewBackend6 is the backend addr:port/proto.
func NewBackend6(addr netip.Addr, port uint16, proto Proto) Backend6 {
	return Backend6{Address: NewAddr6(addr), Port: NewPort(port), Proto: proto}
}

func (b Backend6) AddrPort() netip.AddrPort {
	return netip.AddrPortFrom(b.Address.Addr(), b.Port.Host())
}

func (b Backend6) String() string { return backendString(b.AddrPort(), b.Proto, b.Flags) }

func backendString(be netip.AddrPort, proto Proto, flags uint8) string {
	s := fmt.Sprintf("%s/%s", be, proto)
	if flags != 0 {
		s += fmt.Sprintf(" flags %#x", flags)
	}
	return s
}

// RevNAT4 is struct lb4_reverse_nat: the frontend of a RevNATIndex.
type RevNAT4 struct {
	Address Addr4
	Port    Port
	_       [2]byte
}

// NewRevNAT4 is the frontend addr:port.
func NewRevNAT4(addr netip.Addr, port uint16) RevNAT4 {
	return RevNAT4{Address: NewAddr4(addr), Port: NewPort(port)}
}

func (r RevNAT4) AddrPort() netip.AddrPort {
	return netip.AddrPortFrom(r.Address.Addr(), r.Port.Host())
}

func (r RevNAT4) String() string { return r.AddrPort().String() }

// RevNAT6 is struct lb6_reverse_nat.
type RevNAT6 struct {
	Address Addr6
	Port    Port
	_       [6]byte
}

// NewRevNAT6 is the frontend addr:port.
func NewRevNAT6(addr netip.Addr, port uint16) RevNAT6 {
	return RevNAT6{Address: NewAddr6(addr), Port: NewPort(port)}
}

func (r RevNAT6) AddrPort() netip.AddrPort {
	return netip.AddrPortFrom(r.Address.Addr(), r.Port.Host())
}

func (r RevNAT6) String() string { return r.AddrPort().String() }

// AffinityKey is struct lb_affinity_key: a client, which at socket level
// is a network namespace (its cookie), and a frontend.
type AffinityKey struct {
	NetNSCookie uint64
	RevNATIndex RevNATIndex
	_           [6]byte
}

func (k AffinityKey) String() string {
	return fmt.Sprintf("netns %d revnat %d", k.NetNSCookie, k.RevNATIndex)
}

// AffinityValue is struct lb_affinity_val.
type AffinityValue struct {
	BackendID BackendID
	// LastUsed is in seconds of CLOCK_BOOTTIME.
	LastUsed uint32
}

func (v AffinityValue) String() string {
	return fmt.Sprintf("backend %d, last used %ds after boot", v.BackendID, v.LastUsed)
}

// SockRevNAT4Key is struct lb4_sock_revnat_key: a socket (its cookie) and
// the backend it was sent to.
type SockRevNAT4Key struct {
	Cookie  uint64
	Address Addr4
	Port    Port
	_       [2]byte
}

// NewSockRevNAT4Key is the key of the socket cookie sent to backend be.
func NewSockRevNAT4Key(cookie uint64, be netip.AddrPort) SockRevNAT4Key {
	return SockRevNAT4Key{Cookie: cookie, Address: NewAddr4(be.Addr()), Port: NewPort(be.Port())}
}

func (k SockRevNAT4Key) AddrPort() netip.AddrPort {
	return netip.AddrPortFrom(k.Address.Addr(), k.Port.Host())
}

func (k SockRevNAT4Key) String() string {
	return fmt.Sprintf("socket %d backend %s", k.Cookie, k.AddrPort())
}

// SockRevNAT4Value is struct lb4_sock_revnat: the frontend the socket
// asked for.
type SockRevNAT4Value struct {
	Address     Addr4
	Port        Port
	RevNATIndex RevNATIndex
}

func (v SockRevNAT4Value) AddrPort() netip.AddrPort {
	return netip.AddrPortFrom(v.Address.Addr(), v.Port.Host())
}

func (v SockRevNAT4Value) String() string {
	return fmt.Sprintf("frontend %s revnat %d", v.AddrPort(), v.RevNATIndex)
}

// SockRevNAT6Key is struct lb6_sock_revnat_key.
type SockRevNAT6Key struct {
	Cookie  uint64
	Address Addr6
	Port    Port
	_       [6]byte
}

// NewSockRevNAT6Key is the key of the socket cookie sent to backend be.
func NewSockRevNAT6Key(cookie uint64, be netip.AddrPort) SockRevNAT6Key {
	return SockRevNAT6Key{Cookie: cookie, Address: NewAddr6(be.Addr()), Port: NewPort(be.Port())}
}

func (k SockRevNAT6Key) AddrPort() netip.AddrPort {
	return netip.AddrPortFrom(k.Address.Addr(), k.Port.Host())
}

func (k SockRevNAT6Key) String() string {
	return fmt.Sprintf("socket %d backend %s", k.Cookie, k.AddrPort())
}

// SockRevNAT6Value is struct lb6_sock_revnat.
type SockRevNAT6Value struct {
	Address     Addr6
	Port        Port
	RevNATIndex RevNATIndex
	_           [4]byte
}

func (v SockRevNAT6Value) AddrPort() netip.AddrPort {
	return netip.AddrPortFrom(v.Address.Addr(), v.Port.Host())
}

func (v SockRevNAT6Value) String() string {
	return fmt.Sprintf("frontend %s revnat %d", v.AddrPort(), v.RevNATIndex)
}
