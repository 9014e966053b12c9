package policymaps

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/statedb/reconciler"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/cells/bpfmaps/bpfmapstest"
	"github.com/cellium/cellium/cells/policy"
	"github.com/cellium/cellium/pkg/cgroup2"
	"github.com/cellium/cellium/pkg/policymap"
)

// BenchmarkMapMemory: the kernel memory an entry of the policy trie costs,
// the trie being created as the cell creates it (not preallocated,
// --policy-map-max 65,536) and filled to 65,500 entries: 100 endpoints
// with 655 allows each (an identity and a TCP port each, one key per
// allow, half of them ingress). Two figures per entry:
//
//   - memlock: what the kernel accounts the map in its fdinfo (and `bpftool
//     map show`), filled less empty, over the entries;
//   - kernel: what the map's memory cgroup was charged for the entries:
//     the map is created in an empty memory cgroup of the benchmark's own
//     (the benchmark's process moves there for the creation only), whose
//     kernel memory, filled less empty, over the entries, holds what
//     memlock leaves out (the trie's intermediate nodes, the allocator's
//     size classes and per-CPU caches). Without a memory cgroup to be had
//     it is left out, with the reason logged.
//
// Beside them, the fixed costs of the two other policy maps: the
// enforcement hash (preallocated, every endpoint ID) and the empty prefix
// trie. Prints `policy-map-bench entries=... memlock_bytes_per_entry=...
// kernel_bytes_per_entry=... enforcement_memlock_kb=...`.
//
//	go test ./cells/policymaps -run '^$' -bench MapMemory -benchtime 1x
func BenchmarkMapMemory(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("BPF maps need root")
	}
	const endpoints, perEndpoint = 100, 655
	var memlockPer, kernelPer float64
	var enforcementKB, prefixKB float64
	for b.Loop() {
		cg := newKernelCgroup(b)
		var trie *ebpf.Map
		cg.in(b, func() {
			var err error
			trie, err = ebpf.NewMap(&ebpf.MapSpec{
				Name: policymap.MapName, Type: ebpf.LPMTrie, MaxEntries: 1 << 16, Flags: unix.BPF_F_NO_PREALLOC,
				KeySize: uint32(unsafe.Sizeof(policymap.Key{})), ValueSize: uint32(unsafe.Sizeof(policymap.Value{})),
			})
			if err != nil {
				b.Fatal(err)
			}
		})
		memlock0, kernel0 := memlock(b, trie), cg.kernel(b)
		n := 0
		for ep := range endpoints {
			for i := range perEndpoint {
				dir := policymap.Ingress
				if i%2 == 1 {
					dir = policymap.Egress
				}
				keys, err := policymap.KeysOf(policymap.Allow{EndpointID: uint16(ep + 1), Direction: dir,
					Identity: uint32(10000 + i*37%5000), Proto: unix.IPPROTO_TCP, Port: uint16(1000 + i)})
				if err != nil {
					b.Fatal(err)
				}
				for _, k := range keys {
					if err := trie.Put(k, policymap.Value{PrefixLen: k.PrefixLen, Cookie: uint32(i)}); err != nil {
						b.Fatalf("put entry %d (%+v): %v", n, k, err)
					}
					n++
				}
			}
		}
		memlockPer = float64(memlock(b, trie)-memlock0) / float64(n)
		kernelPer = -1
		if cg != nil {
			kernelPer = float64(cg.kernel(b)-kernel0) / float64(n)
			// The charge holds every node memlock counts, and more.
			if kernelPer < memlockPer {
				b.Fatalf("%.0f B per entry charged to the map's cgroup %s, below its memlock's %.0f B: the entries were not charged there", kernelPer, cg.dir, memlockPer)
			}
		}
		trie.Close()

		enf, err := ebpf.NewMap(&ebpf.MapSpec{Name: policymap.EnforcementMapName, Type: ebpf.Hash,
			KeySize: 4, ValueSize: uint32(unsafe.Sizeof(policymap.Enforcement{})), MaxEntries: policymap.EnforcementMaxEntries})
		if err != nil {
			b.Fatal(err)
		}
		enforcementKB = float64(memlock(b, enf)) / 1024
		enf.Close()
		pre, err := ebpf.NewMap(&ebpf.MapSpec{Name: policymap.PrefixMapName, Type: ebpf.LPMTrie, Flags: unix.BPF_F_NO_PREALLOC,
			KeySize: uint32(unsafe.Sizeof(policymap.PrefixKey{})), ValueSize: uint32(unsafe.Sizeof(policymap.PrefixValue{})), MaxEntries: policymap.PrefixMaxEntries})
		if err != nil {
			b.Fatal(err)
		}
		prefixKB = float64(memlock(b, pre)) / 1024
		pre.Close()
		if n != endpoints*perEndpoint {
			b.Fatalf("%d keys written, want %d", n, endpoints*perEndpoint)
		}
	}
	b.ReportMetric(memlockPer, "memlock-B/entry")
	b.ReportMetric(kernelPer, "kernel-B/entry")
	fmt.Printf("policy-map-bench entries=%d memlock_bytes_per_entry=%.0f kernel_bytes_per_entry=%.0f enforcement_memlock_kb=%.0f prefix_empty_memlock_kb=%.0f\n",
		endpoints*perEndpoint, memlockPer, kernelPer, enforcementKB, prefixKB)
}

