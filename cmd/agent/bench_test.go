package main

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cellium/cellium/cells/k8sclient/k8sclienttest"
	"github.com/cellium/cellium/pkg/client"
	"github.com/cellium/cellium/pkg/polltest"
	"github.com/cellium/cellium/pkg/procstat"
)

var (
	benchIdle     = flag.Duration("bench.idle", 60*time.Second, "How long BenchmarkIdleAgent lets the agent idle before reading its memory")
	benchServices = flag.Int("bench.services", 50000, "Services (each with an EndpointSlice of one endpoint) that BenchmarkScale writes into its manifests directory and BenchmarkScaleCluster creates through the API server")
	benchSettle   = flag.Duration("bench.settle", 20*time.Second, "How long after everything is written BenchmarkScale and BenchmarkScaleCluster read the resident set again")
	benchArgs     = flag.String("bench.agent-args", "", "Flags added to every benchmark's agent command line, separated by spaces (as --gc-percent=100)")
	benchProfile  = flag.String("bench.profile-dir", "", "Run the benchmarks' agent with --pprof and write into this directory its heap profiles and Go memory figures (BenchmarkIdleAgent: when idle, with its smaps; BenchmarkScale and BenchmarkScaleCluster: once everything is written, and settled), and, for the two Scale benchmarks, a CPU profile of each start's first 10 s, its log and readiness answers, and print its readiness timeline")
	benchBins     = flag.String("bench.agent-bins", "", "BenchmarkIdleAgent measures these agent binaries (comma-separated) one after the other instead of the one built from this tree: to compare builds side by side under the same load")
	benchPages    = flag.Int("bench.pages", 0, "BenchmarkIdleAgent prints the executable's resident pages by section, by module and for this many packages (text, type descriptors, pclntab, ... of each; residentpages_test.go)")
)

// BenchmarkIdleAgent is the memory of the built agent with its default
// flags in embedded mode (only its paths are private), after it has been
// ready and idle for -bench.idle. It prints
//
//	agent-idle-bench idle_s=60 rss_mb=... anon_mb=... file_mb=... cgroup_ws_mb=... cgroup_kernel_mb=... binary_mb=... loaded_mb=... go_heap_inuse_mb=... ... goroutines=... load1=...
//
// It measures the agent built as the image has it (without cgo; see
// buildShippedAgent). rss_mb is VmRSS, anon_mb its anonymous part
// (RssAnon: heap, stacks, the runtime's), file_mb the part backed by files
// (RssFile: the binary's pages that ran or were read or were mapped with
// them, and the event ring buffer, whose pages the kernel maps twice).
// binary_mb is the file's size and loaded_mb that of its mapped sections
// (the same as the stripped image binary's). The agent runs in a memory
// cgroup of its own, started with the binary's pages out of the page
// cache as on a node's first start, and cgroup_ws_mb is that cgroup's
// working set: what the kernel charges it less the inactive file pages it
// may reclaim for free, what the kubelet reports for a pod;
// cgroup_kernel_mb is the kernel's memory in it (the BPF maps the agent
// creates, most of it). The go_* figures are how the Go runtime counts
// its memory, read from /metrics after the resident set (goMemory). With
// -bench.profile-dir (which adds --pprof to the
// flags) it also writes
// the agent's /proc smaps and heap profile there. With -bench.pages=N it
// prints which packages the executable's resident pages belong to, the
// top N of them (readResidentPages). With -bench.agent-bins=OLD,NEW it
// measures those binaries one after the other (bin= on each line).
//
//	go test ./cmd/agent -run '^$' -bench IdleAgent -benchtime 1x [-bench.pages=40]
func BenchmarkIdleAgent(b *testing.B) {
	var bins []string
	if *benchBins != "" {
		bins = strings.Split(*benchBins, ",")
	} else {
		bins = []string{buildShippedAgent(b)}
	}
	built := agentBin
	defer func() { agentBin = built }()
	for range b.N {
		for _, bin := range bins {
			agentBin = bin
			idleAgent(b, len(bins) > 1)
		}
	}
}

