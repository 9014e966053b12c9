package loadbalancer

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/cilium/statedb/index"
)

// ServiceName names a Kubernetes Service.
type ServiceName struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

// String is "namespace/name".
func (n ServiceName) String() string { return n.Namespace + "/" + n.Name }

// ParseServiceName parses "namespace/name".
func ParseServiceName(s string) (ServiceName, error) {
	ns, name, ok := strings.Cut(s, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return ServiceName{}, fmt.Errorf("invalid service name %q: want NAMESPACE/NAME, e.g. kube-system/kube-dns", s)
	}
	return ServiceName{Namespace: ns, Name: name}, nil
}

func (n ServiceName) MarshalText() ([]byte, error) { return []byte(n.String()), nil }

func (n *ServiceName) UnmarshalText(b []byte) (err error) {
	*n, err = ParseServiceName(string(b))
	return err
}

// key is the index key: "/" cannot occur in either part, so the key is
// unambiguous.
func (n ServiceName) key() index.Key { return index.String(n.String()) }

// compare orders services by namespace, then name.
func (n ServiceName) compare(o ServiceName) int {
	return cmp.Or(strings.Compare(n.Namespace, o.Namespace), strings.Compare(n.Name, o.Name))
}

// L4Proto is a transport protocol. It is a byte, not the string Kubernetes
// spells it as: it is in every frontend and backend address, and the
// tables hold 100,000s of them. In text and JSON it is Kubernetes' name.
type L4Proto uint8

// The values sort as the names do.
const (
	SCTP L4Proto = iota + 1
	TCP
	UDP
)

var l4Protos = byteEnum[L4Proto]{
	typeName: "L4Proto", what: "protocol", want: "TCP, UDP or SCTP",
	names: []string{SCTP: "SCTP", TCP: "TCP", UDP: "UDP"},
}

// String is the protocol as Kubernetes spells it: TCP, UDP or SCTP.
func (p L4Proto) String() string { return l4Protos.name(p) }

func (p L4Proto) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

func (p *L4Proto) UnmarshalText(b []byte) (err error) {
	*p, err = parseL4Proto(string(b))
	return err
}

func parseL4Proto(s string) (L4Proto, error) { return l4Protos.parse(s) }

// byteEnum names the values of an enumeration kept as a byte in the rows
// (which the tables hold by the 100,000) and named in text and JSON.
type byteEnum[T ~uint8] struct {
	// typeName names a value without a name: "L4Proto(9)".
	typeName string
	// what and want make the error for a name that is none: "invalid
	// protocol "ICMP": want TCP, UDP or SCTP".
	what, want string
	// names are by value, "" for none.
	names []string
}

func (e byteEnum[T]) name(v T) string {
	if int(v) < len(e.names) && e.names[v] != "" {
		return e.names[v]
	}
	return e.typeName + "(" + strconv.Itoa(int(v)) + ")"
}

func (e byteEnum[T]) parse(s string) (T, error) {
	for v, name := range e.names {
		if name != "" && name == s {
			return T(v), nil
		}
	}
	return 0, fmt.Errorf("invalid %s %q: want %s", e.what, s, e.want)
}

// L3n4Addr is an address, port and protocol: a frontend or a backend.
// It is comparable and usable as a map key. Addresses are never
// IPv4-mapped IPv6: conversion unmaps them.
type L3n4Addr struct {
	Addr     netip.Addr `json:"addr"`
	Port     uint16     `json:"port"`
	Protocol L4Proto    `json:"protocol"`
}

// String is "10.96.0.10:80/TCP" or "[fd00::1]:80/TCP".
func (a L3n4Addr) String() string {
	return netip.AddrPortFrom(a.Addr, a.Port).String() + "/" + a.Protocol.String()
}

// ParseL3n4Addr parses the form String returns.
func ParseL3n4Addr(s string) (L3n4Addr, error) {
	addrPort, proto, ok := strings.Cut(s, "/")
	if !ok {
		return L3n4Addr{}, fmt.Errorf("invalid address %q: want ADDR:PORT/PROTOCOL, e.g. 10.96.0.10:80/TCP or [fd00::1]:80/TCP", s)
	}
	ap, err := netip.ParseAddrPort(addrPort)
	if err != nil {
		return L3n4Addr{}, fmt.Errorf("invalid address %q: want ADDR:PORT/PROTOCOL, e.g. 10.96.0.10:80/TCP or [fd00::1]:80/TCP", s)
	}
	p, err := parseL4Proto(proto)
	if err != nil {
		return L3n4Addr{}, fmt.Errorf("invalid address %q: %w", s, err)
	}
	return L3n4Addr{Addr: ap.Addr().Unmap(), Port: ap.Port(), Protocol: p}, nil
}

