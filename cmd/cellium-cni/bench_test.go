package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cellium/cellium/pkg/nettest"
	"github.com/cellium/cellium/pkg/procstat"
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
// an exec of the built plugin against the built agent, beside its floor in
// the same run: as many execs at once of a Go plugin that does nothing
// (floor_), and after them the kernel's part alone (kernel_: the veth
// pairs, addresses and routes the ADDs make, as many at once, see
// kernelFloor). Before them, on the idle node, -cni.single ADDs (20) one after
// another (single_). It prints, then, for the parallel ADDs, when each
// live condition held in the agent's wait (endpoint-map, programs, policy;
// from the start of the wait, as the agent logs them) and how long each
// step of their creation in the agent took (createSteps),
//
//	cni-bench pods=100 add_p50_ms=... add_p99_ms=... floor_p50_ms=... floor_p99_ms=... p99_over_floor=... kernel_p50_ms=... kernel_p99_ms=... single_add_p50_ms=... single_add_p99_ms=... agent_cpu_ms_per_1000_pods=... agent_rss_mb_per_1000_pods=... load1=...
//	cni-live-bench pods=100 endpoint-map_p50_ms=... endpoint-map_p99_ms=... policy_p50_ms=... ... programs_p99_ms=...
//	cni-steps-bench pods=100 netns_p50_ms=... netns_p99_ms=... identity_p50_ms=... ... ready_p99_ms=...
//	cni-breakdown-bench pods=100 cpu_bound_ms=... floor_cpu_bound_ms=... kernel_cpu_bound_ms=... plugin_cpu_p50_ms=... ... in_agent_p50_ms=... in_agent_p99_ms=... outside_agent_p50_ms=... outside_agent_p99_ms=... exec_init_p50_ms=... ... exit_p99_ms=... netlink_per_add=... fsync_per_add=... rtm_getlink=... ...
//
// The breakdown has the CPU bound of the parallel ADDs (their plugins' and
// the agent's CPU time over the cores: no p99 is under it), of the floor
// and of the kernel floor (this process's CPU time while it made them),
// and the CPU time of each plugin's exec and the floor's; it splits each
// parallel ADD into its time in the agent's
// creation (the sum of its steps) and the rest (the plugin's exec and
// start, the API round trip), that rest into its phases from the plugin's
// trace (TraceEnv) and the agent's log line (addPhases: exec_init, request,
// to_handler with agent_queued, handler, response, result, exit), and
// counts, over -cni.count-adds (5) ADDs one
// after another under strace at the end, the agent's netlink requests (by
// type) and syncs per ADD; without strace the benchmark skips there.
//
// with the agent's CPU time (user and system) and resident set growth over
// the parallel ADDs, scaled to 1,000 pods, and the load average when it
// started and when it ended. The pods' namespaces are made first.
// -cni.agent-bins OLD,NEW measures each agent binary so, one after the
// other in one run (agent= on each line), and -cni.plugin-bins OLD,NEW each
// plugin binary so with each agent (plugin=; a plugin without the trace
// leaves its phases out). -cni.profile-dir DIR runs the
// agent with --pprof and writes its CPU profile over the parallel ADDs
// (parallel-cpu.pb.gz) and over the single ones (single-cpu.pb.gz).
//
//	go test -run '^$' -bench AddParallel -benchtime 1x ./cmd/cellium-cni
func BenchmarkAddParallel(b *testing.B) {
	bins := []string{""}
	if *benchAgentBins != "" {
		bins = strings.Split(*benchAgentBins, ",")
	}
	plugins := []string{filepath.Join(binDir, "cellium-cni")}
	if *benchPluginBins != "" {
		plugins = strings.Split(*benchPluginBins, ",")
	}
	for range b.N {
		for _, bin := range bins {
			for _, plugin := range plugins {
				addParallel(b, bin, plugin)
			}
		}
	}
}

