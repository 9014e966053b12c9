package devclustertest

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"
)

// ServeIfHelper runs the helper and exits when the cluster started this
// test binary as one, and returns otherwise. A TestMain that must do more
// than Main calls it first.
func ServeIfHelper() {
	var err error
	switch os.Getenv(helperEnv) {
	case "":
		return
	case "serve-tcp":
		err = serveTCP(os.Getenv(addrEnv), os.Getenv(podEnv))
	case "dial-tcp":
		err = json.NewEncoder(os.Stdout).Encode(dialTCP(os.Getenv(addrEnv)))
	default:
		err = fmt.Errorf("unknown helper %q", os.Getenv(helperEnv))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "devclustertest helper:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func serveTCP(addr, pod string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	fmt.Println("listening")
	for {
		conn, err := ln.Accept()
		if err != nil {
			return err
		}
		json.NewEncoder(conn).Encode(ServerReply{
			Pod:    pod,
			Local:  unmapped(conn.LocalAddr().(*net.TCPAddr).AddrPort()),
			Remote: unmapped(conn.RemoteAddr().(*net.TCPAddr).AddrPort()),
		})
		conn.Close()
	}
}

func dialTCP(to string) DialResult {
	var r DialResult
	if b, err := os.ReadFile("/proc/self/cgroup"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if path, ok := strings.CutPrefix(line, "0::"); ok {
				r.Cgroup = path
			}
		}
	}
	// An untranslated or unrouted connection ends in a blackhole: its SYN
	// is dropped, and only the timeout ends the wait.
	conn, err := net.DialTimeout("tcp", to, 5*time.Second)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	defer conn.Close()
	r.Peer = unmapped(conn.RemoteAddr().(*net.TCPAddr).AddrPort())
	r.Local = unmapped(conn.LocalAddr().(*net.TCPAddr).AddrPort())
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(conn)
	if err == nil {
		err = json.Unmarshal(b, &r.Reply)
	}
	if err != nil {
		r.Error = fmt.Sprintf("read the server's reply: %v (got %q)", err, b)
	}
	return r
}

// unmapped is addr with an IPv4-mapped address made plain.
func unmapped(addr netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(addr.Addr().Unmap(), addr.Port())
}
