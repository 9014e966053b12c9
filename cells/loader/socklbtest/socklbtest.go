// Package socklbtest is a harness for tests of socket load balancing with
// real sockets, real programs and a real kernel: a cgroup and a network
// namespace of the test's own, backend servers in the namespace, and
// clients that run in both, so that their sockets go through the programs.
//
//	func TestMain(m *testing.M) { socklbtest.Main(m) }
//
//	func TestService(t *testing.T) {
//		env := socklbtest.New(t)            // skips unless root with cgroup2
//		maps := env.StartDatapath()         // the programs, attached to env.Cgroup
//		env.ServeTCP(netip.MustParseAddrPort("127.0.0.2:8080"))
//		... put a service 10.96.0.10:80 -> 127.0.0.2:8080 into maps ...
//		r := env.Run(socklbtest.Call{Op: socklbtest.TCP, To: netip.MustParseAddrPort("10.96.0.10:80")})
//		// r[0].Backend == "127.0.0.2:8080", r[0].Peer == 10.96.0.10:80
//	}
//
// What it sets up, and why:
//
//   - A cgroup under the cgroup2 mount, with a unique name, removed at the
//     end of the test. Attach the programs there (the loader's
//     --cgroup-root), never at the root: only the test's clients are then
//     affected.
//   - A network namespace with only lo, up (127.0.0.1/8, and ::1 if the
//     kernel has IPv6), kept by a bind mount at Env.NetNS and released at
//     the end of the test. Backends listen on loopback addresses in it (all
//     of 127.0.0.0/8 is local; add IPv6 addresses with AddAddr). Because the
//     namespace has no other interface and no routes, a connect to a
//     service address that the programs leave untranslated fails with
//     ENETUNREACH instead of leaving the machine: test traffic stays on lo,
//     and "untouched" is an errno a test can check.
//   - Clients run in a child process: the test binary again, started
//     directly in the test cgroup (clone3 with CLONE_INTO_CGROUP), which
//     enters the namespace before anything else. A socket belongs to the
//     cgroup of the task that creates it, and cgroup v2 places whole
//     processes, so the test process itself cannot be the client without
//     putting all of itself under the programs. That is why a package using
//     Run must call Main from its TestMain. The child reports, per call,
//     what the backend said, getpeername, the source of a UDP reply and the
//     errno of a failed call, as JSON.
package socklbtest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"testing"

	"github.com/cellium/cellium/pkg/cgroup2"
	"github.com/cellium/cellium/pkg/nettest"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// clientEnv, set in a child's environment to the path of the network
// namespace, makes Main run the client instead of the tests.
const clientEnv = "CELLIUM_SOCKLBTEST_CLIENT_NETNS"

// Main runs the client when the harness started this test binary as one,
// and the tests otherwise. Call it from TestMain in every package that uses
// Env.Run.
func Main(m *testing.M) {
	ServeIfClient()
	os.Exit(m.Run())
}

