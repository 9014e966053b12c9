package endpointmanager

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/vishvananda/netns"

	"github.com/cellium/cellium/cells/api"
	"github.com/cellium/cellium/cells/ipam"
	"github.com/cellium/cellium/pkg/identity"
)

// CreateRequest is what a CNI ADD knows about a container.
type CreateRequest struct {
	ContainerID string
	// Netns is the path of the container's network namespace.
	Netns string
	// IfName is the interface to make in it.
	IfName       string
	PodNamespace string
	PodName      string
	// PodUID, when set, is the UID the pod must have: a pod of the same
	// name the watch still has (deleted and made again, e.g. a
	// StatefulSet's) is not taken for it.
	PodUID string
	// Health makes the node's health endpoint: reserved identity health,
	// no pod.
	Health bool
}

func (r CreateRequest) validate() error {
	for _, err := range []error{validContainerID(r.ContainerID), validNetns(r.Netns), validIfName(r.IfName)} {
		if err != nil {
			return errorf(ErrInvalid, "%s", err)
		}
	}
	return nil
}

// Create makes the endpoint of a container: it allocates an address per
// pool, writes the state file, makes the veth pair, addresses and routes,
// and writes the state file again as ready before it returns, so that an
// endpoint reported to the runtime is never lost. Whatever fails is undone.
// It waits while the restore runs, until the node's devices are listed
// (the automatic MTU), and (for a pod, with a Kubernetes clientset) until
// the pods of the node are listed and (with a real API server) the pod (of
// req.PodUID, when set) and its namespace are known, as long as ctx allows.
func (m *Manager) Create(ctx context.Context, req CreateRequest) (*Endpoint, error) {
	if err := req.validate(); err != nil {
		return nil, err
	}
	if err := m.waitRestored(ctx); err != nil {
		return nil, err
	}
	if err := m.waitDevices(ctx); err != nil {
		return nil, err
	}
	if m.pods != nil && req.PodName != "" {
		if err := m.pods.waitListed(ctx); err != nil {
			return nil, errorf(ErrNotReady, "the agent has not listed the pods of its node yet, so the labels of pod %s/%s (its identity, its policy) are not known; try again: %v",
				req.PodNamespace, req.PodName, err)
		}
		if err := m.pods.waitPod(ctx, req.PodNamespace, req.PodName, req.PodUID); err != nil {
			uid := ""
			if req.PodUID != "" {
				uid = " (UID " + req.PodUID + ")"
			}
			return nil, errorf(ErrNotReady, "pod %s/%s%s of node %s (or its namespace) is not known from the API server yet, so its labels (its identity, its policy) are not; try again: %v",
				req.PodNamespace, req.PodName, uid, m.pods.node, err)
		}
	}
	ep := &Endpoint{
		ContainerID: req.ContainerID, Netns: req.Netns, IfName: req.IfName,
		HostIfName: HostIfName(req.ContainerID), PodNamespace: req.PodNamespace, PodName: req.PodName,
		Health: req.Health, Created: time.Now(),
	}
	if meta, ok := m.podMeta(req.PodNamespace, req.PodName); ok {
		meta.apply(ep)
	}
	steps := newStepTimes()
	if rt, ok := api.TimesOf(ctx); ok {
		// What the request waited before the creation began: in the API
		// server (queued) and in its handler (decoding, the wait for the
		// restore).
		steps.request = []any{"accepted", rt.Accepted,
			"queued", rt.Handled.Sub(rt.Accepted).Round(time.Microsecond),
			"handler", steps.last.Sub(rt.Handled).Round(time.Microsecond)}
	}
	// Before the lock: the path comes from the caller, and what it names
	// is no business of other requests.
	podNS, err := checkPodNetns(ctx, req.Netns)
	if err != nil {
		return nil, err
	}
	defer podNS.Close()
	steps.done("netns")
	// Before the lock: the allocator may wait for the kvstore.
	ep.Identity, ep.IdentityPending = m.acquireIdentity(ctx, ep, identity.Unknown)
	steps.done("identity")
	created, err := m.createLocked(ctx, req, ep, podNS, steps)
	if err != nil {
		m.releaseIdentity(ep)
		return nil, err
	}
	// The pod's labels may have come between the lookup above and the
	// endpoint's insertion, when no endpoint was there for them to go to:
	// the informer's store has them by now.
	m.refreshPod(created, "pod labels seen during the ADD")
	if cur, found := m.Lookup(Selector{ID: created.ID}); found {
		created = cur
	}
	return created, nil
}