// memlock is the map's memlock in its fdinfo, in bytes.
func memlock(b *testing.B, m *ebpf.Map) uint64 {
	path := fmt.Sprintf("/proc/self/fdinfo/%d", m.FD())
	data, err := os.ReadFile(path)
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(line, "memlock:"); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			if err != nil {
				b.Fatalf("%s: %q: %v", path, line, err)
			}
			return n
		}
	}
	b.Fatalf("%s: no memlock line:\n%s", path, data)
	return 0
}

// kernelCgroup is an empty memory cgroup below the benchmark's own, to
// create a map in: the kernel charges a map's elements to the cgroup it
// was created in.
type kernelCgroup struct {
	parent, dir string
	v2          bool
}

// newKernelCgroup makes it, removed at cleanup (after what the benchmark
// closed before); nil, with the reason logged, when there is none to be
// had.
func newKernelCgroup(b *testing.B) *kernelCgroup {
	dir, parent, v2, err := cgroup2.TempMemoryCgroup("cellium-policymap-bench-")
	if err != nil {
		b.Logf("no kernel memory figure: %v", err)
		return nil
	}
	b.Cleanup(func() { os.Remove(dir) })
	return &kernelCgroup{parent: parent, dir: dir, v2: v2}
}

// in runs fn with the benchmark's process in the cgroup (all of it: a
// cgroup holds processes), and moves it back to its own after. Without a
// cgroup it just runs fn.
func (c *kernelCgroup) in(b *testing.B, fn func()) {
	if c == nil {
		fn()
		return
	}
	pid := []byte(strconv.Itoa(os.Getpid()))
	if err := os.WriteFile(filepath.Join(c.dir, "cgroup.procs"), pid, 0); err != nil {
		b.Fatalf("move the benchmark into %s: %v", c.dir, err)
	}
	defer func() {
		if err := os.WriteFile(filepath.Join(c.parent, "cgroup.procs"), pid, 0); err != nil {
			b.Fatalf("move the benchmark back to %s: %v", c.parent, err)
		}
	}()
	fn()
}

// kernel is the kernel memory charged to the cgroup, in bytes: v2's
// memory.stat kernel, v1's memory.kmem.usage_in_bytes.
func (c *kernelCgroup) kernel(b *testing.B) uint64 {
	if c == nil {
		return 0
	}
	var n uint64
	var err error
	if c.v2 {
		n, err = cgroup2.MemoryStat(c.dir, "kernel")
	} else {
		n, err = cgroup2.ReadUint(c.dir, "memory.kmem.usage_in_bytes")
	}
	if err != nil {
		b.Fatal(err)
	}
	return n
}

