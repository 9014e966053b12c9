// Package icmpprobe sends ICMP and ICMPv6 echo requests and matches their
// replies: one raw socket per family serves any number of concurrent
// probes, each waiting for its own reply (by identifier, sequence number
// and source), so probing a thousand nodes costs two sockets, not two
// thousand.
//
//	p, err := icmpprobe.New()
//	defer p.Close()
//	rtt, err := p.Ping(ctx, netip.MustParseAddr("192.0.2.7"))
//
// Raw sockets need CAP_NET_RAW. The sockets belong to the network
// namespace of the thread that calls New. Each carries a socket filter
// that lets through only echo replies with the Pinger's identifier: the
// kernel drops every other ICMP packet the node receives before it is
// copied to the socket.
package icmpprobe

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// Pinger probes with echo requests. Its methods are safe for concurrent use.
type Pinger struct {
	id  uint16
	fd4 int
	fd6 int

	mu      sync.Mutex
	seq     uint16
	waiting map[waiter]chan time.Time
	done    chan struct{}
	wg      sync.WaitGroup
}

type waiter struct {
	from netip.Addr
	seq  uint16
}

// New opens the sockets. A family the kernel does not offer (no IPv6) is
// left out: Ping to it fails.
func New() (*Pinger, error) {
	p := &Pinger{id: uint16(rand.Uint32()), fd4: -1, fd6: -1, waiting: map[waiter]chan time.Time{}, done: make(chan struct{})}
	var err error
	if p.fd4, err = unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMP); err != nil {
		return nil, fmt.Errorf("ICMP raw socket: %w", err)
	}
	if p.fd6, err = unix.Socket(unix.AF_INET6, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMPV6); err != nil {
		p.fd6 = -1
	}
	for _, fd := range []int{p.fd4, p.fd6} {
		if fd < 0 {
			continue
		}
		if err := attachReplyFilter(fd, fd == p.fd6, p.id); err != nil {
			p.Close()
			return nil, fmt.Errorf("ICMP socket filter: %w", err)
		}
		// Close wakes a blocked read by shutting the socket's receiving
		// side (closing it would not); the timeout is a fallback, should a
		// kernel not wake it.
		tv := unix.NsecToTimeval(readWakeup.Nanoseconds())
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			p.Close()
			return nil, err
		}
		p.wg.Add(1)
		go p.read(fd)
	}
	return p, nil
}

// readWakeup is how often a blocked read wakes up on its own to see
// whether Close was called.
var readWakeup = 200 * time.Millisecond

// Close stops the readers and closes the sockets. It does not wait for a
// read's timeout: shutting a socket's receiving side ends its blocked read
// at once (it returns no data).
func (p *Pinger) Close() {
	select {
	case <-p.done:
		return
	default:
		close(p.done)
	}
	for _, fd := range []int{p.fd4, p.fd6} {
		if fd >= 0 {
			// A raw socket is not connected: the kernel answers ENOTCONN,
			// and shuts its receiving side and wakes its readers all the
			// same.
			_ = unix.Shutdown(fd, unix.SHUT_RD)
		}
	}
	p.wg.Wait()
	for _, fd := range []int{p.fd4, p.fd6} {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
}

// Ping sends one echo request to dst and returns the round trip time of
// its reply, or an error when ctx ends first.
func (p *Pinger) Ping(ctx context.Context, dst netip.Addr) (time.Duration, error) {
	dst = dst.Unmap()
	var (
		fd int
		sa unix.Sockaddr
	)
	if dst.Is4() {
		fd, sa = p.fd4, &unix.SockaddrInet4{Addr: dst.As4()}
	} else {
		fd, sa = p.fd6, &unix.SockaddrInet6{Addr: dst.As16()}
	}
	if fd < 0 {
		return 0, fmt.Errorf("ping %s: no IPv6", dst)
	}
	got := make(chan time.Time, 1)
	p.mu.Lock()
	p.seq++
	w := waiter{from: dst, seq: p.seq}
	p.waiting[w] = got
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.waiting, w)
		p.mu.Unlock()
	}()
	sent := time.Now()
	if err := unix.Sendto(fd, EchoRequest(dst.Is6(), p.id, w.seq), 0, sa); err != nil {
		return 0, fmt.Errorf("ping %s: %w", dst, err)
	}
	select {
	case at := <-got:
		return at.Sub(sent), nil
	case <-ctx.Done():
		return 0, fmt.Errorf("ping %s: no reply: %w", dst, context.Cause(ctx))
	}
}