func (a L3n4Addr) MarshalText() ([]byte, error) { return []byte(a.String()), nil }

func (a *L3n4Addr) UnmarshalText(b []byte) (err error) {
	*a, err = ParseL3n4Addr(string(b))
	return err
}

// Compare orders addresses by family, address, port and protocol.
func (a L3n4Addr) Compare(b L3n4Addr) int {
	if c := a.Addr.Compare(b.Addr); c != 0 {
		return c
	}
	if a.Port != b.Port {
		return int(a.Port) - int(b.Port)
	}
	return int(a.Protocol) - int(b.Protocol)
}

// key is the index key: family, address bytes, port (big endian, so keys
// sort like addresses) and protocol.
func (a L3n4Addr) key() index.Key {
	raw := a.Addr.AsSlice()
	proto := a.Protocol.String()
	k := make([]byte, 0, 1+len(raw)+2+len(proto))
	family := byte(4)
	if a.Addr.Is6() {
		family = 6
	}
	k = append(k, family)
	k = append(k, raw...)
	k = binary.BigEndian.AppendUint16(k, a.Port)
	return append(k, proto...)
}

// FrontendType says where a frontend comes from in the Service. Like
// L4Proto it is a byte in memory and its name in text and JSON.
type FrontendType uint8

const (
	// FrontendClusterIP is one of spec.clusterIPs.
	FrontendClusterIP FrontendType = iota + 1
	// FrontendNodePort is a node address (or the wildcard) with a nodePort.
	FrontendNodePort
	// FrontendExternalIP is one of spec.externalIPs.
	FrontendExternalIP
	// FrontendLoadBalancer is one of status.loadBalancer.ingress[].ip.
	FrontendLoadBalancer
)

var frontendTypes = byteEnum[FrontendType]{
	typeName: "FrontendType", what: "frontend type", want: "ClusterIP, NodePort, ExternalIP or LoadBalancer",
	names: []string{
		FrontendClusterIP: "ClusterIP", FrontendNodePort: "NodePort",
		FrontendExternalIP: "ExternalIP", FrontendLoadBalancer: "LoadBalancer",
	},
}

func (t FrontendType) String() string { return frontendTypes.name(t) }

func (t FrontendType) MarshalText() ([]byte, error) { return []byte(t.String()), nil }

func (t *FrontendType) UnmarshalText(b []byte) (err error) {
	*t, err = frontendTypes.parse(string(b))
	return err
}

// ServiceType is spec.type of a Service. Like FrontendType it is a byte in
// memory and its name in text and JSON.
type ServiceType uint8

const (
	ServiceClusterIP ServiceType = iota + 1
	ServiceNodePort
	ServiceLoadBalancer
	ServiceExternalName
)

var serviceTypes = byteEnum[ServiceType]{
	typeName: "ServiceType", what: "service type", want: "ClusterIP, NodePort, LoadBalancer or ExternalName",
	names: []string{
		ServiceClusterIP: "ClusterIP", ServiceNodePort: "NodePort",
		ServiceLoadBalancer: "LoadBalancer", ServiceExternalName: "ExternalName",
	},
}

func (t ServiceType) String() string { return serviceTypes.name(t) }

func (t ServiceType) MarshalText() ([]byte, error) { return []byte(t.String()), nil }

func (t *ServiceType) UnmarshalText(b []byte) (err error) {
	*t, err = parseServiceType(string(b))
	return err
}

// parseServiceType is the type named s, as spec.type spells it.
func parseServiceType(s string) (ServiceType, error) { return serviceTypes.parse(s) }

// BackendState says whether a backend may take connections. It is a
// byte, named in text and JSON.
type BackendState uint8

const (
	// BackendActive is a ready endpoint.
	BackendActive BackendState = iota + 1
	// BackendTerminating is an endpoint that is shutting down but still
	// serving; frontends use it only when no active one is left.
	BackendTerminating
	// BackendQuarantined is a backend a health checker took out of service;
	// frontends never use it.
	BackendQuarantined
)

var backendStates = byteEnum[BackendState]{
	typeName: "BackendState", what: "backend state", want: "active, terminating or quarantined",
	names: []string{BackendActive: "active", BackendTerminating: "terminating", BackendQuarantined: "quarantined"},
}

func (s BackendState) String() string { return backendStates.name(s) }

func (s BackendState) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

func (s *BackendState) UnmarshalText(b []byte) (err error) {
	*s, err = backendStates.parse(string(b))
	return err
}
