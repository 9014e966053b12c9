package devclustertest

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Protocols a probe server serves and a prober probes.
const (
	TCP  = "TCP"
	UDP  = "UDP"
	SCTP = "SCTP"
)

// ProbeServer is what ServeProbes started in a pod.
type ProbeServer struct {
	// NoSCTP says why the pod serves no SCTP (the kernel has none, say);
	// empty when it does.
	NoSCTP string `json:"noSCTP,omitempty"`
}

// ServeProbes starts a server in pod answering TCP, UDP and SCTP on each
// of ports, on every address, until the test ends: TCP and SCTP accept
// and close, UDP echoes each datagram. SCTP where the kernel has none is
// left out, and the returned ProbeServer says why.
func (c *Cluster) ServeProbes(pod string, ports ...uint16) ProbeServer {
	c.t.Helper()
	list := make([]string, len(ports))
	for i, p := range ports {
		list[i] = strconv.Itoa(int(p))
	}
	h := c.startHelper(Where{Pod: pod}, "serve-probes", false, addrEnv+"="+strings.Join(list, ","))
	line, err := h.out.ReadString('\n')
	var s ProbeServer
	if err == nil {
		err = json.Unmarshal([]byte(line), &s)
	}
	if err != nil {
		c.t.Fatalf("probe server in pod %s did not start (does the package's TestMain call devclustertest.Main?): %q %v %s", pod, line, err, h.stderr.String())
	}
	return s
}

// Probe is one connection attempt: a TCP or SCTP connection, or a UDP
// datagram and its echo.
type Probe struct {
	Protocol string
	To       netip.AddrPort
	Timeout  time.Duration
}

// ProbeResult is what a probe saw: OK, or the error that ended it.
type ProbeResult struct {
	OK    bool
	Error string `json:",omitempty"`
	// Retransmits are the segments a TCP probe sent again before it was
	// connected (tcpi_total_retrans): a SYN, or its answer, lost in the
	// way. A connection that needed one was dropped for a moment (the
	// first SYN retransmission comes after 1s), which a timeout longer
	// than that does not show by itself.
	Retransmits uint32 `json:",omitempty"`
}

// Prober runs probes from a pod: one process in the pod (its network
// namespace and its node's cgroup) that runs every probe it is given at
// once. Each probe has a source port of its own, unused before by this
// prober, so no probe meets the conntrack entry of an earlier one.
type Prober struct {
	pod string
	mu  sync.Mutex
	in  io.Writer
	// waiting are the callers of Run, by probe id.
	waiting map[uint64]chan ProbeResult
	next    uint64
	dead    error
}

type probeRequest struct {
	ID uint64
	Probe
}

type probeResponse struct {
	ID uint64
	ProbeResult
}

// Prober starts a prober in pod; it ends with the test.
func (c *Cluster) Prober(pod string) *Prober {
	c.t.Helper()
	return c.ProberAt(Where{Pod: pod})
}

// ProberAt is Prober at w: a pod, a node's namespace, or another namespace
// such as the outside namespace.
func (c *Cluster) ProberAt(w Where) *Prober {
	c.t.Helper()
	h := c.startHelper(w, "probe", true)
	pod := w.Pod
	if pod == "" {
		pod = w.Node + w.NetNS
	}
	p := &Prober{pod: pod, in: h.in, waiting: map[uint64]chan ProbeResult{}}
	go func() {
		sc := bufio.NewScanner(h.out)
		for sc.Scan() {
			var r probeResponse
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
				continue
			}
			p.mu.Lock()
			ch := p.waiting[r.ID]
			delete(p.waiting, r.ID)
			p.mu.Unlock()
			if ch != nil {
				ch <- r.ProbeResult
			}
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		p.dead = fmt.Errorf("the prober in pod %s ended: %s", pod, strings.TrimSpace(h.stderr.String()))
		for id, ch := range p.waiting {
			ch <- ProbeResult{Error: p.dead.Error()}
			delete(p.waiting, id)
		}
	}()
	return p
}