// idleAgent runs agentBin for BenchmarkIdleAgent and prints its line, with
// the binary's path if named.
func idleAgent(b *testing.B, named bool) {
	env := newAgentEnv(b)
	flags := env.runFlags()
	if *benchProfile != "" {
		flags = append(flags, "--pprof")
	}
	a := startBenchAgent(b, env, true, flags...)
	a.waitReady(b, time.Minute)
	time.Sleep(*benchIdle)
	mem := a.memory(b)
	goMem := a.goMemory(b)
	var pages *residentPages
	if *benchPages > 0 {
		var err error
		if pages, err = readResidentPages(a.cmd.Process.Pid); err != nil {
			b.Fatal(err)
		}
	}
	if *benchProfile != "" {
		if smaps, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", a.cmd.Process.Pid)); err == nil {
			os.MkdirAll(*benchProfile, 0o755)
			os.WriteFile(filepath.Join(*benchProfile, "idle.smaps"), smaps, 0o644)
		}
		a.profile(b, "idle")
	}
	a.stop(b)
	fi, err := os.Stat(agentBin)
	if err != nil {
		b.Fatal(err)
	}
	bin := ""
	if named {
		bin = " bin=" + agentBin
	}
	loaded, err := loadedBytes(agentBin)
	if err != nil {
		b.Fatal(err)
	}
	fmt.Printf("agent-idle-bench%s idle_s=%.0f %s binary_mb=%.1f loaded_mb=%.1f %s load1=%s\n",
		bin, benchIdle.Seconds(), mem, float64(fi.Size())/(1<<20), mib(loaded), goMem, loadAverage())
	if pages != nil {
		pages.write(os.Stdout, *benchPages)
	}
}

// buildShippedAgent builds the agent as the image has it (the Makefile's
// image-bin: CGO_ENABLED=0, -trimpath) but with its symbol table and DWARF,
// which no mapping holds (the loaded sections are the same as the stripped
// image binary's), so that -bench.pages can name what is resident. The
// process tests' agentBin is a cgo build, which maps the C library too.
func buildShippedAgent(b *testing.B) string {
	b.Helper()
	bin := filepath.Join(b.TempDir(), "agent")
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("build the agent as the image has it: %v\n%s", err, out)
	}
	if err := syncFile(bin); err != nil {
		b.Fatal(err)
	}
	return bin
}

// loadedBytes is the size of the executable's sections that are mapped
// (text, read-only data, pclntab, data): what its pages can hold, with or
// without symbols.
func loadedBytes(bin string) (uint64, error) {
	f, err := elf.Open(bin)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var n uint64
	for _, s := range f.Sections {
		if s.Flags&elf.SHF_ALLOC != 0 && s.Type != elf.SHT_NOBITS {
			n += s.Size
		}
	}
	return n, nil
}

// loadAverage is the machine's 1-minute load average, printed beside
// figures that depend on it.
func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.Fields(string(data))[0]
}

// BenchmarkScale runs the built agent in embedded mode on a manifests
// directory of -bench.services ClusterIP Services and their EndpointSlices,
// twice on the same state (a first start, then a restart). It measures:
//
//   - *_ready_s: from exec to the first 200 of /readyz (as readiness is
//     defined today);
//   - *_written_s: from exec until the service map holds every frontend
//     and no frontend is pending in the frontends table;
//   - restart_lb_writes: entries the restart wrote to the load-balancing
//     maps, which did not change (cellium_lbmaps_writes_total);
//   - rss_mb: the agent's resident set once everything is written, the
//     larger of the two runs, and anon_mb its anonymous part (the rest is
//     the binary's pages, clean and shared); rss_settled_mb the same -bench.settle
//     later, once the Go runtime has returned what the load's peak took;
//     rss_peak_mb the most it held at any time (VmHWM), the larger of the
//     two runs;
//   - stop_s: SIGTERM to exit, the larger of the two runs.
//
// and prints them on one line, agent-scale-bench services=N ....
//
//	go test ./cmd/agent -run '^$' -bench Scale -benchtime 1x
func BenchmarkScale(b *testing.B) {
	n := *benchServices
	for range b.N {
		env := newAgentEnv(b)
		manifests := filepath.Join(env.dir, "manifests")
		writeScaleManifests(b, manifests, n)
		flags := append(env.runFlags(),
			"--k8s-manifests-dir", manifests,
			// A master and a slot per service, with room to spare.
			"--lb-service-map-max", strconv.Itoa(2*n+1024),
			"--lb-backend-map-max", strconv.Itoa(n+1024),
		)
		fmt.Printf("agent-scale-bench %s\n", scaleRuns(b, env, flags, n, "", nil))
	}
}

