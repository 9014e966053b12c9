package devices_test

import (
	"testing"

	"github.com/cellium/cellium/cells/devices"
	"github.com/cellium/cellium/cells/endpointmanager"
)

// The host side of an endpoint's veth, as endpointmanager names it, is one
// of the agent's own devices, never selected as the node's.
func TestEndpointHostSideIsOwnDevice(t *testing.T) {
	for _, id := range []string{"c1", "0123456789abcdef0123456789abcdef"} {
		if name := endpointmanager.HostIfName(id); !devices.IsOwnDevice(name) {
			t.Errorf("host side %s of container %s is not an own device: it could be selected and its pod's address taken for the node's", name, id)
		}
	}
	if devices.IsOwnDevice("eth0") {
		t.Error("eth0 is an own device")
	}
}