// addParallel is one measurement of BenchmarkAddParallel with the agent
// binary bin ("" the one built for the tests) and the plugin binary plugin.
func addParallel(b *testing.B, bin, plugin string) {
	pods, single := *benchPods, *benchSingle
	b.StopTimer()
	load := procstat.LoadAverage()
	n := newNode(b)
	n.agentBin = bin
	agentName := "built"
	if bin != "" {
		agentName = filepath.Base(bin)
	}
	// Each line names its agent and, with -cni.plugin-bins, its plugin.
	names := "agent=" + agentName
	if *benchPluginBins != "" {
		names += " plugin=" + filepath.Base(plugin)
	}
	noop := filepath.Join(binDir, "noop-plugin")
	// IPv6 only: a /112 holds every pod.
	n.podCIDR = n.v6.Addr().String() + "/112"
	var extra []string
	if *benchProfileDir != "" {
		extra = append(extra, "--pprof")
	}
	n.start(extra...)
	conf := n.pluginConf("1.0.0")
	ps := make([]*pod, pods)
	for i := range ps {
		ps[i] = n.newPod(fmt.Sprintf("p%d", i))
	}
	kernelPods := make([]*pod, pods)
	for i := range kernelPods {
		kernelPods[i] = n.newPod(fmt.Sprintf("k%d", i))
	}
	singles := make([]*pod, single)
	for i := range singles {
		singles[i] = n.newPod(fmt.Sprintf("s%d", i))
	}
	counted := make([]*pod, *benchCountAdds)
	for i := range counted {
		counted[i] = n.newPod(fmt.Sprintf("c%d", i))
	}
	env := func(p *pod) map[string]string {
		return map[string]string{"CNI_COMMAND": "ADD", "CNI_CONTAINERID": p.id, "CNI_NETNS": p.ns.Path(), "CNI_IFNAME": "eth0"}
	}

	// One at a time on the idle node.
	stopProfile := n.cpuProfile(b, "single-cpu.pb.gz")
	singleLat := make([]time.Duration, 0, single)
	for _, p := range singles {
		start := time.Now()
		if out, err := runPlugin(plugin, env(p), conf); err != nil {
			b.Fatalf("ADD of %s: %v: %s", p.name, err, out)
		}
		singleLat = append(singleLat, time.Since(start))
	}
	stopProfile()

	// The floor: the plugin that does nothing, as many at once.
	floorRuns := make([]pluginRun, pods)
	floor := parallel(b, pods, func(i int) (err error) {
		floorRuns[i], err = runPluginTimed(noop, env(ps[i]), conf)
		if err != nil {
			return fmt.Errorf("noop plugin: %v", err)
		}
		return nil
	})

	pid := n.agent.cmd.Process.Pid
	cpuBefore, rssBefore := procCPU(b, pid), procRSS(b, pid)
	stopProfile = n.cpuProfile(b, "parallel-cpu.pb.gz")
	b.StartTimer()
	runs := make([]pluginRun, pods)
	latencies := parallel(b, pods, func(i int) (err error) {
		runs[i], err = runPluginTimed(plugin, env(ps[i]), conf)
		if err != nil {
			return fmt.Errorf("ADD of %s: %v", ps[i].name, err)
		}
		return nil
	})
	b.StopTimer()
	stopProfile()
	cpu, rss := procCPU(b, pid)-cpuBefore, procRSS(b, pid)-rssBefore
	// The kernel's part alone, as many at once, in the /112 after the
	// pods'.
	next := n.v6.Addr().As16()
	next[13]++
	// This process's CPU time meanwhile is the kernel's (system time in
	// its netlink calls), nearly all.
	selfBefore := procCPU(b, os.Getpid())
	kernel := kernelFloor(b, n.ns.Path(), kernelPods, netip.PrefixFrom(netip.AddrFrom16(next), 112))
	kernelCPU := procCPU(b, os.Getpid()) - selfBefore
	// When, in each parallel ADD's wait for its endpoint to be live, each
	// condition held: the agent logs them with the endpoint.
	live, steps := map[string][]time.Duration{}, map[string][]time.Duration{}
	parallelIDs := map[string]int{}
	for i, p := range ps {
		parallelIDs[p.id] = i
	}
	// Each ADD's time in the agent's creation (its steps, from the
	// request's arrival in the endpoint manager to its answer) and
	// outside it (the plugin's exec and start, the API round trip), and
	// that split into its phases (addPhases) where the plugin and the
	// agent say when each began.
	var inAgent, outside []time.Duration
	phases := map[string][]time.Duration{}
	for _, line := range n.agent.lines("Created endpoint") {
		i, ok := parallelIDs[fmt.Sprint(line["container"])]
		if !ok {
			continue
		}
		for group, into := range map[string]map[string][]time.Duration{"live": live, "steps": steps} {
			durations, _ := line[group].(map[string]any)
			for name, v := range durations {
				into[name] = append(into[name], time.Duration(msOf(v)*float64(time.Millisecond)))
			}
		}
		var created time.Duration
		for _, v := range line["steps"].(map[string]any) {
			created += time.Duration(msOf(v) * float64(time.Millisecond))
		}
		inAgent = append(inAgent, created)
		outside = append(outside, latencies[i]-created)
		addPhases(phases, runs[i], line, created)
	}
	// The system calls of a few ADDs one after another, under strace
	// (which slows them: no latency is taken from these).
	calls := countCalls(b, pid, func() {
		for _, p := range counted {
			if out, err := runPlugin(plugin, env(p), conf); err != nil {
				b.Fatalf("ADD of %s: %v: %s", p.name, err, out)
			}
		}
	})
	perThousand := 1000 / float64(pods)
	p99 := percentile(latencies, 99)
	fmt.Printf("cni-bench pods=%d add_p50_ms=%.1f add_p99_ms=%.1f floor_p50_ms=%.1f floor_p99_ms=%.1f p99_over_floor=%.2f "+
		"kernel_p50_ms=%.1f kernel_p99_ms=%.1f "+
		"single_add_p50_ms=%.1f single_add_p99_ms=%.1f agent_cpu_ms_per_1000_pods=%.0f agent_rss_mb_per_1000_pods=%.1f load1=%s load1_end=%s %s\n",
		pods, ms(percentile(latencies, 50)), ms(p99), ms(percentile(floor, 50)), ms(percentile(floor, 99)),
		float64(p99)/float64(percentile(floor, 99)), ms(percentile(kernel, 50)), ms(percentile(kernel, 99)),
		ms(percentile(singleLat, 50)), ms(percentile(singleLat, 99)),
		ms(cpu)*perThousand, rss*perThousand, load, procstat.LoadAverage(), names)
	fmt.Printf("cni-live-bench pods=%d %s %s\n", len(live["policy"]), percentiles(live, slices.Sorted(maps.Keys(live))), names)
	fmt.Printf("cni-steps-bench pods=%d %s %s\n", len(steps["live"]), percentiles(steps, createSteps), names)
	phases["in_agent"], phases["outside_agent"] = inAgent, outside
	// The CPU bound: the parallel ADDs' CPU time (the plugins' and the
	// agent's) spread over every core, under which no p99 can be; and the
	// floor's.
	var addCPU, floorCPU time.Duration
	for i := range pods {
		phases["plugin_cpu"] = append(phases["plugin_cpu"], runs[i].cpu)
		phases["floor_cpu"] = append(phases["floor_cpu"], floorRuns[i].cpu)
		addCPU += runs[i].cpu
		floorCPU += floorRuns[i].cpu
	}
	cores := time.Duration(runtime.NumCPU())
	fmt.Printf("cni-breakdown-bench pods=%d cpu_bound_ms=%.1f floor_cpu_bound_ms=%.1f kernel_cpu_bound_ms=%.1f %s %s %s\n", len(inAgent),
		ms((addCPU+cpu)/cores), ms(floorCPU/cores), ms(kernelCPU/cores), percentiles(phases, breakdownPhases), calls.perAdd(len(counted)), names)
	// The next binary's measurement on a quiet node.
	n.kill()
}

