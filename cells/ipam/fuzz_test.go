package ipam

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/cellium/cellium/cells/api"
	"github.com/cellium/cellium/pkg/apiv1"
)

// printableOwner is what every accepted owner must be.
func printableOwner(t *testing.T, owner string) {
	t.Helper()
	if owner == "" || len(owner) > maxOwnerLen || owner == RouterOwner || !utf8.ValidString(owner) ||
		strings.IndexFunc(owner, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
		t.Fatalf("accepted owner %q", owner)
	}
}

// An allocation file either is refused or gives an allocation that is
// written back as the same file: a valid address without a zone, named
// like the file, a printable owner, a state a file may hold.
func FuzzAllocationFile(f *testing.F) {
	f.Add("10.244.0.2.json", []byte(`{"ip":"10.244.0.2","owner":"pod-a","state":"in-use","since":"2026-01-02T03:04:05Z"}`))
	f.Add("fd00::2.json", []byte(`{"ip":"fd00::2","owner":"ops","state":"reserved","since":"2026-01-02T03:04:05Z"}`))
	f.Add("10.244.0.3.json", []byte(`{"ip":"10.244.0.3","owner":"pod-b","sta`))
	f.Add("10.244.0.4.json", []byte(`{"ip":"10.244.0.5","owner":"pod-c","state":"in-use"}`))
	f.Add("fe80::1%eth0.json", []byte(`{"ip":"fe80::1%eth0","owner":"pod","state":"in-use"}`))
	f.Add("10.244.0.6.json", []byte(`{"ip":"10.244.0.6","owner":"a\nb","state":"in-use"}`))
	f.Add("10.244.0.7.json", []byte(`{"ip":"10.244.0.7","owner":"x","state":"in-use"}{}`))
	f.Fuzz(func(t *testing.T, name string, data []byte) {
		a, err := parseAllocationFile(name, data)
		if err != nil {
			return
		}
		if !a.IP.IsValid() || a.IP.Zone() != "" || name != a.IP.String()+fileSuffix {
			t.Fatalf("accepted address %v from file %q", a.IP, name)
		}
		printableOwner(t, a.Owner)
		if a.State != Unclaimed && a.State != Reserved {
			t.Fatalf("loaded state %q", a.State)
		}
		// What the store writes for it parses to the same allocation.
		state := a.State
		if state == Unclaimed {
			state = InUse
		}
		out, err := json.Marshal(allocationFile{IP: a.IP, Owner: a.Owner, State: state, Since: a.Since})
		if err != nil {
			t.Fatal(err)
		}
		b, err := parseAllocationFile(name, out)
		if err != nil || b.IP != a.IP || b.Owner != a.Owner || b.State != a.State || !b.Since.Equal(a.Since) {
			t.Fatalf("round trip of %s: %+v, %v; want %+v", out, b, err, a)
		}
	})
}

// A POST /v1/ipam body is refused, or asks for one address or one family
// for a printable owner; never a zoned address.
func FuzzReserveBody(f *testing.F) {
	f.Add(`{"owner":"ops","ip":"10.244.0.10"}`)
	f.Add(`{"owner":"ops","family":"ipv4"}`)
	f.Add(`{"owner":"ops","ip":"fd00::1%eth0"}`)
	f.Add(`{"owner":"ops\nWARN","family":"ipv6"}`)
	f.Add(`{"owner":"ops","ip":"::ffff:10.0.0.1"}`)
	f.Add(`{"owner":"ops","ip":"10.0.0.1","family":"ipv4"}`)
	f.Add(`{"ownr":"typo"}`)
	f.Add(`{"owner":"router","family":"ipv4"}`)
	f.Fuzz(func(t *testing.T, body string) {
		var in apiv1.IPAMReserve
		if err := api.DecodeJSON(httptest.NewRequest("POST", apiv1.PathIPAM, strings.NewReader(body)), &in); err != nil {
			return
		}
		req, err := reserveRequest(in)
		if err != nil {
			return
		}
		printableOwner(t, req.Owner)
		if !req.Reserved {
			t.Fatal("a reservation that is not reserved")
		}
		switch {
		case req.IP.IsValid():
			if req.IP.Zone() != "" || req.IP.Is4In6() || in.Family != "" {
				t.Fatalf("accepted ip %v (family %q) from %q", req.IP, in.Family, body)
			}
		case req.Family != IPv4 && req.Family != IPv6:
			t.Fatalf("accepted family %q from %q", req.Family, body)
		}
	})
}

// The address of DELETE /v1/ipam/{ip} is refused, or valid without a zone.
func FuzzReleasePath(f *testing.F) {
	for _, s := range []string{"10.244.0.2", "fd00::2", "fe80::1%25eth0", "fe80::1%eth0", "not-an-ip", "%zz", "::ffff:10.0.0.1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, value string) {
		ip, err := pathAddr(value)
		if err != nil {
			return
		}
		if !ip.IsValid() || ip.Zone() != "" || ip.Is4In6() {
			t.Fatalf("accepted %v from %q", ip, value)
		}
	})
}