// scaleRuns starts the agent with flags twice on the same state, a first
// start and then a restart (see runScale), and returns the figures of the
// agent-scale-bench line: services=N first_ready_s=... stop_s=..., and
// with server what the API server spent on each.
func scaleRuns(b *testing.B, env *agentEnv, flags []string, n int, profilePrefix string, server *apiServerMeter) string {
	if *benchProfile != "" {
		flags = append(flags, "--pprof")
	}
	var runs [2]scaleRun
	for i := range runs {
		runs[i] = runScale(b, env, flags, n, i == 0, fmt.Sprintf("%srun%d", profilePrefix, i), server)
	}
	// The memory of the run that held more once written; the cgroup's
	// figures of the first start, whose cgroup was charged for the maps
	// and the binary's pages that the restart then found.
	mem := runs[0]
	if runs[1].written.rss > mem.written.rss {
		mem = runs[1]
		mem.written.cgroupWS, mem.written.cgroupKernel = runs[0].written.cgroupWS, runs[0].written.cgroupKernel
	}
	line := fmt.Sprintf("services=%d first_ready_s=%.2f first_written_s=%.2f restart_ready_s=%.2f restart_written_s=%.2f restart_lb_writes=%.0f %s rss_settled_mb=%.1f rss_peak_mb=%.1f stop_s=%.2f first_agent_cpu_s=%.2f first_agent_alloc_mb=%.0f restart_agent_cpu_s=%.2f restart_agent_alloc_mb=%.0f",
		n, runs[0].ready.Seconds(), runs[0].writtenAt.Seconds(), runs[1].ready.Seconds(), runs[1].writtenAt.Seconds(),
		runs[1].writes, mem.written, max(runs[0].settled.rss, runs[1].settled.rss), max(runs[0].settled.peak, runs[1].settled.peak), max(runs[0].stop, runs[1].stop).Seconds(),
		runs[0].agentCPU.Seconds(), runs[0].allocMB, runs[1].agentCPU.Seconds(), runs[1].allocMB)
	if server != nil {
		line += fmt.Sprintf(" first_apiserver_cpu_s=%.2f first_etcd_cpu_s=%.2f first_apiserver_sent_mb=%.1f restart_apiserver_cpu_s=%.2f restart_etcd_cpu_s=%.2f restart_apiserver_sent_mb=%.1f",
			runs[0].serverCPU, runs[0].etcdCPU, runs[0].serverSent, runs[1].serverCPU, runs[1].etcdCPU, runs[1].serverSent)
	}
	return line
}

type scaleRun struct {
	ready, writtenAt, stop time.Duration
	writes                 float64
	// The agent's CPU time (user and system) from exec to written, and
	// the bytes its heap allocated by then (go_memstats_alloc_bytes_total),
	// in MiB: what a start costs it, whatever the machine's load.
	agentCPU time.Duration
	allocMB  float64
	// The API server's and its etcd's CPU seconds and the MB it sent from
	// exec to written.
	serverCPU, etcdCPU, serverSent float64
	// The agent's memory once everything is written and -bench.settle later.
	written, settled memory
}

// runScale is one run of the agent; first starts it with the binary out of
// the page cache.
func runScale(b *testing.B, env *agentEnv, flags []string, n int, first bool, name string, server *apiServerMeter) scaleRun {
	var r scaleRun
	var mark apiServerMark
	if server != nil {
		mark = server.mark(b)
	}
	a := startBenchAgent(b, env, first, flags...)
	profiled := a.cpuProfile(b, name+"-cpu.pb.gz")
	r.ready = a.waitReady(b, 5*time.Minute)
	r.writtenAt = a.waitWritten(b, n, 5*time.Minute)
	cpu, err := procstat.CPU(a.cmd.Process.Pid)
	if err != nil {
		b.Fatal(err)
	}
	r.agentCPU = cpu
	r.allocMB = a.metric(b, "go_memstats_alloc_bytes_total") / (1 << 20)
	a.timeline(b, name)
	if server != nil {
		r.serverCPU, r.etcdCPU, r.serverSent = server.since(b, mark)
	}
	if err := <-profiled; err != nil {
		b.Fatal(err)
	}
	r.writes = a.metric(b, "cellium_lbmaps_writes_total")
	r.written = a.memory(b)
	a.profile(b, name+"-written")
	time.Sleep(*benchSettle)
	r.settled = a.memory(b)
	a.profile(b, name+"-settled")
	r.stop = a.stop(b)
	return r
}