// breakdownPhases are the parts of a parallel ADD in the breakdown line:
// the plugin's CPU time (user and system) in each exec, and the floor
// plugin's in each of its, which the load changes less than latencies; its
// time in the agent's creation and outside it, and the phases of each ADD
// in order (addPhases), which add up to the ADD.
var breakdownPhases = []string{"plugin_cpu", "floor_cpu", "in_agent", "outside_agent", "exec_init", "request", "to_handler", "agent_queued", "handler", "response", "result", "exit"}

func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// addPhases adds to phases the phases of one ADD, run, whose creation the
// agent logged in line and took created in its steps. From the plugin's
// trace (TraceEnv) and the request's times in the agent's line (its
// clock is the same), one after the other:
//
//	exec_init   the exec until main (the fork and exec, the runtime's
//	            start and the packages' initialization)
//	request     main until the request is written (the configuration,
//	            the connection)
//	to_handler  the request written until the agent's handler begins
//	            (waiting to be accepted, then agent_queued: from the
//	            later of the request written and the connection
//	            accepted, the agent reading and parsing it; the agent
//	            often accepts before the plugin has written)
//	handler     the handler until the creation's first step (decoding,
//	            the wait for the restore)
//	(in_agent)  the creation's steps
//	response    the creation's end until the answer's status line is in
//	            the plugin (the handler's answer, written, read)
//	result      the answer until the result is printed
//	exit        the result printed until the process is reaped
//
// A plugin or agent that does not say leaves its phases out.
func addPhases(phases map[string][]time.Duration, run pluginRun, line map[string]any, created time.Duration) {
	req, _ := line["request"].(map[string]any)
	acceptedText, _ := req["accepted"].(string)
	accepted, err := time.Parse(time.RFC3339Nano, acceptedText)
	if err != nil || run.trace == nil {
		return
	}
	queued := time.Duration(msOf(req["queued"]) * float64(time.Millisecond))
	handler := time.Duration(msOf(req["handler"]) * float64(time.Millisecond))
	handled := accepted.Add(queued)
	stepsEnd := handled.Add(handler + created)
	t := run.trace
	for name, d := range map[string]time.Duration{
		"exec_init":    t["main"].Sub(run.start),
		"request":      t["sent"].Sub(t["main"]),
		"to_handler":   handled.Sub(t["sent"]),
		"agent_queued": handled.Sub(latest(accepted, t["sent"])),
		"handler":      handler,
		"response":     t["answered"].Sub(stepsEnd),
		"result":       t["printed"].Sub(t["answered"]),
		"exit":         run.exited.Sub(t["printed"]),
	} {
		phases[name] = append(phases[name], d)
	}
}

