package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// BenchmarkAdd is the latency of a CNI ADD, from the runtime's exec of the
// built plugin to its result, against the built agent: addresses, veth
// pair, routes, two fsynced state files. The pods' namespaces are made
// outside the timer.
//
//	go test -run '^$' -bench Add -benchtime 200x ./cmd/cellium-cni
func BenchmarkAdd(b *testing.B) {
	n := newNode(b)
	n.podCIDR = n.v6.Addr().String() + "/112"
	n.start()
	conf := n.pluginConf("1.0.0")
	var latencies []time.Duration
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		p := n.newPod(fmt.Sprintf("b%d", i))
		env := map[string]string{"CNI_COMMAND": "ADD", "CNI_CONTAINERID": p.id, "CNI_NETNS": p.ns.Path(), "CNI_IFNAME": "eth0"}
		b.StartTimer()
		start := time.Now()
		if _, cniErr := cniExec(b, env, conf); cniErr != nil {
			b.Fatalf("ADD: %+v", cniErr)
		}
		latencies = append(latencies, time.Since(start))
	}
	slices.Sort(latencies)
	b.ReportMetric(float64(latencies[len(latencies)/2].Microseconds())/1000, "ms/add-median")
	b.ReportMetric(float64(latencies[len(latencies)*99/100].Microseconds())/1000, "ms/add-p99")
}

// BenchmarkRestore is how long the agent takes, after kill -9, to restore
// N endpoints: "restore-ms" is the restore itself (reading the state
// files, claiming the addresses, checking every veth pair, address and
// route), "ready-ms" the time from the exec of the agent until it has
// started and restored.
//
//	go test -run '^$' -bench Restore -benchtime 5x ./cmd/cellium-cni
func BenchmarkRestore(b *testing.B) {
	for _, count := range []int{20, 1000} {
		b.Run(fmt.Sprintf("endpoints=%d", count), func(b *testing.B) {
			n := newNode(b)
			// IPv6 only: a /112 holds a thousand pods.
			n.podCIDR = n.v6.Addr().String() + "/112"
			n.start()
			conf := n.pluginConf("1.0.0")
			for i := range count {
				p := n.newPod(fmt.Sprintf("r%d", i))
				env := map[string]string{"CNI_COMMAND": "ADD", "CNI_CONTAINERID": p.id, "CNI_NETNS": p.ns.Path(), "CNI_IFNAME": "eth0"}
				if _, cniErr := cniExec(b, env, conf); cniErr != nil {
					b.Fatalf("ADD %d: %+v", i, cniErr)
				}
			}
			var restore, ready []float64
			for b.Loop() {
				n.kill()
				start := time.Now()
				a := n.start()
				ready = append(ready, float64(time.Since(start).Microseconds())/1000)
				restore = append(restore, msOf(a.restored["duration"]))
				if got := a.restored["restored"]; got != float64(count) {
					b.Fatalf("restored %v endpoints, want %d", got, count)
				}
			}
			b.ReportMetric(median(restore), "restore-ms")
			b.ReportMetric(median(ready), "ready-ms")
		})
	}
}

func median(xs []float64) float64 {
	slices.Sort(xs)
	return xs[len(xs)/2]
}

// BenchmarkAddParallel is CNI ADD as a node sees it when a deployment
// scales up: -cni.pods pods (100) whose ADDs the runtime runs at once, each
// an exec of the built plugin against the built agent. It prints
//
//	cni-bench pods=100 add_p50_ms=... add_p99_ms=... agent_cpu_ms_per_1000_pods=... agent_rss_mb_per_1000_pods=...
//
// with the agent's CPU time (user and system) and resident set growth over
// the ADDs, scaled to 1,000 pods. The pods' namespaces are made first.
//
//	go test -run '^$' -bench AddParallel -benchtime 1x ./cmd/cellium-cni
func BenchmarkAddParallel(b *testing.B) {
	pods := *benchPods
	for range b.N {
		b.StopTimer()
		n := newNode(b)
		// IPv6 only: a /112 holds every pod.
		n.podCIDR = n.v6.Addr().String() + "/112"
		n.start()
		conf := n.pluginConf("1.0.0")
		ps := make([]*pod, pods)
		for i := range ps {
			ps[i] = n.newPod(fmt.Sprintf("p%d", i))
		}
		pid := n.agent.cmd.Process.Pid
		cpuBefore, rssBefore := procCPU(b, pid), procRSS(b, pid)
		latencies := make([]time.Duration, pods)
		errs := make(chan error, pods)
		var wg sync.WaitGroup
		b.StartTimer()
		for i, p := range ps {
			wg.Go(func() {
				env := map[string]string{"CNI_COMMAND": "ADD", "CNI_CONTAINERID": p.id, "CNI_NETNS": p.ns.Path(), "CNI_IFNAME": "eth0"}
				start := time.Now()
				if out, err := runPlugin(env, conf); err != nil {
					errs <- fmt.Errorf("ADD of %s: %v: %s", p.name, err, out)
					return
				}
				latencies[i] = time.Since(start)
			})
		}
		wg.Wait()
		b.StopTimer()
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
		cpu, rss := procCPU(b, pid)-cpuBefore, procRSS(b, pid)-rssBefore
		slices.Sort(latencies)
		perThousand := 1000 / float64(pods)
		fmt.Printf("cni-bench pods=%d add_p50_ms=%.1f add_p99_ms=%.1f agent_cpu_ms_per_1000_pods=%.0f agent_rss_mb_per_1000_pods=%.1f\n",
			pods, ms(latencies[pods/2]), ms(latencies[(pods*99+99)/100-1]), ms(cpu)*perThousand, rss*perThousand)
	}
}

var benchPods = flag.Int("cni.pods", 100, "Pods whose CNI ADDs BenchmarkAddParallel runs at once")

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// runPlugin execs the built plugin; unlike cniExec it may run on any
// goroutine.
func runPlugin(env map[string]string, stdin []byte) ([]byte, error) {
	cmd := exec.Command(filepath.Join(binDir, "cellium-cni"))
	cmd.Env = []string{"CNI_PATH=" + binDir, "PATH=/usr/bin:/bin"}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stdin = bytes.NewReader(stdin)
	return cmd.Output()
}

// procCPU is a process's user and system CPU time so far.
func procCPU(b *testing.B, pid int) time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// The fields after the command name, which is in parentheses.
	fields := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+2:]))
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	// Clock ticks: USER_HZ is 100 on Linux.
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// procRSS is a process's resident set in MiB.
func procRSS(b *testing.B, pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb / 1024
		}
	}
	b.Fatal("no VmRSS in /proc/PID/status")
	return 0
}