func (m *Manager) createLocked(ctx context.Context, req CreateRequest, ep *Endpoint, podNS netns.NsHandle, steps *stepTimes) (*Endpoint, error) {
	unlock, err := m.locks.lockContainer(ctx, req.ContainerID)
	if err != nil {
		return nil, err
	}
	defer unlock()

	if old, found := m.Lookup(Selector{ContainerID: req.ContainerID}); found {
		// A restored endpoint waiting to be live (starting) is answered so
		// too, at once: it is not the ADD's to finish, nor to wait for.
		return nil, errorf(ErrExists, "container %s already has endpoint %d (interface %s, addresses %v, %s): a CNI DEL removes it",
			req.ContainerID, old.ID, old.IfName, old.IPs(), old.State)
	}
	id, err := m.reserveID()
	if err != nil {
		return nil, err
	}
	// The ID is the creation's until the endpoint is in the table, or
	// undone.
	defer m.unreserveID(id)
	// An earlier ADD of this container that the agent did not finish may
	// have left addresses, released here, and a veth pair, removed when
	// the new one is made (plumbNew): start from nothing. Both are
	// logged in one line, once the creation knows of the veth pair.
	released, err := m.releaseLeftoverAddresses(req.ContainerID)
	if err != nil {
		return nil, err
	}
	ep.ID = id
	steps.done("lock")
	var removedLink bool
	ep, err = m.create(ctx, ep, podNS, steps, &removedLink)
	m.logLeftovers(req.ContainerID, removedLink, released)
	if err != nil {
		m.undo(ep)
		return nil, err
	}
	return ep, nil
}

// create makes the endpoint ep; *removedLink says whether it removed a
// veth pair an earlier creation left in its way.
func (m *Manager) create(ctx context.Context, ep *Endpoint, podNS netns.NsHandle, steps *stepTimes, removedLink *bool) (*Endpoint, error) {
	// The addresses' durable record is the state file written next,
	// before anything uses them: the IPAM's files need no sync of their
	// own (ipam.Request.Recorded).
	for _, pool := range m.ipam.Pools() {
		a, err := m.ipam.Allocate(ctx, ipam.Request{Owner: ep.ContainerID, Family: pool.Family, Recorded: true})
		if err != nil {
			return ep, err
		}
		if pool.Family == ipam.IPv4 {
			ep.IPv4 = a.IP
		} else {
			ep.IPv6 = a.IP
		}
	}
	m.crash.At(CrashIPAMAllocated)
	steps.done("ipam")
	if err := m.states.create(ep, phaseCreating); err != nil {
		return ep, err
	}
	steps.done("state")
	var err error
	*removedLink, err = m.plumb.plumbNew(ep, podNS, m.routers())
	if err != nil {
		return ep, err
	}
	steps.done("veth")
	// The ready state file holds what the kernel has now: it is written
	// while the datapath takes the endpoint in, and the ADD answered once
	// both are done. An agent that dies before finds a ready endpoint
	// whose host side is down, and routes it once it is live, as any
	// restored endpoint whose host side is down (routeRestored); the
	// runtime, which got no answer, deletes it.
	persisted := m.writeStateAsync(ep, phaseReady)
	defer persisted() // not left running past an undo
	// The datapath takes the endpoint in (its map entry, its programs,
	// its policy) before anything can reach the pod: the host routes to
	// it come after, and only then is it ready.
	ep.State = Starting
	attached := m.attachPrograms(ep)
	steps.done("programs")
	rev, err := m.insert(ep, attached)
	if err != nil {
		return ep, err
	}
	steps.done("insert")
	live, err := m.waitLive(ctx, ep, rev, nil)
	if err != nil {
		return ep, err
	}
	steps.done("live")
	if err := m.plumb.routeHost(ep); err != nil {
		return ep, err
	}
	steps.done("route")
	// Starting until the ready file is written and the row says ready:
	// an undo removes a starting endpoint's row.
	if err := persisted(); err != nil {
		return ep, err
	}
	steps.done("state-ready")
	m.crash.At(CrashEndpointPersisted)
	if err := m.markState(ep, Starting, Ready, nil); err != nil {
		return ep, err
	}
	ep.State = Ready
	steps.done("ready")
	for i := 0; i+1 < len(steps.out); i += 2 {
		m.liveMetrics.steps.WithLabelValues(steps.out[i].(string)).Observe(steps.out[i+1].(time.Duration).Seconds())
	}
	m.log.Info("Created endpoint", "id", ep.ID, "container", ep.ContainerID, "interface", ep.IfName,
		"host-interface", ep.HostIfName, "ipv4", ep.IPv4, "ipv6", ep.IPv6, slog.Group("live", live...),
		slog.Group("steps", steps.out...), slog.Group("request", steps.request...))
	return ep, nil
}

