package main

import (
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cellium/cellium/cells/loader/socklbtest"
)

// TestRestartUnderLoad restarts the agent while clients connect to every
// one of its Services, round after round: not one connection fails, not
// while the agent is down, nor while the new one restores and syncs; and
// the new agent reports ready only once its frontends are back in the maps.
func TestRestartUnderLoad(t *testing.T) {
	requireRoot(t)
	const services = 200
	sock := socklbtest.New(t)
	env := newAgentEnv(t)
	env.cgroup = sock.Cgroup
	manifests := t.TempDir()
	flags := append(env.runFlags(), "--k8s-manifests-dir", manifests)

	be := netip.MustParseAddrPort
	sock.ServeTCP(be("127.0.0.2:8080"), be("127.0.0.3:8080"), be("127.0.0.4:8080"))
	var all strings.Builder
	var calls []socklbtest.Call
	for i := range services {
		ip := netip.AddrFrom4([4]byte{10, 96, 1 + byte(i/250), 1 + byte(i%250)})
		all.WriteString(svc{name: fmt.Sprintf("s%d", i), clusterIP: ip.String(), port: 80, proto: "TCP", targetPort: 8080,
			backends: []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"}}.manifest())
		all.WriteString("---\n")
		calls = append(calls, socklbtest.Call{Op: socklbtest.TCP, To: netip.AddrPortFrom(ip, 80)})
	}
	writeManifest(t, manifests, "services.yaml", all.String())

	agent := startAgent(t, flags...)
	agent.waitFor("Started hive")
	drain(agent)
	waitAgentReady(t, "the agent", env.socket, time.Minute)

	// The load: every Service once per round, until told to stop.
	type round struct {
		start, end time.Time
		failed     []string
	}
	var (
		mu     sync.Mutex
		rounds []round
		stop   = make(chan struct{})
		done   = make(chan struct{})
	)
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			r := round{start: time.Now()}
			for _, res := range sock.Run(calls...) {
				if res.Errno != "" || res.Backend == "" {
					r.failed = append(r.failed, res.String())
				}
			}
			r.end = time.Now()
			mu.Lock()
			rounds = append(rounds, r)
			mu.Unlock()
		}
	}()
	roundsSince := func(t0 time.Time) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, r := range rounds {
			if r.start.After(t0) {
				n++
			}
		}
		return n
	}
	waitRounds := func(t0 time.Time, n int) {
		t.Helper()
		poll(t, fmt.Sprintf("%d rounds of connects", n), func() (bool, string) { return roundsSince(t0) >= n, "" })
	}

	waitRounds(time.Now(), 2)
	agent.stop()
	down := time.Now()
	waitRounds(down, 2) // served by the pinned maps and programs alone

	restarted := time.Now()
	agent = startAgent(t, flags...)
	agent.waitFor("Started hive")
	drain(agent)
	// Until ready, the probe says 503; once it says 200, every frontend is
	// in the maps (the lb-frontends-reconciled barrier).
	poll(t, "the restarted agent ready", func() (bool, string) {
		code, body := readyz(env.healthAddr)
		return code == http.StatusOK, fmt.Sprint(code, " ", body)
	})
	waitDump(t, env.socket, "cellium_lb4_services", "10.96.1.200:80")
	waitRounds(time.Now(), 2)
	close(stop)
	<-done

	// The load has stopped: rounds is the loader's no more.
	var failed []string
	for _, r := range rounds {
		failed = append(failed, r.failed...)
	}
	if len(failed) > 0 {
		t.Fatalf("%d of %d connects failed across the restart; first: %s", len(failed), len(rounds)*services, failed[0])
	}
	t.Logf("%d rounds of %d connects, %d while the agent was down, %d from its restart on, none failed",
		len(rounds), services, roundsSince(down)-roundsSince(restarted), roundsSince(restarted))
}

// drain reads the agent's log from now on, so that it never blocks on a
// full pipe.
func drain(p *agentProc) {
	go func() {
		for range p.logs {
		}
	}()
}
