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
//
// The socket is never reachable with a wider mode than 0660: bind creates
// the socket file with the process's umask (0777 under umask 000), so it is
// bound inside a fresh 0700 directory beside path, narrowed there, and only
// then renamed to path. Closing the listener removes path.
func ListenUnix(flag, path string) (net.Listener, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
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
	private, err := os.MkdirTemp(dir, ".sock")
	if err != nil {
		return nil, fmt.Errorf("--%s %s: %w", flag, path, err)
	}
	defer os.RemoveAll(private)
	tmp := filepath.Join(private, "s")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("--%s %s: %w", flag, path, err)
	}
	// The listener would unlink the name it was bound to, which is gone
	// once renamed: unixListener removes path instead.
	ln.SetUnlinkOnClose(false)
	if err := os.Chmod(tmp, socketMode); err != nil {
		ln.Close()
		return nil, fmt.Errorf("--%s %s: chmod: %w", flag, path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		ln.Close()
		return nil, fmt.Errorf("--%s %s: %w", flag, path, err)
	}
	return &unixListener{UnixListener: ln, path: path}, nil
}

// unixListener removes its socket file when closed.
type unixListener struct {
	*net.UnixListener
	path string
}

func (l *unixListener) Close() error {
	err := l.UnixListener.Close()
	if rmErr := os.Remove(l.path); rmErr != nil && !errors.Is(rmErr, os.ErrNotExist) && err == nil {
		err = rmErr
	}
	return err
}

// Addr is the socket's path, not the private name it was bound to.
func (l *unixListener) Addr() net.Addr { return &net.UnixAddr{Name: l.path, Net: "unix"} }
