package loadbalancer

import (
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestConvertServiceInvalidFields(t *testing.T) {
	tooLong, zero := int32(100000), int32(0)
	k := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "odd"},
		Spec: corev1.ServiceSpec{
			ClusterIPs:      []string{"10.96.0.7", "fe80::1%eth0"},
			ExternalIPs:     []string{"not-an-ip"},
			SessionAffinity: corev1.ServiceAffinityClientIP,
			SessionAffinityConfig: &corev1.SessionAffinityConfig{
				ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &tooLong},
			},
			Ports: []corev1.ServicePort{
				{Name: "icmp", Port: 1, Protocol: "ICMP"},
				{Name: "np", Port: 80, NodePort: 70000},
				{Name: "ok", Port: 81},
			},
		},
	}
	svc, bad := convertService(k)
	want := &Service{
		Name:            ServiceName{"default", "odd"},
		Type:            ServiceClusterIP,
		ClusterIPs:      []netip.Addr{netip.MustParseAddr("10.96.0.7")},
		ExternalIPs:     []netip.Addr{},
		Ports:           []ServicePort{{Name: "ok", Port: 81, Protocol: TCP}},
		SessionAffinity: true,
		AffinityTimeout: defaultAffinityTimeout,
	}
	if !reflect.DeepEqual(svc, want) {
		t.Errorf("convertService =\n%+v\nwant\n%+v", svc, want)
	}
	var fields []string
	for _, f := range bad {
		fields = append(fields, f.field)
	}
	wantFields := []string{"spec.clusterIPs[1]", "spec.externalIPs[0]", "spec.ports[0].protocol", "spec.ports[1].nodePort",
		"spec.sessionAffinityConfig.clientIP.timeoutSeconds"}
	if !reflect.DeepEqual(fields, wantFields) {
		t.Errorf("invalid fields = %v, want %v", fields, wantFields)
	}

	k.Spec.SessionAffinityConfig.ClientIP.TimeoutSeconds = &zero
	if _, bad := convertService(k); !strings.Contains(bad[len(bad)-1].Error(), "0 out of range: want 1 to 86400") {
		t.Errorf("timeoutSeconds 0: %v", bad)
	}
	sixty := int32(60)
	k.Spec.SessionAffinityConfig.ClientIP.TimeoutSeconds = &sixty
	if svc, _ := convertService(k); svc.AffinityTimeout != time.Minute {
		t.Errorf("timeoutSeconds 60: affinity timeout %s", svc.AffinityTimeout)
	}
}

// TestConvertServiceType: spec.type is kept by name, empty is ClusterIP,
// and an unknown type is reported and load-balanced as a ClusterIP; its
// text form is the name.
func TestConvertServiceType(t *testing.T) {
	for _, c := range []struct {
		spec corev1.ServiceType
		want ServiceType
		bad  string
	}{
		{"", ServiceClusterIP, ""},
		{corev1.ServiceTypeClusterIP, ServiceClusterIP, ""},
		{corev1.ServiceTypeNodePort, ServiceNodePort, ""},
		{corev1.ServiceTypeLoadBalancer, ServiceLoadBalancer, ""},
		{corev1.ServiceTypeExternalName, ServiceExternalName, ""},
		{"Gateway", ServiceClusterIP, `spec.type: invalid service type "Gateway": want ClusterIP, NodePort, LoadBalancer or ExternalName`},
	} {
		k := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web"},
			Spec:       corev1.ServiceSpec{Type: c.spec, ClusterIP: "10.96.0.20", Ports: []corev1.ServicePort{{Port: 80}}},
		}
		svc, bad := convertService(k)
		var got string
		if len(bad) > 0 {
			got = bad[0].Error()
		}
		if svc.Type != c.want || got != c.bad || len(bad) > 1 {
			t.Errorf("spec.type %q: %s, invalid %v; want %s, %q", c.spec, svc.Type, bad, c.want, c.bad)
		}
		if c.bad == "" && c.spec != "" {
			if svc.Type.String() != string(c.spec) {
				t.Errorf("spec.type %q: named %q", c.spec, svc.Type)
			}
			var back ServiceType
			if text, _ := svc.Type.MarshalText(); back.UnmarshalText(text) != nil || back != svc.Type {
				t.Errorf("spec.type %q: text %q read back as %s", c.spec, text, back)
			}
		}
	}
}

