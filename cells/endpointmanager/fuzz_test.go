package endpointmanager

import (
	"bytes"
	"encoding/json"
	"strconv"
	"testing"
)

// An endpoint state file is refused, or gives an endpoint the restore can
// rely on (see stateFile.validate) that is written back as a file that
// parses to the same endpoint.
func FuzzStateFile(f *testing.F) {
	valid := `{"version":1,"phase":"ready","id":6,"containerID":"c6","netns":"/var/run/netns/p","ifName":"eth0",` +
		`"ipv4":"10.244.0.7","ipv6":"fd00::7","hostIfName":"` + HostIfName("c6") + `","mac":"02:00:00:00:00:01",` +
		`"labels":{"app":"web"},"identity":300,"created":"2026-01-02T03:04:05Z"}`
	f.Add(valid, "6")
	f.Add(valid[:40], "6")
	f.Add(valid, "7")
	f.Add(`{"version":1,"phase":"deleting","id":1,"containerID":"c","netns":"/n","ifName":"eth0","ipv4":"10.0.0.2","hostIfName":"`+HostIfName("c")+`"}`, "1")
	f.Add(`{"version":1,"phase":"ready","id":1,"containerID":"c","netns":"/n","ifName":"eth0","ipv6":"fe80::1%eth0","hostIfName":"`+HostIfName("c")+`"}`, "1")
	f.Add(`{"version":2}`, "1")
	f.Fuzz(func(t *testing.T, data, dirName string) {
		sf, err := parseStateFile([]byte(data), dirName)
		if err != nil {
			return
		}
		if strconv.Itoa(int(sf.ID)) != dirName || sf.ID == 0 || sf.HostIfName != HostIfName(sf.ContainerID) ||
			validContainerID(sf.ContainerID) != nil || validNetns(sf.Netns) != nil || validIfName(sf.IfName) != nil {
			t.Fatalf("accepted %+v from directory %q", sf, dirName)
		}
		for _, ip := range sf.endpoint().IPs() {
			if ip.Zone() != "" {
				t.Fatalf("accepted zoned address %s", ip)
			}
		}
		if sf.IPv4.IsValid() && !sf.IPv4.Is4() || sf.IPv6.IsValid() && !sf.IPv6.Is6() || !sf.IPv4.IsValid() && !sf.IPv6.IsValid() {
			t.Fatalf("accepted addresses ipv4 %v ipv6 %v", sf.IPv4, sf.IPv6)
		}
		out, err := json.Marshal(toStateFile(sf.endpoint(), sf.Phase))
		if err != nil {
			t.Fatal(err)
		}
		again, err := parseStateFile(out, dirName)
		if err != nil {
			t.Fatalf("the state file written for an accepted one does not parse: %v\n%s", err, out)
		}
		out2, _ := json.Marshal(toStateFile(again.endpoint(), again.Phase))
		if !bytes.Equal(out, out2) {
			t.Fatalf("round trip changed the endpoint:\n%s\n%s", out, out2)
		}
	})
}