// writeStateAsync starts writing ep's state file in phase ph and returns
// what waits for the write to end, with its error.
func (m *Manager) writeStateAsync(ep *Endpoint, ph phase) func() error {
	ep = ep.Clone()
	done := make(chan error, 1)
	go func() { done <- m.states.write(ep, ph) }()
	return sync.OnceValue(func() error { return <-done })
}

// stepTimes are how long each step of a creation took, for its log line:
// what a slow ADD spent its time on.
type stepTimes struct {
	last time.Time
	out  []any
	// request is when the API request of the creation was accepted and
	// what it waited before the steps (api.TimesOf); empty for a creation
	// not asked through the API.
	request []any
}

func newStepTimes() *stepTimes { return &stepTimes{last: time.Now()} }

// done ends the step name, begun when the one before ended.
func (s *stepTimes) done(name string) {
	now := time.Now()
	s.out = append(s.out, name, now.Sub(s.last).Round(time.Microsecond))
	s.last = now
}

// undo removes what a failed creation made, in the reverse order.
func (m *Manager) undo(ep *Endpoint) {
	if ep.State == Starting {
		txn := m.db.WriteTxn(m.tbl)
		if _, _, err := m.tbl.Delete(txn, ep); err != nil {
			m.log.Error("Undoing a failed endpoint creation: remove it from the table", "container", ep.ContainerID, "error", err)
		}
		txn.Commit()
	}
	if _, err := unplumb(ep.HostIfName); err != nil {
		m.log.Error("Undoing a failed endpoint creation: remove veth pair", "container", ep.ContainerID, "error", err)
	}
	if err := m.states.remove(ep.ID); err != nil {
		m.log.Error("Undoing a failed endpoint creation: remove state", "container", ep.ContainerID, "error", err)
	}
	if _, err := m.ipam.ReleaseOwner(ep.ContainerID); err != nil {
		m.log.Error("Undoing a failed endpoint creation: release addresses", "container", ep.ContainerID, "error", err)
	}
}

// checkPodNetns opens a container's netns, checking that it is a network
// namespace and not the agent's own: an endpoint there would take over the
// host's. The caller closes it.
func checkPodNetns(ctx context.Context, path string) (netns.NsHandle, error) {
	ns, err := openNetns(ctx, path)
	if err != nil {
		return netns.None(), errorf(ErrInvalid, "%s", err)
	}
	self, err := netns.Get()
	if err != nil {
		ns.Close()
		return netns.None(), fmt.Errorf("the agent's own netns: %w", err)
	}
	defer self.Close()
	if ns.Equal(self) {
		ns.Close()
		return netns.None(), errorf(ErrInvalid, "netns %s is the host's network namespace, not a container's", path)
	}
	return ns, nil
}

// reserveID takes the lowest endpoint ID that no endpoint in the table
// has and no other creation has taken; unreserveID gives it back once the
// endpoint is in the table, or its creation undone.
func (m *Manager) reserveID() (uint16, error) {
	m.idMu.Lock()
	defer m.idMu.Unlock()
	// Read under idMu: an ID leaves reservedIDs only after its endpoint is
	// in the table, so this transaction sees it in one or the other.
	id, err := freeID(m.tbl.All(m.db.ReadTxn()), m.reservedIDs)
	if err != nil {
		return 0, err
	}
	m.reservedIDs[id] = true
	return id, nil
}

func (m *Manager) unreserveID(id uint16) {
	m.idMu.Lock()
	delete(m.reservedIDs, id)
	m.idMu.Unlock()
}

// freeID is the lowest endpoint ID that neither an endpoint of eps (in ID
// order) nor reserved has.
func freeID(eps iter.Seq2[*Endpoint, statedb.Revision], reserved map[uint16]bool) (uint16, error) {
	next := 1
	for ep := range eps {
		for next < int(ep.ID) && reserved[uint16(next)] {
			next++
		}
		if next < int(ep.ID) {
			break
		}
		next = int(ep.ID) + 1
	}
	for next < 1<<16-1 && reserved[uint16(next)] {
		next++
	}
	if next >= 1<<16-1 {
		return 0, errorf(ErrExhausted, "every endpoint ID is in use (%d endpoints)", 1<<16-2)
	}
	return uint16(next), nil
}

// leftovers removes what a creation for containerID that the agent did not
// finish left, or what an orphan (see claimOrphans) has: the host side of
// its veth pair and its addresses.
func (m *Manager) leftovers(containerID string) (removedLink bool, released []netip.Addr, err error) {
	removedLink, err = unplumb(HostIfName(containerID))
	if err != nil {
		return false, nil, err
	}
	released, err = m.releaseLeftoverAddresses(containerID)
	m.logLeftovers(containerID, removedLink, released)
	return removedLink, released, err
}