// TestConvertServiceHealthCheckNodePort: spec.healthCheckNodePort is kept
// when it is a port; out of range, it is reported by field and value, and
// the rest of the service stands without a health check.
func TestConvertServiceHealthCheckNodePort(t *testing.T) {
	k := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web"},
		Spec: corev1.ServiceSpec{
			Type:                  corev1.ServiceTypeLoadBalancer,
			ClusterIP:             "10.96.0.20",
			ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
			HealthCheckNodePort:   32000,
			Ports:                 []corev1.ServicePort{{Port: 80, NodePort: 30080}},
		},
	}
	svc, bad := convertService(k)
	if len(bad) != 0 || svc.HealthCheckNodePort != 32000 {
		t.Fatalf("healthCheckNodePort 32000: port %d, invalid %v", svc.HealthCheckNodePort, bad)
	}
	if got := svc.TableRow()[7]; got != "ext=Local int=Cluster healthCheckNodePort=32000" {
		t.Errorf("TrafficPolicy column %q", got)
	}
	for _, v := range []int32{-1, 65536, 100000} {
		k.Spec.HealthCheckNodePort = v
		svc, bad := convertService(k)
		want := fmt.Sprintf("spec.healthCheckNodePort: %d out of range: want 1 to 65535", v)
		if len(bad) != 1 || !strings.HasPrefix(bad[0].Error(), want) {
			t.Errorf("healthCheckNodePort %d: invalid %v, want one starting %q", v, bad, want)
		}
		if svc.HealthCheckNodePort != 0 || len(svc.Ports) != 1 || !svc.ExtTrafficPolicyLocal {
			t.Errorf("healthCheckNodePort %d: service %+v, want the rest kept and no health check port", v, svc)
		}
	}
}

func TestConvertEndpointSlice(t *testing.T) {
	port, badPort, udp := int32(53), int32(0), corev1.ProtocolUDP
	yes, no := true, false
	name, node := "dns", "node-1"
	k := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "kube-system", Name: "kube-dns-x7k2p", Labels: map[string]string{discoveryv1.LabelServiceName: "kube-dns"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{
			{Name: &name, Port: &port, Protocol: &udp},
			// All ports: no frontend can use it.
			{Name: &name},
			{Port: &badPort},
		},
		Endpoints: []discoveryv1.Endpoint{
			// Listed out of order: backends come sorted.
			{Addresses: []string{"10.244.0.9"}, Conditions: discoveryv1.EndpointConditions{Ready: &no, Serving: &yes, Terminating: &yes}},
			// Listed twice, terminating first: it counts once, active.
			{Addresses: []string{"10.244.0.3"}, Conditions: discoveryv1.EndpointConditions{Ready: &no, Serving: &yes, Terminating: &yes}},
			{Addresses: []string{"10.244.0.3", "10.244.0.4"}, NodeName: &node},
			{Addresses: []string{"10.244.0.5"}, Conditions: discoveryv1.EndpointConditions{Ready: &no}},
		},
	}
	s, bad := convertEndpointSlice(k)
	svc := ServiceName{"kube-system", "kube-dns"}
	want := &endpointSlice{
		id:      sliceID{"kube-system", "kube-dns-x7k2p"},
		service: svc,
		backends: []Backend{
			{Address: L3n4Addr{netip.MustParseAddr("10.244.0.3"), 53, UDP}, PortName: "dns", State: BackendActive, NodeName: "node-1"},
			{Address: L3n4Addr{netip.MustParseAddr("10.244.0.9"), 53, UDP}, PortName: "dns", State: BackendTerminating},
		},
	}
	if !reflect.DeepEqual(s, want) {
		t.Errorf("convertEndpointSlice =\n%+v\nwant\n%+v", s, want)
	}
	if unsafe.StringData(s.service.Name) != unsafe.StringData(k.Name) {
		t.Errorf("service name %q is a copy; want it to share the bytes of the slice name %q", s.service.Name, k.Name)
	}
	if len(bad) != 1 || bad[0].field != "ports[2].port" {
		t.Errorf("invalid fields = %v, want ports[2].port", bad)
	}

	k.AddressType = discoveryv1.AddressTypeFQDN
	if s, bad := convertEndpointSlice(k); len(s.backends) != 0 || len(bad) != 0 {
		t.Errorf("FQDN slice = %+v, %v; want no backends, no problem", s, bad)
	}
	delete(k.Labels, discoveryv1.LabelServiceName)
	k.AddressType = discoveryv1.AddressTypeIPv4
	if s, _ := convertEndpointSlice(k); s.service != (ServiceName{}) || len(s.backends) != 0 {
		t.Errorf("unlabelled slice = %+v, want no service, no backends", s)
	}
}

