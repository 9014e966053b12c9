package loadbalancer

import (
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

var l4ProtoNames = [...]string{SCTP: "SCTP", TCP: "TCP", UDP: "UDP"}

// String is the protocol as Kubernetes spells it: TCP, UDP or SCTP.
func (p L4Proto) String() string {
	if int(p) < len(l4ProtoNames) && l4ProtoNames[p] != "" {
		return l4ProtoNames[p]
	}
	return "L4Proto(" + strconv.Itoa(int(p)) + ")"
}

func (p L4Proto) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

func (p *L4Proto) UnmarshalText(b []byte) (err error) {
	*p, err = parseL4Proto(string(b))
	return err
}

func parseL4Proto(s string) (L4Proto, error) {
	for p, name := range l4ProtoNames {
		if name != "" && name == s {
			return L4Proto(p), nil
		}
	}
	return 0, fmt.Errorf("invalid protocol %q: want TCP, UDP or SCTP", s)
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

var frontendTypeNames = [...]string{
	FrontendClusterIP: "ClusterIP", FrontendNodePort: "NodePort",
	FrontendExternalIP: "ExternalIP", FrontendLoadBalancer: "LoadBalancer",
}

func (t FrontendType) String() string {
	if int(t) < len(frontendTypeNames) && frontendTypeNames[t] != "" {
		return frontendTypeNames[t]
	}
	return "FrontendType(" + strconv.Itoa(int(t)) + ")"
}

func (t FrontendType) MarshalText() ([]byte, error) { return []byte(t.String()), nil }

func (t *FrontendType) UnmarshalText(b []byte) error {
	for v, name := range frontendTypeNames {
		if name != "" && name == string(b) {
			*t = FrontendType(v)
			return nil
		}
	}
	return fmt.Errorf("invalid frontend type %q: want ClusterIP, NodePort, ExternalIP or LoadBalancer", b)
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

var serviceTypeNames = [...]string{
	ServiceClusterIP: "ClusterIP", ServiceNodePort: "NodePort",
	ServiceLoadBalancer: "LoadBalancer", ServiceExternalName: "ExternalName",
}

func (t ServiceType) String() string {
	if int(t) < len(serviceTypeNames) && serviceTypeNames[t] != "" {
		return serviceTypeNames[t]
	}
	return "ServiceType(" + strconv.Itoa(int(t)) + ")"
}

func (t ServiceType) MarshalText() ([]byte, error) { return []byte(t.String()), nil }

func (t *ServiceType) UnmarshalText(b []byte) (err error) {
	*t, err = parseServiceType(string(b))
	return err
}

// parseServiceType is the type named s, as spec.type spells it.
func parseServiceType(s string) (ServiceType, error) {
	for v, name := range serviceTypeNames {
		if name != "" && name == s {
			return ServiceType(v), nil
		}
	}
	return 0, fmt.Errorf("invalid service type %q: want ClusterIP, NodePort, LoadBalancer or ExternalName", s)
}

// BackendState says whether a backend may take connections.
type BackendState string

const (
	// BackendActive is a ready endpoint.
	BackendActive BackendState = "active"
	// BackendTerminating is an endpoint that is shutting down but still
	// serving; frontends use it only when no active one is left.
	BackendTerminating BackendState = "terminating"
	// BackendQuarantined is a backend a health checker took out of service;
	// frontends never use it.
	BackendQuarantined BackendState = "quarantined"
)
