package main

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/pkg/cgroup2"
)

// memCgroup is a memory cgroup of the benchmark's own for the agent, as a
// pod's container has: what the kernel charges it, page cache included.
// Its working set is what the kubelet and `kubectl top` report (usage less
// the inactive file pages the kernel may reclaim at no cost).
type memCgroup struct {
	dir string
	v2  bool // memory.current and inactive_file; else v1's usage_in_bytes and total_inactive_file
}

// newMemCgroup makes an empty memory cgroup below the benchmark's own (the
// cgroup2 hierarchy when it has the memory controller, else cgroup v1's
// memory hierarchy), removed at cleanup; nil, with the reason logged, when
// there is none to be had.
func newMemCgroup(b testing.TB) *memCgroup {
	dir, _, v2, err := cgroup2.TempMemoryCgroup("cellium-agent-bench-")
	if err != nil {
		b.Logf("agent not in a memory cgroup of its own (no cgroup working set): %v", err)
		return nil
	}
	b.Cleanup(func() { os.Remove(dir) })
	return &memCgroup{dir: dir, v2: v2}
}

// wrap returns the command line that runs argv in the cgroup: a shell that
// moves itself there and then becomes argv, so that everything the agent
// does from its first instruction is charged to the cgroup.
func (c *memCgroup) wrap(argv []string) []string {
	if c == nil {
		return argv
	}
	return append([]string{"/bin/sh", "-c", `echo $$ > "$0/cgroup.procs" && exec "$@"`, c.dir}, argv...)
}

// workingSet is the cgroup's usage less its inactive file pages, and the
// part of the usage that is the kernel's (BPF maps, page tables, sockets),
// in MiB.
func (c *memCgroup) workingSet() (ws, kernel float64, err error) {
	if c.v2 {
		kernel, err = c.stat("kernel")
	} else {
		kernel, err = c.read("memory.kmem.usage_in_bytes")
	}
	if err != nil {
		return 0, 0, err
	}
	usageFile, inactiveKey := "memory.usage_in_bytes", "total_inactive_file"
	if c.v2 {
		usageFile, inactiveKey = "memory.current", "inactive_file"
	}
	usage, err := c.read(usageFile)
	if err != nil {
		return 0, 0, err
	}
	inactive, err := c.stat(inactiveKey)
	if err != nil {
		return 0, 0, err
	}
	return usage - min(usage, inactive), kernel, nil
}

// read is a file of the cgroup holding a number of bytes, in MiB.
func (c *memCgroup) read(file string) (float64, error) {
	n, err := cgroup2.ReadUint(c.dir, file)
	return float64(n) / (1 << 20), err
}

// stat is a key of the cgroup's memory.stat, in MiB.
func (c *memCgroup) stat(key string) (float64, error) {
	n, err := cgroup2.MemoryStat(c.dir, key)
	return float64(n) / (1 << 20), err
}

// dropPageCache evicts the file's cached pages (those no process maps), so
// that the next process to read it is charged for them, as a pod's first
// start on a node is.
func dropPageCache(b testing.TB, file string) {
	f, err := os.Open(file)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		b.Fatalf("drop the page cache of %s: %v", file, err)
	}
}
