// Package flagcheck checks flag values that parse but may still be
// unusable, so that the cell that owns the flag refuses them when the
// graph is built, naming the flag, instead of failing in a start hook
// after other cells have started: a listen address whose port is out of
// range, a path under a regular file.
package flagcheck

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// HostPort checks a TCP listen address: host:port, the host an IP
// address, "localhost" or empty (every address), the port 0 to 65535.
func HostPort(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if host != "" && host != "localhost" {
		if _, err := netip.ParseAddr(host); err != nil {
			return fmt.Errorf("host %q is not an IP address or localhost", host)
		}
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("port %q is not a port number (0 to 65535)", port)
	}
	return nil
}

// Creatable checks that path can be made, as a file or a directory: the
// nearest of it and its parents that exists is a directory (or path itself
// is one). It reads, never writes, and says nothing of what it cannot
// read: whether the agent may write there shows at start. So `agent hive`
// works as any user.
func Creatable(path string) error {
	for p := filepath.Clean(path); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		switch {
		case err == nil && (fi.IsDir() || p == filepath.Clean(path)):
			return nil
		case err == nil:
			return fmt.Errorf("%s is not a directory", p)
		case !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR):
			// Not ours to look into (permission denied, say): whether
			// the path can be made shows at start.
			return nil
		}
		if p == filepath.Dir(p) {
			return nil
		}
	}
}