// releaseLeftoverAddresses is leftovers without the look for a veth pair
// and the log: it releases containerID's addresses and forgets it as an
// orphan.
func (m *Manager) releaseLeftoverAddresses(containerID string) ([]netip.Addr, error) {
	released, err := m.ipam.ReleaseOwner(containerID)
	if err != nil {
		return nil, err
	}
	m.problemsMu.Lock()
	if _, ok := m.orphans[containerID]; ok {
		delete(m.orphans, containerID)
		m.reportProblems()
	}
	m.problemsMu.Unlock()
	return released, nil
}

// logLeftovers logs what was removed of an unfinished creation of
// containerID, if anything: its veth pair, its addresses.
func (m *Manager) logLeftovers(containerID string, removedLink bool, released []netip.Addr) {
	if removedLink || len(released) > 0 {
		m.log.Info("Removed what an unfinished endpoint creation left", "container", containerID,
			"host-interface", HostIfName(containerID), "removed-interface", removedLink, "released", released)
	}
}

// podMeta is what the API server says of a pod, when it has told.
func (m *Manager) podMeta(namespace, name string) (podMeta, bool) {
	if m.pods == nil || name == "" {
		return podMeta{}, false
	}
	return m.pods.lookup(namespace, name)
}

// routers are the router addresses of the pools.
func (m *Manager) routers() []netip.Addr {
	var out []netip.Addr
	for _, p := range m.ipam.Pools() {
		out = append(out, p.Router)
	}
	return out
}

// attachPrograms attaches the datapath's programs to a new endpoint's host
// side, if the agent has a loader, and says whether they are attached; a
// failure is left to the loader's reconciler, which retries.
func (m *Manager) attachPrograms(ep *Endpoint) bool {
	if m.programs == nil {
		return false
	}
	h, _, release, err := m.plumb.host.get()
	if err == nil {
		err = m.programs.AttachPrograms(h, ep)
		release()
	}
	if err != nil {
		m.log.Warn("Attaching a new endpoint's programs failed; the loader's reconciler retries",
			"id", ep.ID, "container", ep.ContainerID, "host-interface", ep.HostIfName, "error", err)
		return false
	}
	return true
}

// insert puts ep in the table, for the datapath to pick up: the endpoint
// map and the programs on its host-side interface; it returns the
// revision it was written at. programsAttached says a creation attached
// its programs already: then its Programs status is done.
func (m *Manager) insert(ep *Endpoint, programsAttached bool) (statedb.Revision, error) {
	ep = ep.Clone()
	ep.MapStatus = reconciler.StatusPending()
	ep.ProgramStatus = reconciler.StatusPending()
	if programsAttached {
		ep.ProgramStatus = reconciler.StatusDone()
	}
	txn := m.db.WriteTxn(m.tbl)
	defer txn.Abort()
	if _, _, err := m.tbl.Insert(txn, ep); err != nil {
		return 0, err
	}
	_, rev, _ := m.tbl.Get(txn, EndpointID.Query(ep.ID))
	txn.Commit()
	return rev, nil
}

// markState moves the endpoint ep in the table from the state from to
// state, with err's text as its error when err is not nil. Nothing the
// datapath reads of it changes: its statuses stay as the reconcilers left
// them. It fails, changing nothing, when ep is gone from the table
// (deleted, or replaced by another endpoint of its ID) or is no longer in
// the state from (a DEL that failed half way made it deleting, say).
func (m *Manager) markState(ep *Endpoint, from, state State, err error) error {
	txn := m.db.WriteTxn(m.tbl)
	defer txn.Abort()
	cur, _, found := m.tbl.Get(txn, EndpointID.Query(ep.ID))
	if !found || !sameEndpoint(cur, ep) {
		return fmt.Errorf("endpoint %d is gone from the table before it was %s", ep.ID, state)
	}
	if cur.State != from {
		return fmt.Errorf("endpoint %d is %s, not %s, when it was to be %s", ep.ID, cur.State, from, state)
	}
	cur = cur.Clone()
	cur.State = state
	if err != nil {
		cur.Error = err.Error()
	}
	if _, _, err := m.tbl.Insert(txn, cur); err != nil {
		return err
	}
	txn.Commit()
	return nil
}

