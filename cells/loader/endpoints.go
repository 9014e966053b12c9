package loader

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"iter"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/vishvananda/netlink"
	"golang.org/x/time/rate"

	"github.com/cellium/cellium/cells/bpfmaps"
	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/health"
)

// endpointLinksDir is where agents before tc filters pinned the links of
// the endpoints' programs: <id>-ingress and <id>-egress per endpoint.
func endpointLinksDir(reg *bpfmaps.Registry) string {
	return filepath.Join(linksDir(reg), endpointLinksSubdir)
}

const endpointLinksSubdir = "endpoints"

// endpointHook is one of the two places on an endpoint's host-side veth
// where a program runs.
type endpointHook struct {
	// name ends the pin of the hook's link and names the hook in logs.
	name string
	// attach is the tcx attach type: of the NodePort links, and of the
	// endpoints' links that an agent before the tc filters pinned.
	attach ebpf.AttachType
	// parent is the clsact parent of the hook's tc filter (tc.go).
	parent uint32
}

var (
	// fromEndpoint sees what the pod sends: it arrives at the host side.
	fromEndpoint = endpointHook{"ingress", ebpf.AttachTCXIngress, netlink.HANDLE_MIN_INGRESS}
	// toEndpoint sees what goes into the pod: it leaves by the host side.
	toEndpoint    = endpointHook{"egress", ebpf.AttachTCXEgress, netlink.HANDLE_MIN_EGRESS}
	endpointHooks = []endpointHook{fromEndpoint, toEndpoint}
)

// pinName is the name of the pin of endpoint id's link at hook h.
func pinName(id uint16, h endpointHook) string { return strconv.Itoa(int(id)) + "-" + h.name }

// endpointPrograms are the programs the loader attaches to every endpoint.
// They are loaded by the time the reconciler calls program: their start
// hook runs before the reconciler's jobs start.
type endpointPrograms interface {
	// program is the program for hook h, and its ID.
	program(h endpointHook) (*ebpf.Program, ebpf.ProgramID)
}

// endpointLinks are the reconciler's operations: they make the host side
// of every ready endpoint run the programs, as direct-action tc filters on
// its clsact qdisc (tc.go). An endpoint that an agent before this one gave
// tcx links, pinned in dir, keeps them: they take the new programs in
// place. Why filters and not tcx links: a tcx attach waits for a grace
// period of the kernel's RCU with the RTNL lock held, two per new pod,
// which the whole node's interface changes queue behind; a filter on an
// interface that is not up yet waits for none (the endpoint manager brings
// a new endpoint's host side up only once it is live).
type endpointLinks struct {
	log   *slog.Logger
	dir   string
	progs endpointPrograms
}

func newEndpointLinks(log *slog.Logger, reg *bpfmaps.Registry, progs endpointPrograms) *endpointLinks {
	return &endpointLinks{log: log, dir: endpointLinksDir(reg), progs: progs}
}

// programsAttacher is the endpoint manager's step that attaches a new
// endpoint's programs within its creation (see
// endpointmanager.ProgramsAttacher): the reconciler's Update, run in the
// ADD's goroutine, so that the ADDs of many pods attach at once instead of
// waiting for the reconciler's rounds one after another.
func programsAttacher(log *slog.Logger, reg *bpfmaps.Registry, progs endpointPrograms) endpointmanager.ProgramsAttacher {
	return newEndpointLinks(log, reg, progs)
}

// AttachPrograms attaches a new endpoint's programs. Its host side is new,
// with the clsact qdisc the endpoint manager made with it and no filter,
// so each hook's filter is added without asking first: Update lists the
// filters and adds the qdisc, two netlink calls more per hook under the
// node's RTNL lock, which the ADDs of many pods at once queue for. When a
// pinned link of an earlier agent has the endpoint's ID, or a filter
// cannot be added so, Update does it.
func (o *endpointLinks) AttachPrograms(nlh *netlink.Handle, ep *endpointmanager.Endpoint) error {
	for _, h := range endpointHooks {
		if _, err := os.Lstat(filepath.Join(o.dir, pinName(ep.ID, h))); !errors.Is(err, fs.ErrNotExist) {
			return o.Update(context.Background(), nil, 0, ep)
		}
	}
	for _, h := range endpointHooks {
		prog, _ := o.progs.program(h)
		f := tcFilter(ep.HostIfIndex, h)
		f.Fd = prog.FD()
		if err := nlh.FilterReplace(f); err != nil {
			return o.Update(context.Background(), nil, 0, ep)
		}
	}
	return nil
}