// Run runs probes at once and returns their results in their order. A
// prober that died fails each probe with the reason.
func (p *Prober) Run(probes []Probe) []ProbeResult {
	chans := make([]chan ProbeResult, len(probes))
	var req strings.Builder
	p.mu.Lock()
	for i, pr := range probes {
		chans[i] = make(chan ProbeResult, 1)
		if p.dead != nil {
			chans[i] <- ProbeResult{Error: p.dead.Error()}
			continue
		}
		p.next++
		p.waiting[p.next] = chans[i]
		b, _ := json.Marshal(probeRequest{ID: p.next, Probe: pr})
		req.Write(b)
		req.WriteByte('\n')
	}
	var err error
	if req.Len() > 0 {
		_, err = io.WriteString(p.in, req.String())
	}
	p.mu.Unlock()
	out := make([]ProbeResult, len(probes))
	for i, ch := range chans {
		if err != nil {
			out[i] = ProbeResult{Error: fmt.Sprintf("send to the prober in pod %s: %v", p.pod, err)}
			continue
		}
		out[i] = <-ch
	}
	return out
}

// serveProbes is the helper behind ServeProbes.
func serveProbes(ports string) error {
	var (
		s    ProbeServer
		last net.Listener
	)
	for _, ps := range strings.Split(ports, ",") {
		port, err := strconv.ParseUint(ps, 10, 16)
		if err != nil {
			return fmt.Errorf("port %q: %w", ps, err)
		}
		addr := fmt.Sprintf(":%d", port)
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return err
		}
		if last != nil {
			go acceptClose(last)
		}
		last = ln
		pc, err := net.ListenPacket("udp", addr)
		if err != nil {
			return err
		}
		go echo(pc)
		if s.NoSCTP == "" {
			if err := listenSCTP(uint16(port)); err != nil {
				s.NoSCTP = err.Error()
			}
		}
	}
	b, _ := json.Marshal(s)
	fmt.Println(string(b))
	acceptClose(last)
	return errors.New("TCP listener closed")
}

func acceptClose(ln net.Listener) {
	for {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		conn.Close()
	}
}

func echo(pc net.PacketConn) {
	buf := make([]byte, 512)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		pc.WriteTo(buf[:n], from)
	}
}

// listenSCTP serves SCTP on port of every IPv4 and IPv6 address, accepting
// and closing each association. Go's net has no SCTP: these are the
// socket calls.
func listenSCTP(port uint16) error {
	fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_SCTP)
	if err != nil {
		return fmt.Errorf("the kernel has no SCTP: socket(AF_INET6, SOCK_STREAM, IPPROTO_SCTP): %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrInet6{Port: int(port)}); err != nil {
		unix.Close(fd)
		return fmt.Errorf("SCTP bind to port %d: %w", port, err)
	}
	if err := unix.Listen(fd, 128); err != nil {
		unix.Close(fd)
		return fmt.Errorf("SCTP listen on port %d: %w", port, err)
	}
	go func() {
		for {
			nfd, _, err := unix.Accept4(fd, unix.SOCK_CLOEXEC)
			if err != nil {
				if errors.Is(err, unix.EINTR) || errors.Is(err, unix.ECONNABORTED) {
					continue
				}
				return
			}
			unix.Close(nfd)
		}
	}()
	return nil
}

// probe is the helper behind Prober: it reads requests from stdin, runs
// each at once, and writes each result as it comes.
func probe() error {
	var (
		mu   sync.Mutex
		enc  = json.NewEncoder(os.Stdout)
		port = uint16(probeFirstPort)
		wg   sync.WaitGroup
	)
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		var req probeRequest
		if err := json.Unmarshal(sc.Bytes(), &req); err != nil {
			return fmt.Errorf("probe request %q: %w", sc.Text(), err)
		}
		src := port
		if port++; port > probeLastPort {
			port = probeFirstPort
		}
		wg.Go(func() {
			r := runProbe(req.Probe, src)
			mu.Lock()
			defer mu.Unlock()
			enc.Encode(probeResponse{ID: req.ID, ProbeResult: r})
		})
	}
	wg.Wait()
	return sc.Err()
}