// Selector names an endpoint: by ID, or by container ID when ContainerID
// is set.
type Selector struct {
	ID          uint16
	ContainerID string
	// IfName, when set, is the endpoint's interface in the container:
	// Delete deletes only an endpoint with that interface (a CNI DEL names
	// the attachment, container and interface). Lookup ignores it.
	IfName string
}

// notFound is the error for an endpoint s names that does not exist.
func (s Selector) notFound() error {
	if s.ContainerID != "" && s.IfName != "" {
		return errorf(ErrNotFound, "container %s has no endpoint with interface %s", s.ContainerID, s.IfName)
	}
	if s.ContainerID != "" {
		return errorf(ErrNotFound, "container %s has no endpoint", s.ContainerID)
	}
	return errorf(ErrNotFound, "no endpoint %d", s.ID)
}

// Lookup returns the endpoint s names.
func (m *Manager) Lookup(s Selector) (*Endpoint, bool) {
	txn := m.db.ReadTxn()
	if s.ContainerID != "" {
		ep, _, found := m.tbl.Get(txn, EndpointContainerID.Query(s.ContainerID))
		return ep, found
	}
	ep, _, found := m.tbl.Get(txn, EndpointID.Query(s.ID))
	return ep, found
}

// Deleted is what a Delete removed.
type Deleted struct {
	// Endpoint is nil when there was no endpoint, only leftovers of an
	// unfinished creation.
	Endpoint *Endpoint
	Released []netip.Addr
}

// Delete removes an endpoint: its veth pair (and with it the pod's
// interface and every route through them), its state, its addresses. For a
// container without an endpoint it removes what an unfinished creation
// left; with nothing at all to remove it is an ErrNotFound error, which a
// CNI DEL treats as done. With s.IfName set, a container's endpoint with
// another interface is left alone, ErrNotFound too: the interface is
// compared with the container's lock held, so a DEL never removes an
// endpoint an ADD of another attachment made meanwhile.
func (m *Manager) Delete(ctx context.Context, s Selector) (*Deleted, error) {
	if err := m.waitRestored(ctx); err != nil {
		return nil, err
	}
	containerID := s.ContainerID
	for containerID == "" {
		// By ID: the lock is the container's, so the endpoint is looked up
		// again with it held, and must still be that container's.
		ep, found := m.Lookup(s)
		if !found {
			return nil, s.notFound()
		}
		unlock, err := m.locks.lockContainer(ctx, ep.ContainerID)
		if err != nil {
			return nil, err
		}
		if cur, found := m.Lookup(s); found && cur.ContainerID != ep.ContainerID {
			unlock() // the ID went to another container meanwhile
			continue
		}
		defer unlock()
		containerID = ep.ContainerID
	}
	if s.ContainerID != "" {
		unlock, err := m.locks.lockContainer(ctx, containerID)
		if err != nil {
			return nil, err
		}
		defer unlock()
	}

	ep, found := m.Lookup(s)
	if found && s.IfName != "" && ep.IfName != s.IfName {
		// Another attachment of the container: not this DEL's. Its
		// leftovers are the endpoint's veth pair and addresses: none.
		return nil, errorf(ErrNotFound, "container %s has no endpoint with interface %s (its endpoint's interface is %s)",
			s.ContainerID, s.IfName, ep.IfName)
	}
	if !found {
		if s.ContainerID != "" {
			removedLink, released, err := m.leftovers(s.ContainerID)
			if err != nil {
				return nil, err
			}
			if removedLink || len(released) > 0 {
				return &Deleted{Released: released}, nil
			}
		}
		return nil, s.notFound()
	}
	released, err := m.deleteSteps(ep)
	if err != nil {
		// Half deleted: not ready any more, and not gone. The runtime
		// retries the DEL, which does the steps again (each is
		// idempotent).
		failed := ep.Clone()
		failed.State, failed.Error = Deleting, err.Error()
		if _, ierr := m.insert(failed, false); ierr != nil {
			m.log.Error("Mark the endpoint deleting", "id", ep.ID, "container", ep.ContainerID, "error", ierr)
		}
		m.log.Error("Endpoint deletion failed half way; a retried DEL finishes it", "id", ep.ID, "container", ep.ContainerID, "error", err)
		return nil, err
	}
	txn := m.db.WriteTxn(m.tbl)
	defer txn.Abort()
	if _, _, err := m.tbl.Delete(txn, ep); err != nil {
		return nil, err
	}
	txn.Commit()
	m.releaseIdentity(ep)
	m.problemsMu.Lock()
	if _, ok := m.outside[ep.ContainerID]; ok {
		delete(m.outside, ep.ContainerID)
		m.reportProblems()
	}
	m.problemsMu.Unlock()
	m.log.Info("Deleted endpoint", "id", ep.ID, "container", ep.ContainerID, "released", released)
	return &Deleted{Endpoint: ep, Released: released}, nil
}

