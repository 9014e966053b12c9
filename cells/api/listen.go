package api

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
)

// socketMode lets the socket's group (root's, unless the DaemonSet changes
// it) use the agent's sockets; nobody else can.
const socketMode = 0o660

// ListenUnix listens on the unix socket path (mode 0660), replacing a socket
// left behind by an agent that died, but refusing to take over one that
// another agent still serves or a file that is not a socket. Errors name
// --flag, the flag that chose path. The API and the Hubble server use it.
func ListenUnix(flag, path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("--%s %s: create directory: %w", flag, path, err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != os.ModeSocket {
			return nil, fmt.Errorf("--%s %s exists and is not a socket", flag, path)
		}
		conn, err := net.Dial("unix", path)
		if err == nil {
			conn.Close()
			return nil, fmt.Errorf("--%s %s: another agent is serving on it", flag, path)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("--%s %s: probe existing socket: %w", flag, path, err)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("--%s %s: remove stale socket: %w", flag, path, err)
		}
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("--%s %s: %w", flag, path, err)
	}
	if err := os.Chmod(path, socketMode); err != nil {
		ln.Close()
		return nil, fmt.Errorf("--%s %s: chmod: %w", flag, path, err)
	}
	return ln, nil
}