// Source ports of probes, below the kernel's ephemeral range (32768 up):
// no socket of the pod's takes one by chance.
const probeFirstPort, probeLastPort = 10000, 32000

func runProbe(p Probe, srcPort uint16) ProbeResult {
	var err error
	switch p.Protocol {
	case TCP:
		d := net.Dialer{Timeout: p.Timeout, LocalAddr: &net.TCPAddr{Port: int(srcPort)}}
		var conn net.Conn
		if conn, err = d.Dial("tcp", p.To.String()); err == nil {
			retrans, err := tcpRetransmits(conn.(*net.TCPConn))
			conn.Close()
			if err != nil {
				return ProbeResult{Error: err.Error()}
			}
			return ProbeResult{OK: true, Retransmits: retrans}
		}
	case UDP:
		err = probeUDP(p, srcPort)
	case SCTP:
		err = probeSCTP(p, srcPort)
	default:
		err = fmt.Errorf("unknown protocol %q", p.Protocol)
	}
	if err != nil {
		return ProbeResult{Error: err.Error()}
	}
	return ProbeResult{OK: true}
}

// tcpRetransmits is the segments conn sent again so far (TCP_INFO).
func tcpRetransmits(conn *net.TCPConn) (uint32, error) {
	rc, err := conn.SyscallConn()
	if err != nil {
		return 0, err
	}
	var (
		info *unix.TCPInfo
		ierr error
	)
	if err := rc.Control(func(fd uintptr) { info, ierr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) }); err != nil {
		return 0, err
	}
	if ierr != nil {
		return 0, fmt.Errorf("TCP_INFO: %w", ierr)
	}
	return info.Total_retrans, nil
}

func probeUDP(p Probe, srcPort uint16) error {
	conn, err := net.DialUDP("udp", &net.UDPAddr{Port: int(srcPort)}, net.UDPAddrFromAddrPort(p.To))
	if err != nil {
		return err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(p.Timeout))
	if _, err := conn.Write([]byte("probe")); err != nil {
		return err
	}
	buf := make([]byte, 16)
	n, err := conn.Read(buf)
	if err == nil && string(buf[:n]) != "probe" {
		err = fmt.Errorf("echo %q, want %q", buf[:n], "probe")
	}
	return err
}

// probeSCTP opens an SCTP association to p.To within p.Timeout: a
// non-blocking connect and a poll for its end.
func probeSCTP(p Probe, srcPort uint16) error {
	fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.IPPROTO_SCTP)
	if err != nil {
		return fmt.Errorf("SCTP socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrInet6{Port: int(srcPort)}); err != nil {
		return fmt.Errorf("SCTP bind: %w", err)
	}
	to := &unix.SockaddrInet6{Port: int(p.To.Port()), Addr: p.To.Addr().As16()}
	if err := unix.Connect(fd, to); err != nil && !errors.Is(err, unix.EINPROGRESS) {
		return fmt.Errorf("SCTP connect: %w", err)
	}
	deadline := time.Now().Add(p.Timeout)
	for {
		ms := int(time.Until(deadline).Milliseconds())
		if ms <= 0 {
			return errors.New("SCTP connect: timed out")
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
		n, err := unix.Poll(fds, ms)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("SCTP poll: %w", err)
		}
		if n == 0 {
			continue
		}
		soErr, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
		if err != nil {
			return err
		}
		if soErr != 0 {
			return fmt.Errorf("SCTP connect: %w", unix.Errno(soErr))
		}
		return nil
	}
}
