package endpointmanager

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/cellium/cellium/cells/ipam"
)

// orphan is a container whose endpoint state the restore could not use
// (its file was moved aside) while its pod still has its interface: the
// host side of its veth pair exists, and the IPAM still has its addresses
// under its container ID. The restore claims those addresses for it, so
// that they are never handed to another pod while this one uses them,
// and reports it in health until a CNI DEL of the container removes the
// veth pair and releases them.
type orphan struct {
	containerID string
	hostIfName  string
	ips         []netip.Addr
}

// orphanInterval is how often orphans-gone looks for orphans whose veth
// pair went with their pod.
const orphanInterval = 5 * time.Second

// orphanSkipsMax is how many rounds in a row orphans-gone skips when an
// operation runs; the next one waits for the manager's lock, for at most
// orphanLockWait (holding back new ADDs and DELs that long at most, once
// in orphanSkipsMax+1 rounds), so that a node always busy still releases
// its orphans' addresses.
const (
	orphanSkipsMax = 3
	orphanLockWait = time.Second
)

// releaseGoneOrphans releases the addresses of orphans whose host veth is
// gone: their pod went away (with its netns, the kernel removed the pair)
// without a DEL, and nothing else would ever release them.
func (m *Manager) releaseGoneOrphans(ctx context.Context) error {
	m.problemsMu.Lock()
	none := len(m.orphans) == 0
	m.problemsMu.Unlock()
	if none {
		return nil
	}
	// Every container: an orphan's CNI DEL, or a new ADD of it, may run.
	// Only when no operation runs: waiting for the lock would hold back
	// every new ADD and DEL behind a slow one (the lock prefers waiting
	// writers); the next round tries again. After orphanSkipsMax rounds
	// skipped so, it waits, for orphanLockWait at most.
	if m.orphanSkips < orphanSkipsMax {
		if !m.locks.tryLockAll() {
			m.orphanSkips++
			return nil
		}
		m.orphanSkips = 0
	} else {
		// Given up or not, the rounds after it skip again first.
		m.orphanSkips = 0
		wctx, cancel := context.WithTimeout(ctx, orphanLockWait)
		err := m.locks.lockAll(wctx)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				m.log.Info("Releasing gone orphans' addresses: the endpoint operations did not let the manager go; trying again next round", "waited", orphanLockWait)
			}
			return nil
		}
	}
	defer m.locks.unlockAll()
	m.problemsMu.Lock()
	defer m.problemsMu.Unlock()
	changed := false
	for id, o := range m.orphans {
		if _, err := netlink.LinkByName(o.hostIfName); !isNotFound(err) {
			continue
		}
		released, err := m.ipam.ReleaseOwner(id)
		if err != nil {
			return err
		}
		delete(m.orphans, id)
		changed = true
		m.log.Info("Released the addresses of a container without state whose interface is gone",
			"container", id, "host-interface", o.hostIfName, "released", released)
	}
	if changed {
		m.reportProblems()
	}
	return nil
}

func (o orphan) String() string {
	return fmt.Sprintf("container %s (host interface %s, addresses %v) has its interface but no usable state; its addresses stay reserved until a CNI DEL of the container",
		o.containerID, o.hostIfName, o.ips)
}

// claimOrphans finds the owners of addresses allocated before the restart
// that no restored endpoint claimed and whose veth pair still exists, and
// claims their addresses. An owner without a veth pair is what a CNI ADD
// that died half way left: the IPAM releases its addresses after the
// grace period.
func (m *Manager) claimOrphans() ([]orphan, error) {
	byOwner := map[string][]netip.Addr{}
	for _, a := range m.ipam.Unclaimed() {
		byOwner[a.Owner] = append(byOwner[a.Owner], a.IP)
	}
	var out []orphan
	for _, owner := range slices.Sorted(maps.Keys(byOwner)) {
		if validContainerID(owner) != nil {
			continue // reserved by hand or not a container: not an endpoint's
		}
		host := HostIfName(owner)
		if _, err := netlink.LinkByName(host); isNotFound(err) {
			continue
		} else if err != nil {
			return nil, fmt.Errorf("look up %s: %w", host, err)
		}
		o := orphan{containerID: owner, hostIfName: host, ips: byOwner[owner]}
		slices.SortFunc(o.ips, netip.Addr.Compare)
		for _, ip := range o.ips {
			if err := m.ipam.Claim(ip, owner); err != nil {
				return nil, err
			}
		}
		m.log.Error("Kept the addresses of a container whose endpoint state is lost but whose interface exists; a CNI DEL of the container removes it",
			"container", owner, "host-interface", host, "addresses", o.ips)
		out = append(out, o)
	}
	return out, nil
}

// reportProblems shows, as the health scope "state" of the module, what
// the restore could not use or found amiss: the state files it moved aside
// (until the agent restarts), the orphans it keeps and the endpoints
// outside the pod pools (until they are deleted). Without any the scope is
// removed. With m.problemsMu held.
func (m *Manager) reportProblems() {
	if len(m.moved) == 0 && len(m.orphans) == 0 && len(m.outside) == 0 {
		if m.problems != nil {
			m.problems.Close()
			m.problems = nil
		}
		return
	}
	if m.problems == nil {
		m.problems = m.health.NewScope("state")
	}
	var details []string
	for _, mv := range m.moved {
		details = append(details, mv.String())
	}
	for _, id := range slices.Sorted(maps.Keys(m.orphans)) {
		details = append(details, m.orphans[id].String())
	}
	for _, id := range slices.Sorted(maps.Keys(m.outside)) {
		details = append(details, m.outside[id])
	}
	m.problems.Degraded(fmt.Sprintf("%d endpoint state file(s) moved aside, %d container(s) without state kept, %d endpoint(s) outside the pod pools",
		len(m.moved), len(m.orphans), len(m.outside)),
		errors.New(strings.Join(details, "; ")))
}

// checkPools warns about restored endpoints with an address in no pod
// pool (the pod CIDRs changed across the restart, e.g. --pod-cidr): they
// are restored, as their pods still use the addresses, but the IPAM does
// not manage those, and routes elsewhere may not lead to them. They are
// shown in health until they are deleted. With m.problemsMu held.
func (m *Manager) checkPools(eps []*Endpoint) {
	pools := m.ipam.Pools()
	if m.outside == nil {
		m.outside = map[string]string{}
	}
	for _, ep := range eps {
		var out []netip.Addr
		for _, ip := range ep.IPs() {
			if !slices.ContainsFunc(pools, func(p ipam.Pool) bool { return p.Contains(ip) }) {
				out = append(out, ip)
			}
		}
		if len(out) == 0 {
			continue
		}
		var cidrs []string
		for _, p := range pools {
			cidrs = append(cidrs, p.CIDR.String())
		}
		m.outside[ep.ContainerID] = fmt.Sprintf("endpoint %d of container %s has %v outside every pod pool (%s): were the pod CIDRs changed?",
			ep.ID, ep.ContainerID, out, strings.Join(cidrs, ", "))
		m.log.Warn("Restored an endpoint with addresses outside every pod pool; were the pod CIDRs changed?",
			"id", ep.ID, "container", ep.ContainerID, "addresses", out, "pools", cidrs)
	}
}

// movedFile is a state file (or entry) that the restore moved aside.
type movedFile struct {
	path, to string
	why      error
}

func (mv movedFile) String() string {
	return fmt.Sprintf("%s moved to %s: %v", mv.path, mv.to, mv.why)
}