func (p *Pinger) read(fd int) {
	defer p.wg.Done()
	buf := make([]byte, 1500)
	for {
		select {
		case <-p.done:
			return
		default:
		}
		n, from, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				continue
			}
			return
		}
		at := time.Now()
		src, id, seq, ok := ParseEchoReply(buf[:n], from)
		if !ok || id != p.id {
			continue
		}
		p.mu.Lock()
		if ch := p.waiting[waiter{src, seq}]; ch != nil {
			select {
			case ch <- at:
			default:
			}
		}
		p.mu.Unlock()
	}
}

// attachReplyFilter attaches to the raw socket fd a classic BPF filter
// that accepts echo replies whose identifier is id and drops the rest.
// IPv4 raw sockets see the IP header (of variable length); IPv6 ones the
// ICMPv6 message alone.
func attachReplyFilter(fd int, v6 bool, id uint16) error {
	const accept, drop = 0xffff, 0
	// X is where the ICMP message starts.
	start, reply := bpf.Instruction(bpf.LoadMemShift{Off: 0}), uint32(0) // past the IPv4 header
	if v6 {
		start, reply = bpf.LoadConstant{Dst: bpf.RegX, Val: 0}, 129
	}
	prog := []bpf.Instruction{
		start,
		bpf.LoadIndirect{Off: 0, Size: 1},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: reply, SkipFalse: 3},
		bpf.LoadIndirect{Off: 4, Size: 2},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(id), SkipFalse: 1},
		bpf.RetConstant{Val: accept},
		bpf.RetConstant{Val: drop},
	}
	raw, err := bpf.Assemble(prog)
	if err != nil {
		return err
	}
	filter := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		filter[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	return unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]})
}

// EchoRequest is an ICMP (or, v6, ICMPv6) echo request message.
func EchoRequest(v6 bool, id, seq uint16) []byte {
	msg := make([]byte, 16)
	msg[0] = 8 // echo request
	if v6 {
		msg[0] = 128
	}
	binary.BigEndian.PutUint16(msg[4:], id)
	binary.BigEndian.PutUint16(msg[6:], seq)
	copy(msg[8:], "cellium!")
	if !v6 {
		// The kernel computes the ICMPv6 checksum; ICMPv4 is ours.
		binary.BigEndian.PutUint16(msg[2:], checksum(msg))
	}
	return msg
}

// ParseEchoReply reads an echo reply read from a raw socket (IPv4 raw
// sockets read the IP header too): who sent it, its identifier and
// sequence number; ok is false for anything else.
func ParseEchoReply(pkt []byte, from unix.Sockaddr) (src netip.Addr, id, seq uint16, ok bool) {
	replyType := byte(0)
	switch sa := from.(type) {
	case *unix.SockaddrInet4:
		if len(pkt) < 20 {
			return src, 0, 0, false
		}
		src = netip.AddrFrom4(sa.Addr)
		pkt = pkt[int(pkt[0]&0x0f)*4:]
	case *unix.SockaddrInet6:
		src = netip.AddrFrom16(sa.Addr)
		replyType = 129
	default:
		return src, 0, 0, false
	}
	if len(pkt) < 8 || pkt[0] != replyType {
		return src, 0, 0, false
	}
	return src, binary.BigEndian.Uint16(pkt[4:]), binary.BigEndian.Uint16(pkt[6:]), true
}

func checksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}
