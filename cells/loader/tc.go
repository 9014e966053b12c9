package loader

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Kernels before 6.6 have no tcx. There the endpoints' programs are
// direct-action bpf filters on a clsact qdisc, one per hook, at a fixed
// priority and handle, so that attaching again replaces the filter's
// program in one step (tc filter replace). Filters cannot be pinned: they
// stay with the interface while the agent is down, and go with it when
// the veth is removed. Nothing prunes them; an endpoint deleted while the
// agent was down lost its veth, and its filters with it.

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
		Name:         "cellium-" + h.name,
		DirectAction: true,
	}
}

// attachTC makes prog the program of hook h's filter on ifindex, adding the
// clsact qdisc if the interface has none.
func attachTC(ifindex int, h endpointHook, prog *ebpf.Program) error {
	qdisc := &netlink.Clsact{QdiscAttrs: netlink.QdiscAttrs{
		LinkIndex: ifindex,
		Handle:    netlink.MakeHandle(0xffff, 0),
		Parent:    netlink.HANDLE_CLSACT,
	}}
	if err := netlink.QdiscAdd(qdisc); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("add clsact qdisc: %w", err)
	}
	f := tcFilter(ifindex, h)
	f.Fd = prog.FD()
	if err := netlink.FilterReplace(f); err != nil {
		return fmt.Errorf("tc filter %s: %w", h.name, err)
	}
	return nil
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