// ServeIfClient runs the client and exits when the harness started this
// test binary as one, and returns otherwise. A TestMain that must do more
// than m.Run calls it first instead of Main.
func ServeIfClient() {
	path := os.Getenv(clientEnv)
	if path == "" {
		return
	}
	if err := runClient(path, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "socklbtest client:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// Env is a test's cgroup and network namespace.
type Env struct {
	// Cgroup is the test's cgroup2 directory: attach programs here.
	Cgroup string
	// NetNS is the path of the test's network namespace.
	NetNS string

	t    testing.TB
	nl   *netlink.Handle
	ipv6 bool
}

// New creates the cgroup and the network namespace, and removes them when
// the test ends. It skips the test when it cannot: not root, no cgroup2.
func New(t testing.TB) *Env {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for a cgroup and a network namespace")
	}
	mount, err := cgroup2.Mount()
	if err != nil {
		t.Skipf("needs cgroup2: %v", err)
	}
	cgroup, err := os.MkdirTemp(mount, "cellium-socklbtest-")
	if err != nil {
		t.Skipf("cannot create a cgroup under %s: %v", mount, err)
	}
	t.Cleanup(func() {
		// The clients have exited, so the cgroup is empty.
		if err := os.Remove(cgroup); err != nil {
			t.Errorf("remove test cgroup: %v", err)
		}
	})
	e := &Env{Cgroup: cgroup, t: t}
	e.NetNS = nettest.NewNS(t).Path()

	fd, err := unix.Open(e.NetNS, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if e.nl, err = netlink.NewHandleAt(netns.NsHandle(fd)); err != nil {
		t.Fatalf("netlink in the test netns: %v", err)
	}
	t.Cleanup(e.nl.Close)
	lo, err := e.nl.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.nl.LinkSetUp(lo); err != nil {
		t.Fatalf("set lo up in the test netns: %v", err)
	}
	addrs, err := e.nl.AddrList(lo, netlink.FAMILY_V6)
	if err != nil {
		t.Fatal(err)
	}
	e.ipv6 = len(addrs) > 0
	return e
}

// At is an Env over a cgroup and a network namespace that the caller made
// and removes, such as a node's --cgroup-root and a pod's namespace: Run
// runs clients there, ServeTCP and ServeUDP serve there.
func At(t testing.TB, cgroup, netnsPath string) *Env {
	return &Env{Cgroup: cgroup, NetNS: netnsPath, t: t}
}

// RequireIPv6 skips the test if the kernel gave the namespace no IPv6.
func (e *Env) RequireIPv6() {
	e.t.Helper()
	if !e.ipv6 {
		e.t.Skip("no IPv6 in the test network namespace (::1 missing on lo)")
	}
}

// AddAddr adds addresses to lo in the namespace, for backends or node
// addresses outside 127.0.0.0/8 (fd00::/8 ones, say). IPv6 addresses skip
// duplicate address detection, so they are usable at once.
func (e *Env) AddAddr(prefixes ...netip.Prefix) {
	e.t.Helper()
	lo, err := e.nl.LinkByName("lo")
	if err != nil {
		e.t.Fatal(err)
	}
	for _, p := range prefixes {
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
		if p.Addr().Is6() {
			addr.Flags = unix.IFA_F_NODAD
		}
		if err := e.nl.AddrAdd(lo, addr); err != nil {
			e.t.Fatalf("add %s to lo in the test netns: %v", p, err)
		}
	}
}

// ServeTCP starts a TCP backend on each address in the namespace: it
// accepts connections, writes its address ("127.0.0.2:8080") and closes
// them. The backends stop when the test ends.
func (e *Env) ServeTCP(addrs ...netip.AddrPort) {
	e.t.Helper()
	for _, addr := range addrs {
		ln, err := nettest.In(e.NetNS, func() (net.Listener, error) { return net.Listen("tcp", addr.String()) })
		if err != nil {
			e.t.Fatalf("TCP backend %s: %v", addr, err)
		}
		e.t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				conn, err := ln.Accept()
				if err != nil {
					return
				}
				conn.Write([]byte(addr.String()))
				conn.Close()
			}
		}()
	}
}

// ServeUDP starts a UDP backend on each address in the namespace: it
// answers every datagram with its address, from that address.
func (e *Env) ServeUDP(addrs ...netip.AddrPort) {
	e.t.Helper()
	for _, addr := range addrs {
		pc, err := nettest.In(e.NetNS, func() (net.PacketConn, error) { return net.ListenPacket("udp", addr.String()) })
		if err != nil {
			e.t.Fatalf("UDP backend %s: %v", addr, err)
		}
		e.t.Cleanup(func() { pc.Close() })
		go func() {
			buf := make([]byte, 64)
			for {
				_, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				pc.WriteTo([]byte(addr.String()), from)
			}
		}()
	}
}

// Op is what a client does with one socket.
type Op string

const (
	// TCP connects, asks getpeername and reads what the backend says.
	TCP Op = "tcp"
	// UDPConnected connects a UDP socket, asks getpeername, sends a
	// datagram and receives the reply with its source.
	UDPConnected Op = "udp-connected"
	// UDP sends a datagram with sendto on an unconnected socket and
	// receives the reply with its source.
	UDP Op = "udp"
)

// Call is one socket of a client. The socket is IPv4 for an IPv4 To, IPv6
// otherwise; an IPv4-mapped To (::ffff:10.96.0.10) makes an IPv6 socket
// that reaches an IPv4 address, as dual-stack applications do.
type Call struct {
	Op Op
	To netip.AddrPort
}

// Result is what one Call saw. The zero netip.AddrPort means not reached.
type Result struct {
	Call Call
	// Backend is what the backend sent: its address.
	Backend string `json:",omitempty"`
	// Peer is getpeername of a connected socket.
	Peer netip.AddrPort
	// From is the source address of a UDP reply.
	From netip.AddrPort
	// Errno names the error of the call that failed ("ECONNREFUSED",
	// "ENETUNREACH"); empty if none did.
	Errno string `json:",omitempty"`
	// Failed is the system call that failed: socket, connect,
	// getpeername, send, recv.
	Failed string `json:",omitempty"`
}

func (r Result) String() string {
	if r.Errno != "" {
		return fmt.Sprintf("%s %s: %s failed: %s", r.Call.Op, r.Call.To, r.Failed, r.Errno)
	}
	return fmt.Sprintf("%s %s: backend %q, peer %v, from %v", r.Call.Op, r.Call.To, r.Backend, r.Peer, r.From)
}

// Repeat is n copies of c.
func Repeat(n int, c Call) []Call {
	calls := make([]Call, n)
	for i := range calls {
		calls[i] = c
	}
	return calls
}