// deleteSteps removes an endpoint's veth pair, state and addresses. The
// state file says "deleting" first, so that a restart in the middle
// finishes the deletion rather than make the veth pair again.
func (m *Manager) deleteSteps(ep *Endpoint) ([]netip.Addr, error) {
	if err := m.states.write(ep, phaseDeleting); err != nil {
		return nil, err
	}
	if _, err := unplumb(ep.HostIfName); err != nil {
		return nil, err
	}
	if err := m.states.remove(ep.ID); err != nil {
		return nil, err
	}
	return m.ipam.ReleaseOwner(ep.ContainerID)
}

// Check lists how an endpoint's interfaces, addresses and routes differ
// from what the agent made; nothing when it is intact. It waits while the
// restore runs, as long as ctx allows: before, a running pod's endpoint
// is not in the table yet.
func (m *Manager) Check(ctx context.Context, s Selector) (*Endpoint, []string, error) {
	if err := m.waitRestored(ctx); err != nil {
		return nil, nil, err
	}
	ep, found := m.Lookup(s)
	if !found {
		return nil, nil, s.notFound()
	}
	problems := verify(ep, m.routers())
	if ep.State != Ready {
		problems = append([]string{fmt.Sprintf("endpoint is %s: %s", ep.State, ep.Error)}, problems...)
	}
	return ep, problems, nil
}

// restore brings back the endpoints on disk, before any new endpoint can
// get an address (see ipam.IPAM.RegisterRestorer):
//
//   - a state file still "creating" is a creation the agent did not finish:
//     what it made is removed and its addresses released;
//   - a state file "deleting" is a DEL the agent did not finish: it is
//     finished;
//   - an endpoint whose netns is gone is removed, its addresses released;
//   - every other endpoint claims its addresses; then, once the pools are
//     known, its interfaces, addresses and routes are checked and fixed
//     where they differ (a pod whose veth pair was removed gets a new one),
//     and it is inserted in the table, from which the endpoint map is
//     rebuilt.
func (m *Manager) restore(ctx context.Context, h cell.Health) error {
	// The MTU of a veth pair the restore makes again is read from the
	// devices (Manager.mtu): not before they are listed. An intact pair
	// keeps its own, so a restore with nothing to make again does not wait
	// for them.
	mtu := func() (int, error) {
		if !m.devicesListed() {
			h.OK("Waiting for the node's devices and addresses to be listed: the MTU of a veth pair made again")
			if err := m.waitDevices(ctx); err != nil {
				return 0, err
			}
		}
		return m.plumb.mtu(), nil
	}
	starting, err := m.restoreLocked(ctx, mtu)
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	for _, s := range starting {
		wg.Go(func() { m.routeRestored(ctx, s.ep, s.rev) })
	}
	wg.Wait()
	return nil
}

// startingEndpoint is a restored endpoint whose host side is down, and the
// revision it was inserted at.
type startingEndpoint struct {
	ep  *Endpoint
	rev statedb.Revision
}

