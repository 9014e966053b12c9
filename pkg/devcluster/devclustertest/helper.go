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
	case "serve-probes":
		err = serveProbes(os.Getenv(addrEnv))
	case "probe":
		err = probe()
	case "sink-tcp":
		err = sinkTCP(os.Getenv(addrEnv))
	case "send-tcp":
		var d time.Duration
		if d, err = time.ParseDuration(os.Getenv(durationEnv)); err == nil {
			err = sendTCP(os.Getenv(addrEnv), d)
		}
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

// sinkTCP reads and discards what every connection sends.
func sinkTCP(addr string) error {
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
		go func() {
			io.Copy(io.Discard, conn)
			conn.Close()
		}()
	}
}

// sendTCP sends as fast as it can to addr for d and prints the throughput.
func sendTCP(addr string, d time.Duration) error {
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	buf := make([]byte, 256<<10)
	var sent int64
	start := time.Now()
	for time.Since(start) < d {
		n, err := conn.Write(buf)
		sent += int64(n)
		if err != nil {
			return err
		}
	}
	return json.NewEncoder(os.Stdout).Encode(Throughput{Bytes: sent, Seconds: time.Since(start).Seconds()})
}

// Throughput is what a send-tcp helper measured.
type Throughput struct {
	Bytes   int64
	Seconds float64
}

// BitsPerSecond is the measured rate.
func (t Throughput) BitsPerSecond() float64 { return float64(t.Bytes) * 8 / t.Seconds }
