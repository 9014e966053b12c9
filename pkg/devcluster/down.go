package devcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/pkg/netnsrun"
)

// Down takes the cluster down: agents, etcd, pods, nodes, the bridge,
// cgroups, pins and the cluster directory. It carries on past errors and
// returns them all; then cluster.json stays, and Down can run again. Down
// of a cluster already down does nothing.
func (c *Cluster) Down(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, err := os.Stat(c.dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	unlock, err := lockDir(c.dir)
	if err != nil {
		return err
	}
	defer unlock()
	s, err := loadState(c.dir)
	if errors.Is(err, ErrNoCluster) {
		return nil
	}
	if err != nil {
		return err
	}
	c.st = s
	return c.down(ctx, s)
}

// down removes everything s names that exists. The caller holds the lock.
func (c *Cluster) down(ctx context.Context, s *state) error {
	start := time.Now()
	c.log.Info("Taking the cluster down", "dir", s.Dir)
	s.Phase = PhaseDeleting
	if err := s.save(); err != nil {
		return err
	}
	var errs []error
	keep := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	// The relay first: it would log every agent that goes.
	if err := s.Relay.stop(ctx, relayStopGrace); err != nil {
		keep(fmt.Errorf("stop hubble-relay: %w", err))
	}
	// Agents next, so none sees the others go or the store vanish and
	// writes state about it.
	for _, n := range s.Nodes {
		if err := n.Agent.stop(ctx, stopGrace); err != nil {
			keep(fmt.Errorf("node %s: stop agent: %w", n.Name, err))
		}
	}
	if err := s.KubeAPI.stop(ctx, stopGrace); err != nil {
		keep(fmt.Errorf("stop kube-apiserver: %w", err))
	}
	if err := s.Etcd.stop(ctx, stopGrace); err != nil {
		keep(fmt.Errorf("stop etcd: %w", err))
	}
	// What else runs in the cluster's namespaces: processes started by an
	// up that died before it recorded them, or by hand with nsenter.
	keep(killInNetNS(ctx, s))
	// Pods go with their namespaces: their agents are stopped, and their
	// endpoints' state is in the directory that goes last.
	for _, p := range s.Pods {
		keep(netnsrun.Remove(p.NetNS))
	}
	if s.Outside != nil {
		keep(netnsrun.Remove(s.Outside.NetNS))
	}
	for _, n := range s.Nodes {
		for _, err := range c.removeNode(ctx, s, n) {
			keep(err)
		}
	}
	keep(netnsrun.Remove(s.BridgeNetNS))
	keep(removeCgroup(ctx, s.Cgroup))
	if len(errs) > 0 {
		return fmt.Errorf("take cluster %s down: %w (cluster.json is kept: run down again)", s.Name, errors.Join(errs...))
	}
	if err := os.RemoveAll(s.Dir); err != nil {
		return fmt.Errorf("remove cluster directory: %w", err)
	}
	c.log.Info("Cluster is down", "duration", time.Since(start).Round(time.Millisecond))
	return nil
}

// killInNetNS kills every process whose network namespace is one of the
// cluster's, and waits until they are gone.
func killInNetNS(ctx context.Context, s *state) error {
	paths := []string{s.BridgeNetNS}
	for _, n := range s.Nodes {
		paths = append(paths, n.NetNS)
	}
	for _, p := range s.Pods {
		paths = append(paths, p.NetNS)
	}
	if s.Outside != nil {
		paths = append(paths, s.Outside.NetNS)
	}
	namespaces := map[nsID]string{}
	for _, path := range paths {
		if id, ok := netnsID(path); ok {
			namespaces[id] = path
		}
	}
	if len(namespaces) == 0 {
		return nil
	}
	var left []Process
	for _, p := range processesIn(namespaces) {
		p.signal(unix.SIGKILL)
		left = append(left, p)
	}
	for _, p := range left {
		if !p.waitExit(ctx, 10*time.Second) {
			return fmt.Errorf("process %d in the cluster's namespaces still runs 10s after SIGKILL", p.PID)
		}
	}
	return nil
}

// nsID identifies a namespace: the device and inode of its nsfs file.
type nsID struct{ dev, ino uint64 }

func netnsID(path string) (nsID, bool) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil || !netnsrun.Exists(path) {
		return nsID{}, false
	}
	return nsID{st.Dev, st.Ino}, true
}

// processesIn are the processes (by their main thread) in one of the
// namespaces.
func processesIn(namespaces map[nsID]string) []Process {
	entries, _ := os.ReadDir("/proc")
	var procs []Process
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		var st unix.Stat_t
		if unix.Stat(filepath.Join("/proc", e.Name(), "ns", "net"), &st) != nil {
			continue
		}
		if _, ok := namespaces[nsID{st.Dev, st.Ino}]; !ok {
			continue
		}
		if start, err := startTime(pid); err == nil {
			procs = append(procs, Process{PID: pid, StartTime: start})
		}
	}
	return procs
}