// restoreLocked is the restore with the whole manager locked. It returns
// the endpoints whose host side it made again or found down: they are in
// the table as Starting, for routeRestored. mtu is the MTU of a veth pair
// it makes again (see plumb).
func (m *Manager) restoreLocked(ctx context.Context, mtu func() (int, error)) ([]startingEndpoint, error) {
	if err := m.locks.lockAll(ctx); err != nil {
		return nil, err
	}
	defer m.locks.unlockAll()
	start := time.Now()

	files, err := m.states.load()
	if err != nil {
		return nil, err
	}
	var keep []*Endpoint
	rolledBack, gone := 0, 0
	for _, f := range files {
		ep := f.endpoint()
		switch {
		case f.Phase == phaseCreating:
			if err := m.remove(ep); err != nil {
				return nil, err
			}
			rolledBack++
			m.log.Warn("Rolled back an endpoint whose creation did not finish before the agent stopped",
				"id", ep.ID, "container", ep.ContainerID, "addresses", ep.IPs())
		case f.Phase == phaseDeleting:
			if err := m.remove(ep); err != nil {
				return nil, err
			}
			rolledBack++
			m.log.Warn("Finished deleting an endpoint whose DEL did not finish before the agent stopped",
				"id", ep.ID, "container", ep.ContainerID, "released", ep.IPs())
		case !netnsExists(ctx, ep.Netns):
			if err := m.remove(ep); err != nil {
				return nil, err
			}
			gone++
			m.log.Info("Removed an endpoint whose network namespace is gone",
				"id", ep.ID, "container", ep.ContainerID, "netns", ep.Netns, "released", ep.IPs())
		default:
			if err := m.claim(ep); err != nil {
				if err := m.states.quarantine(m.states.endpointDir(ep.ID), err); err != nil {
					return nil, err
				}
				continue
			}
			keep = append(keep, ep)
		}
	}
	// A pod whose state file was moved aside above still has its veth pair
	// and its addresses: they are kept for it, not released after the
	// grace period to be given to the next ADD while it still uses them.
	orphans, err := m.claimOrphans()
	if err != nil {
		return nil, err
	}
	m.problemsMu.Lock()
	if m.orphans == nil {
		m.orphans = map[string]orphan{}
	}
	for _, o := range orphans {
		m.orphans[o.containerID] = o
	}
	m.moved = append(m.moved, m.states.takeMoved()...)
	m.problemsMu.Unlock()
	// Every address held before the restart is claimed: new endpoints may
	// get addresses from here on.
	m.ipamRestored()
	if err := m.ipam.WaitReady(ctx); err != nil {
		return nil, err
	}

	routers := m.routers()
	m.problemsMu.Lock()
	m.checkPools(keep)
	m.problemsMu.Unlock()
	host, err := readHost()
	if err != nil {
		return nil, err
	}
	// Identities are taken again by labels before the endpoints are ready,
	// all within one timeout; an endpoint keeps the number it had while the
	// allocator cannot answer.
	before := make(map[uint16]Endpoint, len(keep))
	for _, ep := range keep {
		before[ep.ID] = *ep
		if meta, ok := m.podMeta(ep.PodNamespace, ep.PodName); ok {
			meta.apply(ep)
		}
	}
	m.acquireIdentities(ctx, keep)
	done := false
	defer func() {
		if !done { // the job retries the whole restore
			for _, ep := range keep {
				m.releaseIdentity(ep)
			}
		}
	}()
	notReady := 0
	var starting []startingEndpoint
	for _, ep := range keep {
		before := before[ep.ID]
		up, err := m.plumb.plumb(ep, netns.None(), routers, host, true, mtu)
		if err != nil {
			notReady++
			ep.State, ep.Error = NotReady, err.Error()
			m.log.Error("Restored endpoint could not be brought back; its addresses stay reserved",
				"id", ep.ID, "container", ep.ContainerID, "error", err)
		} else {
			// A host side made again, or found down, is routed once the
			// datapath has the endpoint, as a creation's is.
			ep.State = Ready
			if !up {
				ep.State = Starting
			}
			newVeth := ep.HostIfIndex != before.HostIfIndex || ep.MAC.String() != before.MAC.String()
			if newVeth {
				m.log.Info("Restored endpoint got a new veth pair", "id", ep.ID, "container", ep.ContainerID,
					"host-interface", ep.HostIfName, "ifindex", ep.HostIfIndex)
			}
			if newVeth || !sameIdentityInputs(ep, &before) || ep.Identity != before.Identity {
				if err := m.states.write(ep, phaseReady); err != nil {
					return nil, err
				}
			}
		}
		rev, err := m.insert(ep, false)
		if err != nil {
			return nil, err
		}
		if ep.State == Starting {
			starting = append(starting, startingEndpoint{ep, rev})
		}
	}
	if err := m.ids.RestoreDone(); err != nil {
		return nil, err
	}
	txn := m.db.WriteTxn(m.tbl)
	m.tableRestored(txn)
	txn.Commit()
	m.ready()
	done = true

	m.log.Info("Restored endpoints", "restored", len(keep), "not-ready", notReady,
		"rolled-back", rolledBack, "netns-gone", gone, "duration", time.Since(start))
	// On the module, not the job: the job's scope goes when it ends.
	if notReady > 0 {
		m.health.Degraded(fmt.Sprintf("Restored %d endpoint(s), %d not ready", len(keep), notReady),
			errors.New("restored endpoints could not be brought back: agent endpoint list shows why"))
	} else {
		m.health.OK(fmt.Sprintf("Restored %d endpoint(s)", len(keep)))
	}
	m.problemsMu.Lock()
	m.reportProblems()
	m.problemsMu.Unlock()
	return starting, nil
}

