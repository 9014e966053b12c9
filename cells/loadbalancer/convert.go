package loadbalancer

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
	"unique"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// defaultAffinityTimeout is Kubernetes' default for
// sessionAffinityConfig.clientIP.timeoutSeconds.
const defaultAffinityTimeout = 10800 * time.Second

// maxAffinityTimeout is the largest timeout the API server accepts.
const maxAffinityTimeout = 86400 * time.Second

// intern returns the canonical copy of s. Namespaces and node names repeat
// across thousands of rows; interned, they are stored once.
func intern(s string) string { return unique.Make(s).Value() }

// invalidField is an object field the conversion skipped.
type invalidField struct {
	field string
	err   error
}

func (f invalidField) Error() string { return f.field + ": " + f.err.Error() }

// convertService turns a Kubernetes Service into the compact row. Fields that
// are invalid are left out and reported; the rest of the service stands.
func convertService(k *corev1.Service) (*Service, []invalidField) {
	var bad []invalidField
	svc := &Service{
		Name: ServiceName{Namespace: intern(k.Namespace), Name: k.Name},
		Type: ServiceClusterIP, // what an empty spec.type means
	}
	if k.Spec.Type != "" {
		// An unknown type is load-balanced as a ClusterIP, as before
		// there were types, and reported.
		t, err := parseServiceType(string(k.Spec.Type))
		if err != nil {
			bad = append(bad, invalidField{"spec.type", err})
		} else {
			svc.Type = t
		}
	}
	if svc.Type == ServiceExternalName {
		// An alias in DNS: nothing to load-balance.
		return svc, nil
	}

	clusterIPs, field := k.Spec.ClusterIPs, "spec.clusterIPs"
	if len(clusterIPs) == 0 && k.Spec.ClusterIP != "" {
		clusterIPs, field = []string{k.Spec.ClusterIP}, "spec.clusterIP"
	}
	if len(clusterIPs) > 0 && clusterIPs[0] != corev1.ClusterIPNone {
		svc.ClusterIPs = parseAddrs(clusterIPs, field, &bad)
	}
	svc.ExternalIPs = parseAddrs(k.Spec.ExternalIPs, "spec.externalIPs", &bad)
	for i, ing := range k.Status.LoadBalancer.Ingress {
		// An ingress in Proxy mode is reached through the load balancer,
		// which must see the traffic: no shortcut on the node.
		if ing.IP == "" || (ing.IPMode != nil && *ing.IPMode == corev1.LoadBalancerIPModeProxy) {
			continue
		}
		if a, ok := parseAddr(ing.IP, "status.loadBalancer.ingress", i, ".ip", &bad); ok {
			svc.LoadBalancerIPs = append(svc.LoadBalancerIPs, a)
		}
	}

	for i, p := range k.Spec.Ports {
		port, ok := convertServicePort(p, i, &bad)
		if ok {
			svc.Ports = append(svc.Ports, port)
		}
	}

	if k.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
		svc.SessionAffinity = true
		svc.AffinityTimeout = defaultAffinityTimeout
		if cfg := k.Spec.SessionAffinityConfig; cfg != nil && cfg.ClientIP != nil && cfg.ClientIP.TimeoutSeconds != nil {
			t := time.Duration(*cfg.ClientIP.TimeoutSeconds) * time.Second
			if t <= 0 || t > maxAffinityTimeout {
				bad = append(bad, invalidField{"spec.sessionAffinityConfig.clientIP.timeoutSeconds",
					fmt.Errorf("%d out of range: want 1 to %d, using the default %d",
						*cfg.ClientIP.TimeoutSeconds, int(maxAffinityTimeout.Seconds()), int(defaultAffinityTimeout.Seconds()))})
			} else {
				svc.AffinityTimeout = t
			}
		}
	}
	svc.ExtTrafficPolicyLocal = k.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
	svc.IntTrafficPolicyLocal = k.Spec.InternalTrafficPolicy != nil && *k.Spec.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal
	if hc := k.Spec.HealthCheckNodePort; hc < 0 || hc > 65535 {
		bad = append(bad, invalidField{"spec.healthCheckNodePort",
			fmt.Errorf("%d out of range: want 1 to 65535 (or 0: none), serving no health check", hc)})
	} else {
		svc.HealthCheckNodePort = uint16(hc)
	}
	return svc, bad
}

func convertServicePort(p corev1.ServicePort, i int, bad *[]invalidField) (ServicePort, bool) {
	field := func(f string) string { return indexed("spec.ports", i, f) }
	proto := TCP
	if p.Protocol != "" {
		var err error
		if proto, err = parseL4Proto(string(p.Protocol)); err != nil {
			*bad = append(*bad, invalidField{field(".protocol"), err})
			return ServicePort{}, false
		}
	}
	if p.Port < 1 || p.Port > 65535 {
		*bad = append(*bad, invalidField{field(".port"), fmt.Errorf("%d out of range: want 1 to 65535", p.Port)})
		return ServicePort{}, false
	}
	if p.NodePort < 0 || p.NodePort > 65535 {
		*bad = append(*bad, invalidField{field(".nodePort"), fmt.Errorf("%d out of range: want 0 (none) to 65535", p.NodePort)})
		return ServicePort{}, false
	}
	return ServicePort{Name: p.Name, Port: uint16(p.Port), NodePort: uint16(p.NodePort), Protocol: proto}, true
}

func parseAddrs(ss []string, field string, bad *[]invalidField) []netip.Addr {
	if len(ss) == 0 {
		return nil
	}
	addrs := make([]netip.Addr, 0, len(ss))
	for i, s := range ss {
		if a, ok := parseAddr(s, field, i, "", bad); ok {
			addrs = append(addrs, a)
		}
	}
	return addrs
}

