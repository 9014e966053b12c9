package loadbalancer

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"slices"
	"testing"
)

func TestL3n4AddrText(t *testing.T) {
	for _, s := range []string{"10.96.0.10:80/TCP", "[fd00::1]:53/UDP", "0.0.0.0:30080/SCTP", "[::]:1/TCP"} {
		a, err := ParseL3n4Addr(s)
		if err != nil {
			t.Fatalf("ParseL3n4Addr(%q): %v", s, err)
		}
		if a.String() != s {
			t.Errorf("ParseL3n4Addr(%q).String() = %q", s, a.String())
		}
	}
	// IPv4-mapped addresses are unmapped, so one address has one key.
	a, err := ParseL3n4Addr("[::ffff:10.0.0.1]:80/TCP")
	if err != nil || a.String() != "10.0.0.1:80/TCP" {
		t.Errorf("mapped address = %v, %v; want 10.0.0.1:80/TCP", a, err)
	}
	for _, bad := range []string{"10.96.0.10:80", "10.96.0.10/TCP", "10.96.0.999:80/TCP", "10.96.0.10:80/ICMP", "10.96.0.10:70000/TCP", "fd00::1:80/TCP"} {
		if _, err := ParseL3n4Addr(bad); err == nil {
			t.Errorf("ParseL3n4Addr(%q) succeeded, want an error", bad)
		}
	}
}

// TestL3n4AddrKeyOrder checks that the index keys sort like Compare, so a
// table listed by address and a sorted slice agree.
func TestL3n4AddrKeyOrder(t *testing.T) {
	var addrs []L3n4Addr
	for _, ip := range []string{"10.0.0.1", "10.0.0.100", "9.255.255.255", "192.168.0.1", "::", "fd00::1", "2001:db8::1", "0.0.0.0"} {
		for _, port := range []uint16{80, 443, 8080, 1} {
			for _, proto := range []L4Proto{TCP, UDP, SCTP} {
				addrs = append(addrs, L3n4Addr{Addr: netip.MustParseAddr(ip), Port: port, Protocol: proto})
			}
		}
	}
	byCompare := slices.SortedFunc(slices.Values(addrs), L3n4Addr.Compare)
	byKey := slices.SortedFunc(slices.Values(addrs), func(a, b L3n4Addr) int { return bytes.Compare(a.key(), b.key()) })
	if !slices.Equal(byCompare, byKey) {
		t.Errorf("key order differs from Compare:\n%v\n%v", byKey, byCompare)
	}
}

func TestServiceNameText(t *testing.T) {
	n, err := ParseServiceName("kube-system/kube-dns")
	if err != nil || n != (ServiceName{"kube-system", "kube-dns"}) || n.String() != "kube-system/kube-dns" {
		t.Errorf("ParseServiceName = %v, %v", n, err)
	}
	for _, bad := range []string{"kube-dns", "/kube-dns", "kube-system/", "a/b/c", ""} {
		if _, err := ParseServiceName(bad); err == nil {
			t.Errorf("ParseServiceName(%q) succeeded, want an error", bad)
		}
	}
}

// TestEnumsAsText checks that the byte-sized protocol and frontend type
// read and write as the names the API and `agent db show` have always
// shown.
func TestEnumsAsText(t *testing.T) {
	fe := Frontend{
		Address:     L3n4Addr{Addr: netip.MustParseAddr("10.96.0.10"), Port: 53, Protocol: UDP},
		Type:        FrontendLoadBalancer,
		ServiceName: ServiceName{Namespace: "default", Name: "web"},
	}
	port := ServicePort{Port: 80, Protocol: SCTP}
	data, err := json.Marshal(struct {
		F Frontend
		P ServicePort
	}{fe, port})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"address":"10.96.0.10:53/UDP"`, `"type":"LoadBalancer"`, `"protocol":"SCTP"`} {
		if !bytes.Contains(data, []byte(want)) {
			t.Errorf("JSON %s does not hold %s", data, want)
		}
	}
	var back struct {
		F Frontend
		P ServicePort
	}
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	if !back.F.sameContent(&fe) || back.P != port {
		t.Errorf("round trip gave %+v %+v, want %+v %+v", back.F, back.P, fe, port)
	}
	for _, bad := range []string{`{"serviceName":"a/b","type":"Ingress"}`, `{"serviceName":"a/b","type":""}`} {
		if err := json.Unmarshal([]byte(bad), &back.F); err == nil {
			t.Errorf("frontend %s decoded, want an error", bad)
		}
	}
	if err := json.Unmarshal([]byte(`{"protocol":"ICMP"}`), &back.P); err == nil {
		t.Error("port with protocol ICMP decoded, want an error")
	}
}

// The byte enumerations are their names in text both ways; a value
// without a name shows its number, and a name that is none is an error
// naming it and the names there are.
func TestByteEnumText(t *testing.T) {
	type textual interface {
		String() string
		MarshalText() ([]byte, error)
	}
	for _, c := range []struct {
		v     textual
		text  string
		parse func(string) (textual, error)
	}{
		{TCP, "TCP", func(s string) (textual, error) { var p L4Proto; err := p.UnmarshalText([]byte(s)); return p, err }},
		{SCTP, "SCTP", func(s string) (textual, error) { var p L4Proto; err := p.UnmarshalText([]byte(s)); return p, err }},
		{FrontendLoadBalancer, "LoadBalancer", func(s string) (textual, error) { var f FrontendType; err := f.UnmarshalText([]byte(s)); return f, err }},
		{ServiceExternalName, "ExternalName", func(s string) (textual, error) { var v ServiceType; err := v.UnmarshalText([]byte(s)); return v, err }},
	} {
		text, err := c.v.MarshalText()
		if err != nil || string(text) != c.text || c.v.String() != c.text {
			t.Errorf("%v: text %q (%v), String %q; want %q", c.v, text, err, c.v.String(), c.text)
		}
		if back, err := c.parse(c.text); err != nil || back != c.v {
			t.Errorf("%q read back as %v (%v), want %v", c.text, back, err, c.v)
		}
	}
	for _, c := range []struct{ got, want string }{
		{L4Proto(9).String(), "L4Proto(9)"},
		{FrontendType(0).String(), "FrontendType(0)"},
		{ServiceType(200).String(), "ServiceType(200)"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
	var p L4Proto
	var f FrontendType
	var s ServiceType
	for _, c := range []struct {
		err  error
		want string
	}{
		{p.UnmarshalText([]byte("ICMP")), `invalid protocol "ICMP": want TCP, UDP or SCTP`},
		{f.UnmarshalText([]byte("Headless")), `invalid frontend type "Headless": want ClusterIP, NodePort, ExternalIP or LoadBalancer`},
		{s.UnmarshalText([]byte("")), `invalid service type "": want ClusterIP, NodePort, LoadBalancer or ExternalName`},
	} {
		if c.err == nil || c.err.Error() != c.want {
			t.Errorf("error %v, want %q", c.err, c.want)
		}
	}
}