// pluginRun is one exec of a plugin: when the exec began and when the
// process was reaped, and the times the plugin wrote in its trace
// (TraceEnv: main, sent, answered, printed), nil if it wrote none.
type pluginRun struct {
	start, exited time.Time
	trace         map[string]time.Time
	// cpu is the process's user and system time.
	cpu time.Duration
}

// runPluginTimed execs the plugin at path with TraceEnv set, as runPlugin,
// and reads its trace from its stderr.
func runPluginTimed(path string, env map[string]string, stdin []byte) (pluginRun, error) {
	cmd := pluginCmd(path, env, stdin)
	cmd.Env = append(cmd.Env, TraceEnv+"=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	run := pluginRun{start: time.Now()}
	err := cmd.Run()
	run.exited = time.Now()
	if cmd.ProcessState != nil {
		run.cpu = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	}
	if err != nil {
		return run, fmt.Errorf("%v: %s %s", err, stdout.String(), stderr.String())
	}
	for l := range strings.Lines(stderr.String()) {
		fields, ok := strings.CutPrefix(strings.TrimSpace(l), "cellium-cni trace: ")
		if !ok {
			continue
		}
		run.trace = map[string]time.Time{}
		for f := range strings.FieldsSeq(fields) {
			k, v, _ := strings.Cut(f, "=")
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return run, fmt.Errorf("trace %q: %v", l, err)
			}
			run.trace[k] = time.Unix(0, n)
		}
	}
	return run, nil
}

// createSteps are the steps of a creation in the agent, in order, as it
// logs them with the endpoint ("steps").
var createSteps = []string{"netns", "identity", "lock", "ipam", "state", "veth", "programs", "insert", "live", "route", "state-ready", "ready"}

