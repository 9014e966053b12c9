package endpointmanager

import (
	"errors"
	"testing"
)

// TestHostNetlinkStop: the stop does not close the host sockets under a
// creation that holds them (its last release does, once), and a get after
// the stop is refused instead of opening sockets nothing would close.
func TestHostNetlinkStop(t *testing.T) {
	var n hostNetlink
	_, raw, release, err := n.get()
	if err != nil {
		t.Fatalf("host netlink sockets: %v", err)
	}
	n.close()
	if _, err := raw.Socket.GetPid(); err != nil {
		t.Fatalf("the stop closed the sockets a creation holds: %v", err)
	}
	if _, _, _, err := n.get(); !errors.Is(err, errHostNetlinkStopped) {
		t.Fatalf("get after the stop = %v, want %v", err, errHostNetlinkStopped)
	}
	release()
	release() // a second call of one release changes nothing
	if _, err := raw.Socket.GetPid(); err == nil {
		t.Fatal("the sockets are open after the stop and the last release")
	}
	if n.h != nil || n.users != 0 || n.opened != 1 {
		t.Fatalf("after the last release: handle %v, users %d, opened %d times; want nil, 0, 1", n.h, n.users, n.opened)
	}
	n.close() // a second stop changes nothing
}
