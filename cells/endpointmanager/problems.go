package endpointmanager

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"
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
// the restore could not use: the state files it moved aside and the
// orphans it keeps. Without either the scope is removed. With m's lock
// held.
func (m *Manager) reportProblems() {
	if len(m.moved) == 0 && len(m.orphans) == 0 {
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
	m.problems.Degraded(fmt.Sprintf("%d endpoint state file(s) moved aside, %d container(s) without state kept", len(m.moved), len(m.orphans)),
		errors.New(strings.Join(details, "; ")))
}

// movedFile is a state file (or entry) that the restore moved aside.
type movedFile struct {
	path, to string
	why      error
}

func (mv movedFile) String() string {
	return fmt.Sprintf("%s moved to %s: %v", mv.path, mv.to, mv.why)
}