// percentiles are the p50 and p99 of each of names in ds, as name_p50_ms=
// and name_p99_ms=; names without figures are left out.
func percentiles(ds map[string][]time.Duration, names []string) string {
	var out []string
	for _, name := range names {
		if len(ds[name]) == 0 {
			continue
		}
		out = append(out, fmt.Sprintf("%s_p50_ms=%.1f %s_p99_ms=%.1f", name, ms(percentile(ds[name], 50)), name, ms(percentile(ds[name], 99))))
	}
	return strings.Join(out, " ")
}

// parallel runs fn(0..count-1) at once and returns how long each took.
func parallel(b *testing.B, count int, fn func(i int) error) []time.Duration {
	latencies := make([]time.Duration, count)
	errs := make(chan error, count)
	var wg sync.WaitGroup
	for i := range count {
		wg.Go(func() {
			start := time.Now()
			if err := fn(i); err != nil {
				errs <- err
				return
			}
			latencies[i] = time.Since(start)
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	return latencies
}

// percentile is the p-th percentile of ds, the smallest value at or above
// p% of them.
func percentile(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[(len(s)*p+99)/100-1]
}

// cpuProfile starts a CPU profile of the agent (with -cni.profile-dir, which
// runs it with --pprof) over the next 5 s, and returns what waits for it
// and writes it to name in that directory.
func (n *node) cpuProfile(b *testing.B, name string) (stop func()) {
	if *benchProfileDir == "" {
		return func() {}
	}
	// The agent serves in the node's namespace: dial there.
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		return nettest.In(n.ns.Path(), func() (net.Conn, error) { return (&net.Dialer{}).DialContext(ctx, network, addr) })
	}}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- func() error {
			// The first 5 s from the start: the ADDs and the agent's work
			// after them.
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+n.healthAddr+"/debug/pprof/profile?seconds=5", nil)
			if err != nil {
				return err
			}
			resp, err := c.Do(req)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			data, err := io.ReadAll(resp.Body)
			if err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(*benchProfileDir, name), data, 0o644)
		}()
	}()
	return func() {
		if err := <-done; err != nil {
			b.Errorf("CPU profile %s: %v", name, err)
		}
		cancel()
	}
}

var (
	benchPods       = flag.Int("cni.pods", 100, "Pods whose CNI ADDs BenchmarkAddParallel runs at once")
	benchSingle     = flag.Int("cni.single", 20, "ADDs BenchmarkAddParallel runs one after another on the idle node first")
	benchAgentBins  = flag.String("cni.agent-bins", "", "Comma-separated agent binaries BenchmarkAddParallel measures one after the other in one run, each line naming its binary (agent=); empty: the one built for the tests")
	benchCountAdds  = flag.Int("cni.count-adds", 5, "ADDs BenchmarkAddParallel runs one after another under strace at the end, to count the agent's netlink requests and syncs per ADD")
	benchProfileDir = flag.String("cni.profile-dir", "", "Run the agent with --pprof and write its CPU profiles of BenchmarkAddParallel's ADDs into this directory")
	benchPluginBins = flag.String("cni.plugin-bins", "", "Comma-separated plugin binaries BenchmarkAddParallel measures one after the other in one run (with each agent of -cni.agent-bins), each line naming its plugin (plugin=); empty: the one built for the tests")
)

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// runPlugin execs the plugin at path; unlike cniExec it may run on any
// goroutine.
func runPlugin(path string, env map[string]string, stdin []byte) ([]byte, error) {
	return pluginCmd(path, env, stdin).Output()
}

// pluginCmd is an exec of the plugin at path as a runtime makes it.
func pluginCmd(path string, env map[string]string, stdin []byte) *exec.Cmd {
	cmd := exec.Command(path)
	cmd.Env = []string{"CNI_PATH=" + binDir, "PATH=/usr/bin:/bin"}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stdin = bytes.NewReader(stdin)
	return cmd
}

// procCPU is a process's user and system CPU time so far.
func procCPU(b *testing.B, pid int) time.Duration {
	d, err := procstat.CPU(pid)
	if err != nil {
		b.Fatal(err)
	}
	return d
}

// procRSS is a process's resident set in MiB.
func procRSS(b *testing.B, pid int) float64 {
	n, err := procstat.RSS(pid)
	if err != nil {
		b.Fatal(err)
	}
	return float64(n) / (1 << 20)
}