// cpuProfile writes a CPU profile of the agent's first 10 seconds (from
// when its health address answers) into -bench.profile-dir, when given.
// The channel gives why there is none, or nil, when done.
func (a *benchAgent) cpuProfile(b *testing.B, file string) <-chan error {
	done := make(chan error, 1)
	if *benchProfile == "" {
		done <- nil
		return done
	}
	if err := os.MkdirAll(*benchProfile, 0o755); err != nil {
		b.Fatal(err)
	}
	go func() {
		done <- polltest.Wait("the agent's CPU profile", time.Minute, 5*time.Millisecond, func() (bool, string) {
			resp, err := http.Get("http://" + a.env.healthAddr + "/debug/pprof/profile?seconds=10")
			if err != nil {
				return false, err.Error()
			}
			data, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err := os.WriteFile(filepath.Join(*benchProfile, file), data, 0o644); err != nil {
				return false, err.Error()
			}
			return true, ""
		})
	}()
	return done
}

// timeline prints, with -bench.profile-dir, when each of the agent's
// readiness barriers was done, in seconds since its exec, in the order they
// were (agent-scale-timeline NAME barrier=s ...), and copies its log so far
// into the directory (NAME.log): where the wait for ready went.
func (a *benchAgent) timeline(b *testing.B, name string) {
	b.Helper()
	if *benchProfile == "" {
		return
	}
	objs, err := a.client.TableObjects(context.Background(), "readiness", client.TableQuery{})
	if err != nil {
		b.Fatal(err)
	}
	type barrier struct {
		Name  string    `json:"name"`
		Done  bool      `json:"done"`
		Since time.Time `json:"since"`
	}
	var barriers []barrier
	for _, raw := range objs {
		var br barrier
		if err := json.Unmarshal(raw, &br); err != nil {
			b.Fatalf("readiness row %s: %v", raw, err)
		}
		barriers = append(barriers, br)
	}
	slices.SortFunc(barriers, func(x, y barrier) int { return x.Since.Compare(y.Since) })
	var line strings.Builder
	for _, br := range barriers {
		if br.Done {
			fmt.Fprintf(&line, " %s=%.3f", br.Name, br.Since.Sub(a.started).Seconds())
		} else {
			fmt.Fprintf(&line, " %s=pending", br.Name)
		}
	}
	fmt.Printf("agent-scale-timeline %s%s\n", name, line.String())
	if log, err := os.ReadFile(filepath.Join(a.env.dir, "agent.log")); err == nil {
		os.WriteFile(filepath.Join(*benchProfile, name+".log"), log, 0o644)
	}
	os.WriteFile(filepath.Join(*benchProfile, name+".readyz"), a.readyz.Bytes(), 0o644)
}

// profile writes the agent's heap profile and its Go memory figures into
// -bench.profile-dir, when given, and prints the figures with the resident
// set: how much of it is live heap, garbage not yet collected, and memory
// the runtime holds without using it.
func (a *benchAgent) profile(b *testing.B, name string) {
	b.Helper()
	if *benchProfile == "" {
		return
	}
	if err := os.MkdirAll(*benchProfile, 0o755); err != nil {
		b.Fatal(err)
	}
	get := func(addr, path, file string) []byte {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			b.Fatal(err)
		}
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		if err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(*benchProfile, file), data, 0o644); err != nil {
			b.Fatal(err)
		}
		return data
	}
	var figures []string
	for line := range strings.Lines(string(get(a.env.metricsAddr, "/metrics", name+".metrics"))) {
		if strings.HasPrefix(line, "go_memstats_") && !strings.HasPrefix(line, "go_memstats_alloc_bytes_total") {
			figures = append(figures, strings.TrimSpace(strings.TrimPrefix(line, "go_memstats_")))
		}
	}
	mem := a.memory(b)
	fmt.Printf("agent-scale-profile %s %s %s\n", name, mem, strings.Join(figures, " "))
	// Before a collection (what is resident: live and garbage), then after.
	get(a.env.healthAddr, "/debug/pprof/heap", name+"-heap.pb.gz")
	get(a.env.healthAddr, "/debug/pprof/heap?gc=1", name+"-heap-gc.pb.gz")
	get(a.env.healthAddr, "/debug/pprof/goroutine?debug=1", name+"-goroutines.txt")
}