// routeRestored finishes a restored endpoint whose host side is down (made
// again, say, after its veth pair was deleted while the agent was down) as
// a creation finishes: once every LiveCondition holds (its programs
// attached, its policy in the maps), it brings the host side up with the
// host's routes to the pod, and marks it ready. Until then nothing reaches
// the pod. What fails leaves it not ready, with the error.
//
// The wait is without the container's lock, which the endpoint's DEL (or
// a retried ADD, answered ErrExists while it is starting) takes at once.
// The lock is held only to route it: with it, the endpoint must still be
// this one and starting, and live as it is now (a label change during the
// wait may have given it another identity, whose policy it then waits
// for), else it is left alone or waited for again. A DEL during the wait
// removes the veth pair, the state and the addresses, and the row, which
// ends the wait: the endpoint is never routed.
func (m *Manager) routeRestored(ctx context.Context, ep *Endpoint, rev statedb.Revision) {
	// Past the bound, health says what it waits for; it keeps waiting.
	after := make(chan struct{})
	timer := time.AfterFunc(m.liveReport, func() { close(after) })
	defer timer.Stop()
	defer m.reportStalled(ep.ContainerID, "", true)
	stall := &liveStall{after: after, report: func(cur *Endpoint, pending []string) {
		m.reportStalled(ep.ContainerID, fmt.Sprintf("endpoint %d (container %s, pod %s/%s) waits for %s",
			cur.ID, cur.ContainerID, cur.PodNamespace, cur.PodName, strings.Join(pending, "; ")), false)
	}}
	for {
		live, err := m.waitLive(ctx, ep, rev, stall)
		if err == nil {
			var routed bool
			routed, err = m.routeIfLive(ctx, ep, &rev)
			if err == nil && !routed {
				continue
			}
		}
		switch {
		case errors.Is(err, errEndpointGone):
			m.log.Info("Restored endpoint deleted while it waited to be live; not routed", "id", ep.ID, "container", ep.ContainerID)
			return
		case err != nil && ctx.Err() != nil:
			m.log.Warn("Restored endpoint not routed: the agent stops", "id", ep.ID, "container", ep.ContainerID, "error", err)
			return
		case err != nil:
			m.log.Error("Restored endpoint could not be routed; its host side stays down", "id", ep.ID, "container", ep.ContainerID, "error", err)
			m.markState(ep, Starting, NotReady, err) // a deleted (or deleting) endpoint keeps its own
			return
		}
		m.log.Info("Restored endpoint routed once live in the datapath", "id", ep.ID, "container", ep.ContainerID,
			"host-interface", ep.HostIfName, slog.Group("live", live...))
		return
	}
}

// routeIfLive routes the restored endpoint ep and marks it ready, with its
// container's lock held, if it is still that endpoint, starting, and live
// as its row is now. routed is false when it must be waited for again:
// not live any more, or its identity changed since the wait began, when
// *rev becomes the revision of the row that changed it.
func (m *Manager) routeIfLive(ctx context.Context, ep *Endpoint, rev *statedb.Revision) (routed bool, err error) {
	unlock, err := m.locks.lockContainer(ctx, ep.ContainerID)
	if err != nil {
		return false, err
	}
	defer unlock()
	cur, curRev, found := m.tbl.Get(m.db.ReadTxn(), EndpointID.Query(ep.ID))
	if !found || !sameEndpoint(cur, ep) || cur.State != Starting {
		return false, errEndpointGone
	}
	if cur.Identity != ep.Identity || cur.IdentityPending != ep.IdentityPending {
		*ep, *rev = *cur, curRev
		return false, nil
	}
	if len(m.pendingLive(cur, *rev)) > 0 {
		return false, nil
	}
	if err := m.plumb.routeHost(cur); err != nil {
		return false, err
	}
	return true, m.markState(cur, Starting, Ready, nil)
}

// claim reserves a restored endpoint's addresses for it.
func (m *Manager) claim(ep *Endpoint) error {
	for _, ip := range ep.IPs() {
		if err := m.ipam.Claim(ip, ep.ContainerID); err != nil {
			return err
		}
	}
	return nil
}

// remove takes away an endpoint that is not restored: its veth pair, its
// state and its addresses.
func (m *Manager) remove(ep *Endpoint) error {
	if _, err := unplumb(ep.HostIfName); err != nil {
		return err
	}
	if err := m.states.remove(ep.ID); err != nil {
		return err
	}
	_, err := m.ipam.ReleaseOwner(ep.ContainerID)
	return err
}

// netnsExists says whether a netns path still holds a network namespace.
func netnsExists(ctx context.Context, path string) bool {
	ns, err := openNetns(ctx, path)
	if err != nil {
		return !errors.Is(err, errNetnsGone)
	}
	ns.Close()
	return true
}

// Endpoints are every endpoint, by ID.
func (m *Manager) Endpoints() []*Endpoint {
	var out []*Endpoint
	for ep := range m.tbl.All(m.db.ReadTxn()) {
		out = append(out, ep)
	}
	return out
}