// registerEndpointReconciler reconciles the endpoints table into the
// programs on their interfaces, with the result in each endpoint's
// ProgramStatus. Taking the programs makes them load first.
func registerEndpointReconciler(p reconciler.Params, tbl statedb.RWTable[*endpointmanager.Endpoint], reg *bpfmaps.Registry, progs endpointPrograms) error {
	_, err := reconciler.Register(
		p, tbl,
		(*endpointmanager.Endpoint).Clone,
		func(ep *endpointmanager.Endpoint, s reconciler.Status) *endpointmanager.Endpoint {
			ep.ProgramStatus = s
			return ep
		},
		func(ep *endpointmanager.Endpoint) reconciler.Status { return ep.ProgramStatus },
		newEndpointLinks(p.Log, reg, progs),
		nil,
		reconciler.WithName("endpoint-programs"),
		// New endpoints come with their programs attached by their
		// creation (programsAttacher); the reconciler attaches those of
		// restored endpoints and retries the creations' failures, in
		// rounds of up to 16 endpoints, not spaced.
		reconciler.WithRoundLimits(16, rate.NewLimiter(rate.Inf, 1)),
	)
	return err
}

// programsLive holds a new endpoint back until its programs are attached
// (see endpointmanager.LiveCondition).
func programsLive() endpointmanager.LiveOut {
	return endpointmanager.StatusCondition("programs", func(ep *endpointmanager.Endpoint) reconciler.Status { return ep.ProgramStatus })
}

func (o *endpointLinks) Update(_ context.Context, _ statedb.ReadTxn, _ statedb.Revision, ep *endpointmanager.Endpoint) error {
	if !ep.InDatapath() {
		return o.detach(ep)
	}
	for _, h := range endpointHooks {
		how, err := o.attach(ep, h)
		if err != nil {
			o.log.Warn("Attaching an endpoint's program failed; retrying",
				"endpoint", ep.ID, "interface", ep.HostIfName, "ifindex", ep.HostIfIndex, "hook", h.name, "error", err)
			return fmt.Errorf("endpoint %d: attach the %s program to %s (ifindex %d): %w",
				ep.ID, h.name, ep.HostIfName, ep.HostIfIndex, err)
		}
		if how != "" {
			o.log.Info("Attached endpoint program",
				"endpoint", ep.ID, "interface", ep.HostIfName, "ifindex", ep.HostIfIndex, "hook", h.name, "link", how)
		}
	}
	return nil
}

func (o *endpointLinks) Delete(_ context.Context, _ statedb.ReadTxn, _ statedb.Revision, ep *endpointmanager.Endpoint) error {
	return o.detach(ep)
}

// Prune detaches the pinned tcx links of endpoints that are gone or not
// ready: those an earlier agent attached and that were deleted while the
// agent was down. It runs once the endpoints table is initialized, that
// is once every endpoint is restored, so no restored endpoint loses its
// programs. Filters need no pruning: they go with their interface.
func (o *endpointLinks) Prune(_ context.Context, _ statedb.ReadTxn, eps iter.Seq2[*endpointmanager.Endpoint, statedb.Revision]) error {
	want := map[string]bool{}
	for ep := range eps {
		if ep.InDatapath() {
			for _, h := range endpointHooks {
				want[pinName(ep.ID, h)] = true
			}
		}
	}
	return pruneLinks(o.dir, want, func(what string) {
		o.log.Info("Detached the program of an endpoint that is gone", "link", what)
	})
}