// writeScaleManifests writes n Services and their EndpointSlices, 1000 of
// each per file, as a cluster of that size would have them.
func writeScaleManifests(b *testing.B, dir string, n int) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	const perFile = 1000
	for f := 0; f*perFile < n; f++ {
		var sb strings.Builder
		if err := k8sclienttest.WriteScaleManifests(&sb, f*perFile, min(n, (f+1)*perFile)); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("services-%03d.yaml", f)), []byte(sb.String()), 0o644); err != nil {
			b.Fatal(err)
		}
	}
}

// benchAgent is one run of the built agent, its log in a file.
type benchAgent struct {
	env     *agentEnv
	cmd     *exec.Cmd
	started time.Time
	exited  chan error
	client  *client.Client
	cgroup  *memCgroup
	// readyz is what /readyz answered while not ready (waitReady).
	readyz bytes.Buffer
}

// startBenchAgent starts the built agent in a memory cgroup of its own; cold
// evicts the binary's pages from the page cache first, as on a node the
// agent has not run on yet, so that the agent's cgroup is charged for them.
func startBenchAgent(b *testing.B, env *agentEnv, cold bool, flags ...string) *benchAgent {
	b.Helper()
	requireRootB(b)
	if cold {
		dropPageCache(b, agentBin)
	}
	cg := newMemCgroup(b)
	log, err := os.OpenFile(filepath.Join(env.dir, "agent.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		b.Fatal(err)
	}
	defer log.Close()
	args := append([]string{"run", "--log-format", "json"}, flags...)
	argv := cg.wrap(append(append([]string{agentBin}, args...), strings.Fields(*benchArgs)...))
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = log, log
	a := &benchAgent{env: env, cmd: cmd, exited: make(chan error, 1), client: client.New(env.socket), cgroup: cg}
	a.started = time.Now()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	go func() { a.exited <- cmd.Wait() }()
	b.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			<-a.exited
		}
	})
	return a
}

func requireRootB(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root: the agent mounts bpffs and pins BPF maps")
	}
}

// poll calls ok every 10ms until it says true, and returns the time
// since the agent's exec; it fails the benchmark with what ok said last
// after timeout, or at once if the agent exits.
func (a *benchAgent) poll(b *testing.B, what string, timeout time.Duration, ok func() (bool, string)) time.Duration {
	b.Helper()
	polltest.Until(b, "agent "+what, timeout, 10*time.Millisecond, func() (bool, string) {
		select {
		case err := <-a.exited:
			log, _ := os.ReadFile(filepath.Join(a.env.dir, "agent.log"))
			lines := strings.Split(strings.TrimSpace(string(log)), "\n")
			b.Fatalf("agent exited (%v) before %s; the end of its log:\n%s", err, what, strings.Join(lines[max(0, len(lines)-10):], "\n"))
		default:
		}
		return ok()
	})
	return time.Since(a.started)
}

// waitReady waits for /readyz to answer 200. With -bench.profile-dir it
// keeps each different answer before, with its time since the exec, and
// writes them to the directory (NAME.readyz, by waitedFor): what readiness
// waited for, and when each wait ended.
func (a *benchAgent) waitReady(b *testing.B, timeout time.Duration) time.Duration {
	var last string
	return a.poll(b, "ready", timeout, func() (bool, string) {
		code, body := readyz(a.env.healthAddr)
		if *benchProfile != "" {
			// What it waits for, without the times that change at
			// every answer.
			var hz struct {
				Pending []string `json:"pending"`
				Waiting []struct {
					Name   string `json:"name"`
					Detail string `json:"detail"`
				} `json:"waiting"`
			}
			if json.Unmarshal([]byte(body), &hz) == nil {
				what, _ := json.Marshal(hz)
				if string(what) != last {
					last = string(what)
					fmt.Fprintf(&a.readyz, "%.3f %s\n", time.Since(a.started).Seconds(), what)
				}
			}
		}
		return code == http.StatusOK, fmt.Sprint(code, " ", body)
	})
}

// waitWritten waits until the IPv4 service map holds a master and a slot
// per service and no frontend waits for the reconciler.
func (a *benchAgent) waitWritten(b *testing.B, services int, timeout time.Duration) time.Duration {
	return a.poll(b, "done writing the service map", timeout, func() (bool, string) {
		ctx := context.Background()
		// The frontends first, then the one map: counting every map's
		// entries (the list of maps) took a tenth of the agent's CPU in
		// a restart when they were counted a key at a time.
		for _, kind := range []string{"Pending", "Error"} {
			rows, err := a.client.TableRows(ctx, "frontends", client.TableQuery{Index: "status", Key: kind})
			if err != nil {
				return false, err.Error()
			}
			if len(rows.Rows) > 0 {
				return false, fmt.Sprintf("%d frontends %s", len(rows.Rows), kind)
			}
		}
		m, err := a.client.Map(ctx, "cellium_lb4_services")
		if err != nil {
			return false, err.Error()
		}
		if m.Entries < 2*services {
			return false, fmt.Sprintf("%s has %d entries, want %d (a master and a slot per service)", m.Name, m.Entries, 2*services)
		}
		return true, ""
	})
}

