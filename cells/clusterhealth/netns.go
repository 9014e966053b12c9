package clusterhealth

import (
	"fmt"
	"net"

	"github.com/cellium/cellium/pkg/netnsrun"
)

// ensureNetns makes path a new network namespace, unless it is one: a
// bind mount that outlives the agent (the health endpoint keeps its
// namespace across restarts). A plain file there (the mount went with a
// reboot) is replaced.
func ensureNetns(path string) (created bool, err error) {
	if netnsrun.Exists(path) {
		return false, nil
	}
	if err := netnsrun.Remove(path); err != nil {
		return false, fmt.Errorf("remove stale %s: %w", path, err)
	}
	if err := netnsrun.Create(path); err != nil {
		return false, err
	}
	return true, nil
}

// listenIn opens a TCP listener on every address of the namespace at path.
func listenIn(path string, port uint16) (net.Listener, error) {
	return netnsrun.In(path, func() (net.Listener, error) {
		return net.Listen("tcp", fmt.Sprintf(":%d", port))
	})
}