// attach makes hook h of ep's host interface run the hook's program, and
// says how: "" (it already did), "updated" (the tcx link an earlier agent
// pinned now runs it: the kernel swaps programs atomically, so no packet
// goes unseen), "attached" (a new filter, or the filter took it, also
// atomically) or "replaced" (the pin held a link that could not take the
// program, such as one on a veth that was since recreated: a filter
// replaces it).
func (o *endpointLinks) attach(ep *endpointmanager.Endpoint, h endpointHook) (string, error) {
	prog, progID := o.progs.program(h)
	pin := filepath.Join(o.dir, pinName(ep.ID, h))
	old, err := link.LoadPinnedLink(pin, nil)
	switch {
	case err == nil:
		defer old.Close()
		why, current := unusableTCX(old, h, ep.HostIfIndex)
		if why == "" {
			if current == progID {
				return "", nil
			}
			err := old.Update(prog)
			if err == nil {
				return "updated", nil
			}
			why = err.Error()
		}
		o.log.Info("Replacing an endpoint's pinned link that cannot run the program by a tc filter",
			"endpoint", ep.ID, "ifindex", ep.HostIfIndex, "pin", pin, "reason", why)
	case errors.Is(err, fs.ErrNotExist):
		return attachTC(ep.HostIfIndex, h, prog, progID)
	default:
		o.log.Warn("Replacing a pin that is no usable link by a tc filter", "endpoint", ep.ID, "pin", pin, "error", err)
	}
	if _, err := attachTC(ep.HostIfIndex, h, prog, progID); err != nil {
		return "", err
	}
	// The pin goes only now: should its link still be on this interface,
	// there is never a moment without the program.
	if _, err := detachPinned(pin); err != nil {
		o.log.Warn("Detach a replaced endpoint link", "endpoint", ep.ID, "pin", pin, "error", err)
	}
	return "replaced", nil
}

// unusableTCX says why a pinned link cannot take the program of hook h on
// interface ifindex, or "" and the program it runs if it can.
func unusableTCX(lnk link.Link, h endpointHook, ifindex int) (string, ebpf.ProgramID) {
	info, err := lnk.Info()
	if err != nil {
		return err.Error(), 0
	}
	tcx := info.TCX()
	if info.Type != link.TCXType || tcx == nil {
		return fmt.Sprintf("it is a %v link, not a tcx link", info.Type), 0
	}
	if got := ebpf.AttachType(tcx.AttachType); got != h.attach {
		return fmt.Sprintf("it is attached as %s, not %s", got, h.attach), 0
	}
	if tcx.Ifindex == 0 {
		return "its interface is gone", 0
	}
	if int(tcx.Ifindex) != ifindex {
		return fmt.Sprintf("it is attached to ifindex %d, not %d", tcx.Ifindex, ifindex), 0
	}
	return "", info.Program
}

// detach removes ep's programs from its host interface, if it still has
// one: its filters, and the pinned links an earlier agent made.
func (o *endpointLinks) detach(ep *endpointmanager.Endpoint) error {
	var errs []error
	for _, h := range endpointHooks {
		what, err := detachPinned(filepath.Join(o.dir, pinName(ep.ID, h)))
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			errs = append(errs, err)
		default:
			o.log.Info("Detached endpoint program", "endpoint", ep.ID, "link", what)
		}
		if ep.HostIfIndex > 0 {
			if err := detachTC(ep.HostIfIndex, h); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("endpoint %d: detach its programs from ifindex %d: %w", ep.ID, ep.HostIfIndex, err)
	}
	return nil
}

// describeLink says where a link is attached, for logs and `agent cleanup`.
func describeLink(info *link.Info) string {
	if cg := info.Cgroup(); cg != nil {
		return fmt.Sprintf("%s on cgroup %d", ebpf.AttachType(cg.AttachType), cg.CgroupId)
	}
	if tcx := info.TCX(); tcx != nil {
		at := ebpf.AttachType(tcx.AttachType)
		hook := at.String()
		for _, h := range endpointHooks {
			if h.attach == at {
				hook = h.name
			}
		}
		if tcx.Ifindex == 0 {
			return fmt.Sprintf("tcx %s on an interface that is gone", hook)
		}
		return fmt.Sprintf("tcx %s on ifindex %d", hook, tcx.Ifindex)
	}
	return fmt.Sprintf("%v link", info.Type)
}

// AttachedBarrier is the readiness barrier that waits until the restored
// endpoints have their programs attached: with the endpoint map written,
// the endpoints are regenerated.
const AttachedBarrier = "endpoint-programs-attached"

func programsAttached(db *statedb.DB, tbl statedb.RWTable[*endpointmanager.Endpoint]) health.WaitOut {
	return health.Reconciled(AttachedBarrier, db, tbl.ToTable(), func(ep *endpointmanager.Endpoint) reconciler.Status { return ep.ProgramStatus })
}
