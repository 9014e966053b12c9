package loader

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/cells/endpointmanager"
)

// The endpoints' programs are direct-action bpf filters on a clsact qdisc
// of the host side, one per hook, at a fixed priority and handle, so that
// attaching again replaces the filter's program in one step (tc filter
// replace). Filters cannot be pinned: they stay with the interface while
// the agent is down, and go with it when the veth is removed. Nothing
// prunes them; an endpoint deleted while the agent was down lost its veth,
// and its filters with it.
//
// What a new endpoint's attach costs the node: adding the qdisc to an
// interface that is up deactivates and reactivates it, and the first
// filter of a hook swaps the qdisc's filter list, each a wait for the
// kernel's RCU with the RTNL lock held; on an interface not up yet (a new
// endpoint's, see endpointmanager) the first is not done and the second is
// an expedited wait at most. A tcx link's attach waits for a whole normal
// grace period every time (14 ms at load 25, two per pod, one after
// another across the node).

// tcFilter is the filter of hook h on interface ifindex; Fd is unset.
func tcFilter(ifindex int, h endpointHook) *netlink.BpfFilter {
	return &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: ifindex,
			Parent:    h.parent,
			Handle:    netlink.MakeHandle(0, 1),
			Protocol:  unix.ETH_P_ALL,
			Priority:  1,
		},
		Name:         tcFilterName(h),
		DirectAction: true,
	}
}

// tcFilterName names the filter of hook h: `agent cleanup` finds the
// filters by it.
func tcFilterName(h endpointHook) string { return "cellium-" + h.name }

// attachTC makes prog, whose ID is id, the program of hook h's filter on
// ifindex, adding the clsact qdisc if the interface has none, and says
// how: "" when the filter already ran it, else "attached".
func attachTC(ifindex int, h endpointHook, prog *ebpf.Program, id ebpf.ProgramID) (string, error) {
	if tcRuns(ifindex, h, id) {
		return "", nil
	}
	if err := endpointmanager.AddClsact(ifindex); err != nil {
		return "", fmt.Errorf("add clsact qdisc: %w", err)
	}
	f := tcFilter(ifindex, h)
	f.Fd = prog.FD()
	if err := netlink.FilterReplace(f); err != nil {
		return "", fmt.Errorf("tc filter %s: %w", h.name, err)
	}
	return "attached", nil
}

// tcRuns says whether hook h's filter on ifindex runs program id and is
// the only filter of ours there. An interface without a clsact qdisc has
// none.
func tcRuns(ifindex int, h endpointHook, id ebpf.ProgramID) bool {
	filters := ourFilters(ifindex, h)
	for _, bf := range filters {
		if bf.Id != int(id) || bf.Handle != netlink.MakeHandle(0, 1) || bf.Priority != 1 || !bf.DirectAction {
			return false
		}
	}
	return len(filters) > 0
}

// ourFilters are the bpf filters of hook h on ifindex named as ours
// (tcFilterName); none when the interface has no clsact qdisc or is gone.
func ourFilters(ifindex int, h endpointHook) []*netlink.BpfFilter {
	filters, err := netlink.FilterList(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: ifindex}}, h.parent)
	if err != nil {
		return nil
	}
	var ours []*netlink.BpfFilter
	for _, f := range filters {
		if bf, ok := f.(*netlink.BpfFilter); ok && bf.Name == tcFilterName(h) {
			ours = append(ours, bf)
		}
	}
	return ours
}

// detachTC removes hook h's filter from ifindex; an interface or a filter
// that is gone is no error. The clsact qdisc stays: other filters may use
// it.
func detachTC(ifindex int, h endpointHook) error {
	err := netlink.FilterDel(tcFilter(ifindex, h))
	if err == nil || errors.Is(err, unix.ENODEV) || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EINVAL) {
		return nil
	}
	return fmt.Errorf("delete tc filter %s: %w", h.name, err)
}