// A paged listing's objects come trimmed of what the conversion does not
// read (objectStore.trim): converted, a Service (with a selector) and an
// EndpointSlice with labels and annotations give what they give whole.
func TestListingTrimKeepsWhatConversionReads(t *testing.T) {
	meta := func(name string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Namespace: "default", Name: name, GenerateName: "web-", UID: "0c6e9f5a-1f0b-4f5e-8b7e-2d9b9f7c1a22",
			ResourceVersion: "4711", Generation: 2, CreationTimestamp: metav1.Unix(1795900000, 0),
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: "web", UID: "8d6f2a54-0b0e-4f3c-9c1e-2a8f1a3b7c11"}},
			Labels:          map[string]string{discoveryv1.LabelServiceName: "web", discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io", "app": "web"},
			Annotations:     map[string]string{"endpoints.kubernetes.io/last-change-trigger-time": "2026-11-29T00:00:00Z"}}
	}
	ready := true
	local := corev1.ServiceInternalTrafficPolicyLocal
	svc := &corev1.Service{ObjectMeta: meta("web"), Spec: corev1.ServiceSpec{
		Type: corev1.ServiceTypeLoadBalancer, ClusterIPs: []string{"10.96.0.10"}, ExternalIPs: []string{"192.0.2.10"},
		Ports:           []corev1.ServicePort{{Name: "http", Port: 80, NodePort: 30080, Protocol: corev1.ProtocolTCP}},
		Selector:        map[string]string{"app": "web"},
		SessionAffinity: corev1.ServiceAffinityClientIP, SessionAffinityConfig: &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: new(int32(60))}},
		ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal, InternalTrafficPolicy: &local, HealthCheckNodePort: 31000,
	}, Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: "192.0.2.20"}}}}}
	slice := &discoveryv1.EndpointSlice{ObjectMeta: meta("web-abcde"), AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.244.0.5"}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
		Ports:     []discoveryv1.EndpointPort{{Name: new("http"), Port: new(int32(8080)), Protocol: new(corev1.ProtocolTCP)}},
	}
	events := make(chan k8sEvent)
	wantSvc, _ := convertService(svc)
	trimmedSvc := svc.DeepCopy()
	serviceStore(t.Context(), events).trim.Object(trimmedSvc)
	if got, _ := convertService(trimmedSvc); !reflect.DeepEqual(got, wantSvc) {
		t.Errorf("trimmed Service converts to %+v, whole to %+v", got, wantSvc)
	}
	wantSlice, _ := convertEndpointSlice(slice)
	trimmedSlice := slice.DeepCopy()
	endpointSliceStore(t.Context(), events).trim.Object(trimmedSlice)
	if got, _ := convertEndpointSlice(trimmedSlice); !reflect.DeepEqual(got, wantSlice) || wantSlice.service.Name != "web" || len(wantSlice.backends) != 1 {
		t.Errorf("trimmed EndpointSlice converts to %+v, whole to %+v", got, wantSlice)
	}
	if len(trimmedSlice.Labels) != 1 || trimmedSlice.Annotations != nil || trimmedSvc.Labels != nil && len(trimmedSvc.Labels) != 0 || trimmedSvc.Spec.Selector != nil ||
		trimmedSlice.UID != "" || trimmedSlice.OwnerReferences != nil {
		t.Errorf("trimmed: the slice's labels %v, annotations %v; the Service's labels %v, selector %v", trimmedSlice.Labels, trimmedSlice.Annotations, trimmedSvc.Labels, trimmedSvc.Spec.Selector)
	}
}

// An invalid address is named by where it is: an ingress's, an
// endpoint's.
func TestInvalidAddressesNamed(t *testing.T) {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec:   corev1.ServiceSpec{ClusterIPs: []string{"10.96.0.10"}},
		Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: "192.0.2.1"}, {IP: "nope"}}}}}
	if _, bad := convertService(svc); len(bad) != 1 || bad[0].field != "status.loadBalancer.ingress[1].ip" {
		t.Errorf("invalid fields = %v, want status.loadBalancer.ingress[1].ip", bad)
	}
	slice := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web-1",
		Labels: map[string]string{discoveryv1.LabelServiceName: "web"}}, AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.244.0.1"}}, {Addresses: []string{"fd00::1"}}}}
	if _, bad := convertEndpointSlice(slice); len(bad) != 1 || bad[0].field != "endpoints[1].addresses[0]" {
		t.Errorf("invalid fields = %v, want endpoints[1].addresses[0]", bad)
	}
}
