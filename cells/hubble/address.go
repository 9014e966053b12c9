package hubble

import (
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strings"

	"github.com/cellium/cellium/pkg/flagcheck"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// SocketName is the Hubble socket's name in the run directory, where the
// server listens unless --hubble-listen-address says otherwise.
const SocketName = "hubble.sock"

// Address is where the Hubble server listens: a unix socket or a TCP
// address.
type Address struct {
	// Network is "unix" or "tcp".
	Network string
	// Addr is the socket's absolute path, or host:port.
	Addr string
}

func (a Address) String() string {
	if a.Network == "unix" {
		return "unix://" + a.Addr
	}
	return a.Addr
}

// ListenAddress is where --hubble-listen-address (listen) tells the server
// to listen: "" for <run-dir>/hubble.sock, "unix:/path" or "unix:///path"
// for another socket, "host:port" (":4244") for TCP.
func ListenAddress(listen, runDir string) (Address, error) {
	switch {
	case listen == "":
		return Address{Network: "unix", Addr: filepath.Join(runDir, SocketName)}, nil
	case strings.HasPrefix(listen, "unix:"):
		path := strings.TrimPrefix(strings.TrimPrefix(listen, "unix:"), "//")
		if !filepath.IsAbs(path) {
			return Address{}, fmt.Errorf("invalid --hubble-listen-address %q: a unix socket needs an absolute path, as in unix:///var/run/cellium/hubble.sock", listen)
		}
		if err := flagcheck.Creatable(path); err != nil {
			return Address{}, fmt.Errorf("invalid --hubble-listen-address %q: %w", listen, err)
		}
		return Address{Network: "unix", Addr: filepath.Clean(path)}, nil
	}
	if err := flagcheck.HostPort(listen); err != nil {
		return Address{}, fmt.Errorf("invalid --hubble-listen-address %q: want empty (unix socket in --run-dir), unix:/path/to/socket or host:port such as :4244 (%v)", listen, err)
	}
	return Address{Network: "tcp", Addr: listen}, nil
}

// Target is the gRPC target a client dials to reach the server at a. A
// wildcard TCP address (":4244") is reached on loopback.
func (a Address) Target() string {
	if a.Network == "unix" {
		return "unix://" + a.Addr
	}
	host, port, _ := net.SplitHostPort(a.Addr)
	if ip, err := netip.ParseAddr(host); host == "" || (err == nil && ip.IsUnspecified()) {
		host = "localhost"
	}
	return "dns:///" + net.JoinHostPort(host, port)
}

// Dial returns a client connection to the Hubble server at a, for
// observer.NewObserverClient and the gRPC health client. It connects
// lazily: the first call says whether the server is there.
func Dial(a Address) (*grpc.ClientConn, error) {
	return grpc.NewClient(a.Target(), grpc.WithTransportCredentials(insecure.NewCredentials()))
}