// parseAddr parses s, the address at field[i]suffix.
func parseAddr(s, field string, i int, suffix string, bad *[]invalidField) (netip.Addr, bool) {
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		*bad = append(*bad, invalidField{indexed(field, i, suffix), fmt.Errorf("invalid IP address %q: want an IPv4 or IPv6 address such as 10.96.0.10 or fd00::10", s)})
		return netip.Addr{}, false
	}
	return a.Unmap(), true
}

// indexed is field[i]suffix, an invalid field's name: made only for an
// invalid field (one per object and port was 6 MB and ~50 ms of a
// 50,000-Service restart).
func indexed(field string, i int, suffix string) string {
	return field + "[" + strconv.Itoa(i) + "]" + suffix
}

// sliceID names an EndpointSlice.
type sliceID struct {
	Namespace, Name string
}

func (id sliceID) String() string { return id.Namespace + "/" + id.Name }

// compare orders slices by namespace, then name.
func (id sliceID) compare(o sliceID) int {
	return cmp.Or(strings.Compare(id.Namespace, o.Namespace), strings.Compare(id.Name, o.Name))
}

// endpointSlice is the part of an EndpointSlice the load balancer uses. It
// lives only until the slice's backends are written.
type endpointSlice struct {
	id sliceID
	// service is from the kubernetes.io/service-name label; a slice without
	// it belongs to no service and adds no backends.
	service ServiceName
	// backends are sorted by address and port name, each pair once: the
	// backends row as it is written.
	backends []Backend
}

// convertEndpointSlice keeps the usable endpoints of a slice: ready ones
// (active) and serving terminating ones (terminating), each with every port
// of the slice.
func convertEndpointSlice(k *discoveryv1.EndpointSlice) (*endpointSlice, []invalidField) {
	s := &endpointSlice{id: sliceID{Namespace: intern(k.Namespace), Name: k.Name}}
	name := k.Labels[discoveryv1.LabelServiceName]
	if name == "" {
		return s, nil
	}
	if strings.HasPrefix(k.Name, name) {
		// The EndpointSlice controller names a slice after its service:
		// the rows then keep the slice name's bytes, which the embedded
		// server's key holds too, instead of a copy of the label per
		// slice.
		name = k.Name[:len(name)]
	}
	s.service = ServiceName{Namespace: s.id.Namespace, Name: name}

	var want6 bool
	switch k.AddressType {
	case discoveryv1.AddressTypeIPv4:
	case discoveryv1.AddressTypeIPv6:
		want6 = true
	default:
		// FQDN endpoints name hosts, not addresses: nothing to program.
		return s, nil
	}

	var bad []invalidField
	type port struct {
		name  string
		port  uint16
		proto L4Proto
	}
	ports := make([]port, 0, len(k.Ports))
	for i, p := range k.Ports {
		field := func(f string) string { return indexed("ports", i, f) }
		if p.Port == nil {
			// A nil port means "all ports", which a frontend with a fixed
			// port cannot express.
			continue
		}
		if *p.Port < 1 || *p.Port > 65535 {
			bad = append(bad, invalidField{field(".port"), fmt.Errorf("%d out of range: want 1 to 65535", *p.Port)})
			continue
		}
		proto := TCP
		if p.Protocol != nil {
			var err error
			if proto, err = parseL4Proto(string(*p.Protocol)); err != nil {
				bad = append(bad, invalidField{field(".protocol"), err})
				continue
			}
		}
		var name string
		if p.Name != nil {
			name = *p.Name
		}
		ports = append(ports, port{name, uint16(*p.Port), proto})
	}

	for i, ep := range k.Endpoints {
		state, usable := endpointState(ep.Conditions)
		if !usable || len(ep.Addresses) == 0 {
			continue
		}
		// Every address of an endpoint is the same endpoint; Kubernetes
		// lets consumers use the first.
		addr, err := netip.ParseAddr(ep.Addresses[0])
		if err == nil {
			addr = addr.Unmap()
		}
		if err != nil || addr.Is6() != want6 || addr.Zone() != "" {
			bad = append(bad, invalidField{indexed("endpoints", i, ".addresses[0]"), fmt.Errorf("invalid %s address %q", k.AddressType, ep.Addresses[0])})
			continue
		}
		var node string
		if ep.NodeName != nil {
			node = intern(*ep.NodeName)
		}
		for _, p := range ports {
			s.backends = append(s.backends, Backend{
				Address:  L3n4Addr{Addr: addr, Port: p.port, Protocol: p.proto},
				PortName: p.name,
				State:    state,
				NodeName: node,
			})
		}
	}
	// A slice that lists an address twice for a port counts it once,
	// preferring the active listing (BackendActive sorts first).
	slices.SortFunc(s.backends, func(a, b Backend) int {
		if c := a.Address.Compare(b.Address); c != 0 {
			return c
		}
		if c := strings.Compare(a.PortName, b.PortName); c != 0 {
			return c
		}
		return int(a.State) - int(b.State)
	})
	s.backends = slices.Clip(slices.CompactFunc(s.backends, func(a, b Backend) bool {
		return a.Address == b.Address && a.PortName == b.PortName
	}))
	return s, bad
}

// endpointState maps an endpoint's conditions (nil ready and serving mean
// true, nil terminating means false) to a backend state.
func endpointState(c discoveryv1.EndpointConditions) (BackendState, bool) {
	ready := c.Ready == nil || *c.Ready
	serving := c.Serving == nil || *c.Serving
	terminating := c.Terminating != nil && *c.Terminating
	switch {
	case ready:
		return BackendActive, true
	case serving && terminating:
		return BackendTerminating, true
	}
	return 0, false
}
