// Package addrmap is a map by layer-4 address (an IP address, a port and
// a protocol number) for state kept per Service frontend or backend, tens
// of thousands of entries: an IPv4 key takes 8 bytes instead of 20, so a
// map slot with a pointer value is 16 bytes instead of 32.
package addrmap

import (
	"iter"
	"net/netip"
)

// Key is a layer-4 address: 20 bytes and no pointers, where a netip.Addr
// alone is 24 bytes holding one.
type Key struct {
	Addr  [16]byte
	Port  uint16
	Proto uint8
	Is4   bool
}

// KeyOf is the key of an address, port and protocol number. An
// IPv4-mapped IPv6 address is its IPv4 address.
func KeyOf(a netip.Addr, port uint16, proto uint8) Key {
	a = a.Unmap()
	return Key{Addr: a.As16(), Port: port, Proto: proto, Is4: a.Is4()}
}

// IP is the key's address.
func (k Key) IP() netip.Addr {
	a := netip.AddrFrom16(k.Addr)
	if k.Is4 {
		return a.Unmap()
	}
	return a
}

// key4 is a Key of an IPv4 address.
type key4 struct {
	addr  [4]byte
	port  uint16
	proto uint8
}

func (k Key) v4() key4 { return key4{addr: [4]byte(k.Addr[12:]), port: k.Port, proto: k.Proto} }

func (k key4) key() Key {
	return Key{Addr: netip.AddrFrom4(k.addr).As16(), Port: k.port, Proto: k.proto, Is4: true}
}

// Map is a map by Key. Its zero value is not usable: see New.
type Map[V any] struct {
	v4 map[key4]V
	v6 map[Key]V
}

func New[V any]() Map[V] {
	return Map[V]{v4: map[key4]V{}, v6: map[Key]V{}}
}

func (m Map[V]) Get(k Key) (V, bool) {
	if k.Is4 {
		v, ok := m.v4[k.v4()]
		return v, ok
	}
	v, ok := m.v6[k]
	return v, ok
}

func (m Map[V]) Set(k Key, v V) {
	if k.Is4 {
		m.v4[k.v4()] = v
	} else {
		m.v6[k] = v
	}
}

func (m Map[V]) Delete(k Key) {
	if k.Is4 {
		delete(m.v4, k.v4())
	} else {
		delete(m.v6, k)
	}
}

// Len is the number of entries.
func (m Map[V]) Len() int { return len(m.v4) + len(m.v6) }

// All is every entry, the IPv4 ones first, each part in no order. The
// caller may delete as it goes.
func (m Map[V]) All() iter.Seq2[Key, V] {
	return func(yield func(Key, V) bool) {
		for k, v := range m.v4 {
			if !yield(k.key(), v) {
				return
			}
		}
		for k, v := range m.v6 {
			if !yield(k, v) {
				return
			}
		}
	}
}