// metric is the sum of a counter's series in /metrics.
func (a *benchAgent) metric(b *testing.B, name string) float64 {
	b.Helper()
	return a.metrics(b, name)[0]
}

// metrics is the sum of each named metric's series in one reading of
// /metrics.
func (a *benchAgent) metrics(b *testing.B, names ...string) []float64 {
	b.Helper()
	resp, err := http.Get("http://" + a.env.metricsAddr + "/metrics")
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	sums := make([]float64, len(names))
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		for i, name := range names {
			if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
				continue
			}
			fields := strings.Fields(line)
			v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
			if err != nil {
				b.Fatalf("metric line %q: %v", line, err)
			}
			sums[i] += v
		}
	}
	return sums
}

// goMemory is how the agent's Go runtime counts its memory, read from
// /metrics (after its resident set, as the reading allocates): the heap's
// spans in use, goroutine stacks, the GC's metadata and the heap
// profiler's buckets (mapped bytes, not all resident), and its goroutines.
func (a *benchAgent) goMemory(b *testing.B) string {
	b.Helper()
	v := a.metrics(b, "go_memstats_heap_inuse_bytes", "go_memstats_heap_alloc_bytes", "go_memstats_stack_inuse_bytes",
		"go_memstats_gc_sys_bytes", "go_memstats_buck_hash_sys_bytes", "go_goroutines")
	return fmt.Sprintf("go_heap_inuse_mb=%.1f go_heap_alloc_mb=%.1f go_stacks_mb=%.1f go_gc_sys_mb=%.1f go_buckhash_mb=%.2f goroutines=%.0f",
		mib(uint64(v[0])), mib(uint64(v[1])), mib(uint64(v[2])), mib(uint64(v[3])), mib(uint64(v[4])), v[5])
}

// memory is the agent's memory in MiB: its resident set (VmRSS) and the
// set's anonymous and file-backed parts, the most it was (VmHWM), and its
// cgroup's working set and the kernel's part of that (NaN without a
// cgroup).
type memory struct{ rss, anon, file, peak, cgroupWS, cgroupKernel float64 }

func (m memory) String() string {
	return fmt.Sprintf("rss_mb=%.1f anon_mb=%.1f file_mb=%.1f cgroup_ws_mb=%.1f cgroup_kernel_mb=%.1f", m.rss, m.anon, m.file, m.cgroupWS, m.cgroupKernel)
}

// memory reads the agent's resident set from /proc and its cgroup's
// working set.
func (a *benchAgent) memory(b *testing.B) memory {
	b.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", a.cmd.Process.Pid))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	data, err := io.ReadAll(f)
	if err != nil {
		b.Fatal(err)
	}
	m := memory{cgroupWS: math.NaN(), cgroupKernel: math.NaN()}
	if a.cgroup != nil {
		if m.cgroupWS, m.cgroupKernel, err = a.cgroup.workingSet(); err != nil {
			b.Fatal(err)
		}
	}
	for line := range strings.Lines(string(data)) {
		key, value, _ := strings.Cut(line, ":")
		kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(value), " kB"), 64)
		if err != nil {
			continue
		}
		switch key {
		case "VmRSS":
			m.rss = kb / 1024
		case "RssAnon":
			m.anon = kb / 1024
		case "RssFile":
			m.file = kb / 1024
		case "VmHWM":
			m.peak = kb / 1024
		}
	}
	return m
}

// stop sends SIGTERM and returns how long the agent took to exit.
func (a *benchAgent) stop(b *testing.B) time.Duration {
	b.Helper()
	start := time.Now()
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		b.Fatal(err)
	}
	select {
	case err := <-a.exited:
		if err != nil {
			b.Fatalf("agent exited with %v on SIGTERM; log in %s", err, filepath.Join(a.env.dir, "agent.log"))
		}
	case <-time.After(time.Minute):
		b.Fatal("agent still running a minute after SIGTERM")
	}
	return time.Since(start)
}
