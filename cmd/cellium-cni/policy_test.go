package main

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/pkg/apiv1"
	"github.com/cellium/cellium/pkg/nettest"
)

// policyManifests are the pods of TestPolicyBeforeReady and two policies:
// nothing may reach pod "denied"; pod "allowed" takes TCP 8080 from pod
// "client".
const policyManifests = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all, namespace: default}
spec:
  podSelector: {matchLabels: {app: denied}}
  policyTypes: [Ingress]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-client, namespace: default}
spec:
  podSelector: {matchLabels: {app: allowed}}
  ingress:
  - from:
    - podSelector: {matchLabels: {app: client}}
    ports:
    - {port: 8080}
`

// probe is one TCP connection attempt from the network namespace the
// caller's thread is in.
func probe(dst netip.AddrPort, timeout time.Duration) (connected bool, err error) {
	c, err := net.DialTimeout("tcp", dst.String(), timeout)
	if err != nil {
		return false, err
	}
	c.Close()
	return true, nil
}

// TestPolicyBeforeReady: a pod's CNI ADD returns only once its policy is
// in the datapath. A pod that a default-deny policy selects is never
// reached, not even by a client that connects over and over while its ADD
// runs (a server listens in its namespace before the ADD starts); a pod
// whose policy allows the client is reached by the first connection after
// its ADD returns, within a timeout shorter than TCP's first
// retransmission, so a dropped SYN fails it. `agent endpoint list -o json`
// shows each endpoint's policy.
func TestPolicyBeforeReady(t *testing.T) {
	n := newNode(t)
	// IPv4 alone, a fresh agent: addresses go in order, so the test knows
	// the next pod's address before its ADD.
	n.podCIDR = n.v4.String()
	manifests := t.TempDir()
	const nodeName = "cellium-policy"
	objects := policyManifests
	for _, name := range []string{"client", "denied", "allowed"} {
		objects += fmt.Sprintf("---\napiVersion: v1\nkind: Pod\nmetadata: {name: %[1]s, namespace: default, labels: {app: %[1]s}}\n"+
			"spec: {nodeName: %s, containers: [{name: c, image: c}]}\n", name, nodeName)
	}
	if err := os.WriteFile(filepath.Join(manifests, "objects.yaml"), []byte(objects), 0o644); err != nil {
		t.Fatal(err)
	}
	n.start("--k8s-manifests-dir", manifests, "--node-name", nodeName)

	client := n.newPod("client")
	client4, _ := n.add(client)

	// The denied pod: its server listens before its ADD, and the client
	// opens connections to its coming address, a new one every 2 ms, from
	// before the ADD until 300 ms after it returned.
	denied := n.newPod("denied")
	nettest.Serve(t, denied.ns.Path(), "0.0.0.0:8080", nettest.Echo)
	deniedAddr := netip.AddrPortFrom(client4.Next(), 8080)
	var racer synRacer
	probing := make(chan error, 1)
	go func() {
		probing <- nettest.Do(client.ns.Path(), func() error { return racer.run(deniedAddr) })
	}()
	select {
	case <-racer.started():
	case err := <-probing:
		t.Fatalf("the client stopped probing before the ADD: %v", err)
	}
	got4, _ := n.add(denied)
	racer.stop()
	if err := <-probing; err != nil {
		t.Fatalf("probing: %v", err)
	}
	if got4 != deniedAddr.Addr() {
		t.Fatalf("pod denied got %s, the test probed %s", got4, deniedAddr.Addr())
	}
	if racer.connected > 0 {
		t.Fatalf("the client reached pod denied, which a default-deny policy selects: %s", &racer)
	}
	t.Logf("connections to pod denied: %s", &racer)

	// The allowed pod: the first connection after its ADD goes through.
	allowed := n.newPod("allowed")
	nettest.Serve(t, allowed.ns.Path(), "0.0.0.0:8080", nettest.Echo)
	nettest.Serve(t, allowed.ns.Path(), "0.0.0.0:9090", nettest.Echo)
	allowed4, _ := n.add(allowed)
	err := nettest.Do(client.ns.Path(), func() error {
		if _, err := probe(netip.AddrPortFrom(allowed4, 8080), 500*time.Millisecond); err != nil {
			return fmt.Errorf("the first connection to pod allowed's 8080 after its ADD: %w", err)
		}
		// Its policy is enforced: a port it does not allow is not reached.
		if ok, _ := probe(netip.AddrPortFrom(allowed4, 9090), 500*time.Millisecond); ok {
			return errors.New("the client reached pod allowed's port 9090, which no policy allows")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	policies := map[string]*apiv1.EndpointPolicy{}
	for _, ep := range n.endpoints() {
		policies[ep.PodName] = ep.Policy
	}
	for name, want := range map[string]apiv1.EndpointPolicy{
		"client":  {Realized: true},
		"denied":  {Ingress: true, Entries: 1, Realized: true},
		"allowed": {Ingress: true, Entries: 2, Realized: true},
	} {
		got := policies[name]
		if got == nil || got.Ingress != want.Ingress || got.Egress != want.Egress || got.Entries != want.Entries ||
			got.Realized != want.Realized || got.Revision == 0 {
			t.Errorf("pod %s's endpoint policy = %+v, want %+v with a revision", name, got, want)
		}
	}
	out := n.agentCLI("endpoint", "get", denied.id)
	for _, want := range []string{"Policy:", "enforced ingress, revision", "realized", "Policy entries:"} {
		if !strings.Contains(out, want) {
			t.Errorf("agent endpoint get of pod denied does not say %q:\n%s", want, out)
		}
	}
	if t.Failed() {
		t.Logf("agent endpoint list:\n%s", n.agentCLI("endpoint", "list"))
	}
}

// synRacer opens TCP connections to one address, a new one every 2 ms,
// each given up after 300 ms, and counts how they ended.
type synRacer struct {
	mu        sync.Mutex
	first     chan struct{}
	stopped   chan struct{}
	stopOnce  sync.Once
	firstOnce sync.Once

	opened, connected, refused, timedOut, afterStop int
}

func (r *synRacer) init() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.first == nil {
		r.first, r.stopped = make(chan struct{}), make(chan struct{})
	}
}

func (r *synRacer) started() <-chan struct{} { r.init(); return r.first }

// stop ends the racing 300 ms later: connections opened until then still
// count.
func (r *synRacer) stop() { r.init(); r.stopOnce.Do(func() { close(r.stopped) }) }

func (r *synRacer) String() string {
	return fmt.Sprintf("%d opened (%d after the ADD returned): %d connected, %d refused or unreachable, %d timed out",
		r.opened, r.afterStop, r.connected, r.refused, r.timedOut)
}

// run races on the calling thread, whose namespace the sockets are made
// in, until 300 ms after stop.
func (r *synRacer) run(dst netip.AddrPort) error {
	r.init()
	const interval, giveUp = 2 * time.Millisecond, 300 * time.Millisecond
	type conn struct {
		fd     int
		opened time.Time
	}
	var open []conn
	defer func() {
		for _, c := range open {
			unix.Close(c.fd)
		}
	}()
	var end time.Time
	sa := &unix.SockaddrInet4{Port: int(dst.Port()), Addr: dst.Addr().As4()}
	for {
		now := time.Now()
		select {
		case <-r.stopped:
			if end.IsZero() {
				end = now.Add(giveUp)
			}
		default:
		}
		if !end.IsZero() && now.After(end) && len(open) == 0 {
			return nil
		}
		if end.IsZero() || now.Before(end) {
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				return err
			}
			if err := unix.Connect(fd, sa); err != nil && !errors.Is(err, unix.EINPROGRESS) {
				unix.Close(fd)
				r.refused++
			} else {
				open = append(open, conn{fd, now})
			}
			r.opened++
			if !end.IsZero() {
				r.afterStop++
			}
			r.firstOnce.Do(func() { close(r.first) })
		}
		fds := make([]unix.PollFd, len(open))
		for i, c := range open {
			fds[i] = unix.PollFd{Fd: int32(c.fd), Events: unix.POLLOUT}
		}
		if _, err := unix.Poll(fds, int(interval/time.Millisecond)); err != nil && !errors.Is(err, unix.EINTR) {
			return err
		}
		keep := open[:0]
		for i, c := range open {
			switch {
			case fds[i].Revents != 0:
				soErr, err := unix.GetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_ERROR)
				if err == nil && soErr == 0 {
					r.connected++
				} else {
					r.refused++
				}
				unix.Close(c.fd)
			case time.Since(c.opened) > giveUp:
				r.timedOut++
				unix.Close(c.fd)
			default:
				keep = append(keep, c)
			}
		}
		open = keep
	}
}