// BenchmarkNewEndpointRealized: how long a new endpoint's isolating policy
// (its enforcement row and 8 ingress allows, written in one transaction
// as the policy cell writes them) takes to be realized in the maps, every
// row Done: what a CNI ADD waits for through the policy live condition.
// The enforcement is written once the allows are (see order), so this is
// the two reconcilers one after the other. Prints
// `policy-map-realize-bench ns_per_endpoint=... load1=...`.
//
//	go test ./cells/policymaps -run '^$' -bench NewEndpointRealized
func BenchmarkNewEndpointRealized(b *testing.B) {
	a := newAgent(b, bpfmapstest.Root(b), 1<<16)
	a.start(b)
	defer a.stop(b)
	a.done()
	ep := uint16(0)
	b.ResetTimer()
	for b.Loop() {
		ep++
		objs := []any{&policy.Enforcement{EndpointID: ep, Ingress: true}}
		for i := range 8 {
			objs = append(objs, entry(ep, policy.Ingress, 1000+uint32(i), unix.IPPROTO_TCP, 80, 0))
		}
		a.put(objs...)
		for {
			txn := a.db.ReadTxn()
			enf, _, watch, _ := a.enforcement.GetWatch(txn, policy.EnforcementByEndpoint.Query(ep))
			done := enf.Status.Kind == reconciler.StatusKindDone
			entries, entriesWatch := a.entries.ListWatch(txn, policy.EntryByEndpoint.Query(ep))
			for e := range entries {
				done = done && e.Status.Kind == reconciler.StatusKindDone
			}
			if done {
				break
			}
			select {
			case <-watch:
			case <-entriesWatch:
			}
		}
	}
	b.StopTimer()
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Printf("policy-map-realize-bench ns_per_endpoint=%d load1=%s\n", b.Elapsed().Nanoseconds()/int64(b.N), strings.Fields(string(load))[0])
}

// BenchmarkPrune: one prune of the policy trie filled to 65,500 keys (100
// endpoints with 655 allows each), nothing to remove: the entries' table
// read into the set of wanted keys and every key of the trie read, as the
// reconciler does each pruneInterval (a minute). Prints
// `policy-map-prune-bench keys=... ms_per_prune=... map_read_ms=...
// cpu_share_per_minute=... load1=...` (map_read_ms: one read of the trie
// alone, after the prunes).
//
//	go test ./cells/policymaps -run '^$' -bench Prune -benchtime 10x
func BenchmarkPrune(b *testing.B) {
	const endpoints, perEndpoint = 100, 655
	a := newAgent(b, bpfmapstest.Root(b), 1<<16)
	a.start(b)
	defer a.stop(b)
	var objs []any
	for ep := range uint16(endpoints) {
		for i := range uint32(perEndpoint) {
			objs = append(objs, entry(ep+1, policy.Ingress, 1000+i, unix.IPPROTO_TCP, 80, 0))
		}
	}
	a.put(objs...)
	a.done()
	for {
		txn := a.db.ReadTxn()
		pending := 0
		for e := range a.entries.All(txn) {
			if e.Status.Kind != reconciler.StatusKindDone {
				pending++
			}
		}
		if pending == 0 {
			break
		}
		_, watch := a.entries.AllWatch(txn)
		<-watch
	}
	ops := &entryOps{m: a.maps.Policy, metrics: a.metrics}
	b.ResetTimer()
	for b.Loop() {
		txn := a.db.ReadTxn()
		if err := ops.Prune(b.Context(), txn, a.entries.All(txn)); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	// The map's read alone, for the share of the prune it is.
	start := time.Now()
	keys := 0
	if err := a.maps.Policy.Iterate(func(policymap.Key, policymap.Value) bool { keys++; return true }); err != nil {
		b.Fatal(err)
	}
	readMS := float64(time.Since(start).Nanoseconds()) / 1e6
	load, _ := os.ReadFile("/proc/loadavg")
	per := float64(b.Elapsed().Nanoseconds()) / float64(b.N)

	fmt.Printf("policy-map-prune-bench keys=%d ms_per_prune=%.1f map_read_ms=%.1f cpu_share_per_minute=%.4f load1=%s\n",
		keys, per/1e6, readMS, per/float64(time.Minute), strings.Fields(string(load))[0])
}