// Run runs calls, one after the other, in one client process in the test
// cgroup and network namespace, and returns what each saw. A client that
// cannot run fails the test.
func (e *Env) Run(calls ...Call) []Result {
	e.t.Helper()
	req, err := json.Marshal(calls)
	if err != nil {
		e.t.Fatal(err)
	}
	cg, err := os.Open(e.Cgroup)
	if err != nil {
		e.t.Fatal(err)
	}
	defer cg.Close()
	var stdout, stderr bytes.Buffer
	// -test.run=^$: should the package's TestMain not call Main, the child
	// runs no test, prints no results, and the error below says why.
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), clientEnv+"="+e.NetNS)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = bytes.NewReader(req), &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd())}
	if err := cmd.Run(); err != nil {
		e.t.Fatalf("client: %v\n%s", err, stderr.Bytes())
	}
	var results []Result
	if err := json.Unmarshal(stdout.Bytes(), &results); err != nil || len(results) != len(calls) {
		e.t.Fatalf("client printed no results (does the package's TestMain call socklbtest.Main?): %v\n%s%s",
			err, stdout.Bytes(), stderr.Bytes())
	}
	return results
}

// runClient is the child: it enters the namespace, runs the calls it reads
// from in and writes their results to out.
func runClient(netnsPath string, in io.Reader, out io.Writer) error {
	// Never unlocked: setns moves only this thread into the namespace, and
	// every socket is made on it.
	runtime.LockOSThread()
	fd, err := unix.Open(netnsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("enter the test netns: %w", err)
	}
	unix.Close(fd)
	var calls []Call
	if err := json.NewDecoder(in).Decode(&calls); err != nil {
		return err
	}
	results := make([]Result, len(calls))
	for i, c := range calls {
		results[i] = c.run()
	}
	return json.NewEncoder(out).Encode(results)
}

// run makes the call with system calls, so that each error is the errno
// the kernel returned.
func (c Call) run() (r Result) {
	r.Call = c
	fail := func(call string, err error) Result {
		r.Failed = call
		var errno unix.Errno
		if errors.As(err, &errno) {
			r.Errno = unix.ErrnoName(errno)
		} else {
			r.Errno = err.Error()
		}
		return r
	}
	family := unix.AF_INET
	if c.To.Addr().Is6() {
		family = unix.AF_INET6
	}
	typ := unix.SOCK_DGRAM
	if c.Op == TCP {
		typ = unix.SOCK_STREAM
	}
	fd, err := unix.Socket(family, typ|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fail("socket", err)
	}
	defer unix.Close(fd)
	// A lost reply fails the call (EAGAIN) instead of hanging the test.
	// Connects need no timeout: on lo they complete or fail at once.
	timeout := unix.Timeval{Sec: 5}
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &timeout)
	to := sockaddr(c.To)

	if c.Op != UDP {
		if err := unix.Connect(fd, to); err != nil {
			return fail("connect", err)
		}
		peer, err := unix.Getpeername(fd)
		if err != nil {
			return fail("getpeername", err)
		}
		r.Peer = addrPort(peer)
	}
	buf := make([]byte, 128)
	switch c.Op {
	case TCP:
		var got []byte
		for {
			n, err := retryEINTR(func() (int, error) { return unix.Read(fd, buf) })
			if err != nil {
				return fail("recv", err)
			}
			if n == 0 {
				break
			}
			got = append(got, buf[:n]...)
		}
		r.Backend = string(got)
	case UDPConnected, UDP:
		var err error
		if c.Op == UDP {
			err = unix.Sendto(fd, []byte("hello"), 0, to)
		} else {
			_, err = unix.Write(fd, []byte("hello"))
		}
		if err != nil {
			return fail("send", err)
		}
		var from unix.Sockaddr
		n, err := retryEINTR(func() (n int, err error) {
			n, from, err = unix.Recvfrom(fd, buf, 0)
			return n, err
		})
		if err != nil {
			return fail("recv", err)
		}
		r.Backend, r.From = string(buf[:n]), addrPort(from)
	}
	return r
}

// retryEINTR retries a receive that a signal interrupted: with a receive
// timeout set, the kernel does not restart it even under SA_RESTART.
func retryEINTR(recv func() (int, error)) (int, error) {
	for {
		n, err := recv()
		if err != unix.EINTR {
			return n, err
		}
	}
}

func sockaddr(ap netip.AddrPort) unix.Sockaddr {
	if ap.Addr().Is4() {
		return &unix.SockaddrInet4{Addr: ap.Addr().As4(), Port: int(ap.Port())}
	}
	return &unix.SockaddrInet6{Addr: ap.Addr().As16(), Port: int(ap.Port())}
}

func addrPort(sa unix.Sockaddr) netip.AddrPort {
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port))
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), uint16(sa.Port))
	}
	return netip.AddrPort{}
}
