package ipam

import (
	"context"
	"net/netip"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/cilium/statedb"
)

// Request asks for an address for Owner: IP if it is valid, else the next
// free address of Family.
type Request struct {
	Owner  string
	Family Family
	IP     netip.Addr
	// Reserved allocations are kept across restarts without an owner
	// claiming them: for addresses reserved by hand. Others must be
	// claimed after a restart (see Claim) or are released after the
	// grace period.
	Reserved bool
	// Recorded says that the owner keeps the allocation durably itself
	// before it uses the address: the endpoint manager writes it into the
	// endpoint's state file, synced, before it touches the kernel, and
	// claims it from there after a restart (Claim records an allocation
	// whose file is missing). The IPAM's own file is then written without
	// waiting for the disk. It survives a crash of the agent, which is
	// what it is kept for (the addresses of an ADD that died before its
	// state file, of a pod whose state file was lost); a crash of the
	// kernel or a power loss, which may take it, takes every pod's
	// network namespace with it.
	Recorded bool
}

// maxOwnerLen bounds an owner string: container IDs are 64 characters.
const maxOwnerLen = 256

// Allocate allocates an address and persists the allocation before it
// returns, so that it survives a crash of the agent. It waits until the
// IPAM is ready (see WaitReady), as long as ctx allows.
func (i *IPAM) Allocate(ctx context.Context, req Request) (*Allocation, error) {
	if err := validOwner(req.Owner); err != nil {
		return nil, err
	}
	if err := validAddr(req.IP); err != nil {
		return nil, err
	}
	if !req.IP.IsValid() && req.Family != IPv4 && req.Family != IPv6 {
		return nil, errorf(ErrInvalid, "invalid family %q: want %s or %s, or give an address", req.Family, IPv4, IPv6)
	}
	if err := i.WaitReady(ctx); err != nil {
		return nil, err
	}

	txn := i.db.WriteTxn(i.tbl)
	defer txn.Abort()
	var (
		ip  netip.Addr
		err error
	)
	if req.IP.IsValid() {
		ip, err = i.explicit(txn, req.IP.Unmap())
	} else {
		ip, err = i.next(txn, req.Family)
	}
	if err != nil {
		return nil, err
	}
	state := InUse
	if req.Reserved {
		state = Reserved
	}
	a := &Allocation{IP: ip, Owner: req.Owner, State: state, Since: time.Now()}
	if _, _, err := i.tbl.Insert(txn, a); err != nil {
		return nil, err
	}
	// The row holds the address against every other allocation; the
	// table is free again while the file is written (and synced, unless
	// the owner records it), so that allocations for many pods wait for
	// their disk writes together, not one after the other. The address is
	// in the file before it is returned: a crash before that loses an
	// allocation that nobody was given.
	txn.Commit()
	if err := i.store.write(a, !req.Recorded); err != nil {
		i.unallocate(a)
		return nil, err
	}
	i.log.Debug("Allocated address", "ip", ip, "owner", req.Owner, "state", state)
	return a, nil
}

// unallocate takes back an allocation whose file could not be written:
// the file first, while the row still keeps the address from others.
func (i *IPAM) unallocate(a *Allocation) {
	i.store.remove(a.IP)
	txn := i.db.WriteTxn(i.tbl)
	defer txn.Abort()
	if cur, _, found := i.tbl.Get(txn, AllocationIP.Query(a.IP)); found && cur == a {
		i.tbl.Delete(txn, a)
		txn.Commit()
	}
}

func validOwner(owner string) error {
	if owner == "" || len(owner) > maxOwnerLen {
		return errorf(ErrInvalid, "invalid owner %q: want a non-empty name of at most %d characters, such as a container ID", owner, maxOwnerLen)
	}
	// Owners are shown in tables, logs and file contents: a newline or
	// another control character there would forge or break lines.
	if !utf8.ValidString(owner) || strings.IndexFunc(owner, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
		return errorf(ErrInvalid, "invalid owner %q: want printable characters, without control characters or newlines", owner)
	}
	if owner == RouterOwner {
		return errorf(ErrInvalid, "invalid owner %q: the name is reserved for the router addresses", owner)
	}
	return nil
}

// validAddr refuses an address with a zone (fe80::1%eth0): pod addresses
// have none, and a zoned one never matches an allocation.
func validAddr(ip netip.Addr) error {
	if ip.Zone() != "" {
		return errorf(ErrInvalid, "invalid address %s: pod addresses have no zone (%%%s)", ip, ip.Zone())
	}
	return nil
}

func (i *IPAM) poolOf(family Family) (Pool, bool) {
	i.mu.Lock()
	defer i.mu.Unlock()
	for _, p := range i.pools {
		if p.Family == family {
			return p, true
		}
	}
	return Pool{}, false
}

// explicit checks that ip may be allocated.
func (i *IPAM) explicit(txn statedb.ReadTxn, ip netip.Addr) (netip.Addr, error) {
	pool, ok := i.poolOf(FamilyOf(ip))
	if !ok || !pool.Contains(ip) {
		return netip.Addr{}, errorf(ErrInvalid, "address %s is not in a pod pool (%s)", ip, poolsString(i.Pools()))
	}
	if old, _, found := i.tbl.Get(txn, AllocationIP.Query(ip)); found {
		return netip.Addr{}, errorf(ErrInUse, "address %s is already allocated to %q (%s)", ip, old.Owner, old.State)
	}
	return ip, nil
}

// next finds a free address of the family, searching from the cursor to the
// end of the pool and then from its start.
func (i *IPAM) next(txn statedb.ReadTxn, family Family) (netip.Addr, error) {
	pool, ok := i.poolOf(family)
	if !ok {
		return netip.Addr{}, errorf(ErrInvalid, "no %s pool: the pod pools are %s", family, poolsString(i.Pools()))
	}
	i.mu.Lock()
	from, ok := i.cursor[family]
	i.mu.Unlock()
	if !ok || !pool.Contains(from) {
		from = pool.first()
	}
	ip, found := i.firstFree(txn, from, pool.last())
	if !found && from != pool.first() {
		ip, found = i.firstFree(txn, pool.first(), from.Prev())
	}
	if !found {
		return netip.Addr{}, errorf(ErrExhausted, "%s pool %s is exhausted: all %d addresses are allocated (router included)",
			family, pool.CIDR, pool.Size())
	}
	nextCursor := ip.Next()
	if !pool.Contains(nextCursor) {
		nextCursor = pool.first()
	}
	i.mu.Lock()
	i.cursor[family] = nextCursor
	i.mu.Unlock()
	return ip, nil
}

// firstFree is the lowest address in [lo, hi] that is not allocated. It
// walks the allocations from lo in address order, so its cost grows with
// the allocations, not with the pool.
func (i *IPAM) firstFree(txn statedb.ReadTxn, lo, hi netip.Addr) (netip.Addr, bool) {
	candidate := lo
	for a := range i.tbl.LowerBound(txn, AllocationIP.Query(lo)) {
		if hi.Less(candidate) || candidate.Less(a.IP) {
			break
		}
		candidate = candidate.Next()
	}
	if hi.Less(candidate) || !candidate.IsValid() {
		return netip.Addr{}, false
	}
	return candidate, true
}

// Claim takes over an address that owner held before the agent restarted:
// a restorer calls it for every address of every restored endpoint before
// it marks itself done (see RegisterRestorer). An unclaimed allocation of
// the same owner becomes in use; a missing one (its file was lost) is
// allocated again. An address held by another owner is an ErrInUse error.
// Claim does not wait for readiness: it is how restorers get ready.
func (i *IPAM) Claim(ip netip.Addr, owner string) error {
	if err := validOwner(owner); err != nil {
		return err
	}
	if err := validAddr(ip); err != nil {
		return err
	}
	i.mu.Lock()
	loaded := i.loaded
	i.mu.Unlock()
	if !loaded {
		return errorf(ErrNotReady, "claim of %s before the IPAM state was loaded: claim from a job or start hook of a cell that depends on the IPAM", ip)
	}
	txn := i.db.WriteTxn(i.tbl)
	defer txn.Abort()
	old, _, found := i.tbl.Get(txn, AllocationIP.Query(ip))
	switch {
	case found && (old.Owner != owner || old.State == Releasing):
		return errorf(ErrInUse, "address %s is allocated to %q (%s), not to %q", ip, old.Owner, old.State, owner)
	case found && old.State != Unclaimed:
		return nil
	case found:
		claimed := *old
		claimed.State = InUse
		if _, _, err := i.tbl.Insert(txn, &claimed); err != nil {
			return err
		}
	default:
		a := &Allocation{IP: ip, Owner: owner, State: InUse, Since: time.Now()}
		if err := i.store.write(a, true); err != nil {
			return err
		}
		if _, _, err := i.tbl.Insert(txn, a); err != nil {
			return err
		}
		i.log.Info("Claimed an address whose allocation was not on disk", "ip", ip, "owner", owner)
	}
	txn.Commit()
	return nil
}

// Unclaimed are the allocations made before the restart that no restorer
// has claimed yet.
func (i *IPAM) Unclaimed() []*Allocation {
	var out []*Allocation
	for a := range i.tbl.List(i.db.ReadTxn(), AllocationState.Query(Unclaimed)) {
		out = append(out, a)
	}
	return out
}

// Release returns owner's address ip to the pool. Releasing an address that
// is not allocated is not an error (released is false); releasing another
// owner's is an ErrInUse error.
func (i *IPAM) Release(ip netip.Addr, owner string) (released bool, err error) {
	if err := validAddr(ip); err != nil {
		return false, err
	}
	txn := i.db.WriteTxn(i.tbl)
	defer txn.Abort()
	old, _, found := i.tbl.Get(txn, AllocationIP.Query(ip))
	if !found {
		return false, nil
	}
	if old.State == Releasing {
		return false, nil
	}
	if old.Owner != owner || old.State == Router {
		return false, errorf(ErrInUse, "address %s is allocated to %q (%s), not to %q", ip, old.Owner, old.State, owner)
	}
	if err := i.delete(txn, old); err != nil {
		return false, err
	}
	txn.Commit()
	return true, nil
}

// ReleaseOwner releases every address of owner and returns them, except
// the reserved ones: a reservation made by hand (POST /v1/ipam) goes only
// by hand (DELETE /v1/ipam/{ip}), also when its owner is named like the
// container of an endpoint.
func (i *IPAM) ReleaseOwner(owner string) ([]netip.Addr, error) {
	// Most owners have nothing to release (a CNI ADD looks for leftovers
	// of its container first): that needs no write transaction, which
	// would wait for every allocation being made.
	if _, _, found := i.tbl.Get(i.db.ReadTxn(), AllocationOwner.Query(owner)); !found {
		return nil, nil
	}
	txn := i.db.WriteTxn(i.tbl)
	defer txn.Abort()
	hold := i.holderName() != ""
	var released []netip.Addr
	for a := range i.tbl.List(txn, AllocationOwner.Query(owner)) {
		if a.State == Router || a.State == Reserved || a.State == Releasing {
			continue
		}
		var err error
		if hold {
			err = i.hold(txn, a)
		} else {
			err = i.delete(txn, a)
		}
		if err != nil {
			return nil, err
		}
		released = append(released, a.IP)
	}
	txn.Commit()
	return released, nil
}

// HoldReleases makes the addresses that owners release (ReleaseOwner: an
// endpoint deleted, a creation undone) stay in the table as Releasing,
// handed to no one, until FinishReleases: holder (the conntrack GC)
// deletes what the old owner left that a new one must not inherit before
// the address is used again. Called from a constructor; without it a
// released address is free at once.
func (i *IPAM) HoldReleases(holder string) {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.holder = holder
}

// Releasing are the addresses released and held (HoldReleases), with a
// channel closed when they change.
func (i *IPAM) Releasing() ([]netip.Addr, <-chan struct{}) {
	var out []netip.Addr
	rows, watch := i.tbl.ListWatch(i.db.ReadTxn(), AllocationState.Query(Releasing))
	for a := range rows {
		out = append(out, a.IP)
	}
	return out, watch
}

// FinishReleases frees the held addresses ips: the next allocations may
// hand them out.
func (i *IPAM) FinishReleases(ips []netip.Addr) {
	txn := i.db.WriteTxn(i.tbl)
	defer txn.Abort()
	for _, ip := range ips {
		if a, _, found := i.tbl.Get(txn, AllocationIP.Query(ip)); found && a.State == Releasing {
			i.tbl.Delete(txn, a)
			i.log.Debug("Released address", "ip", a.IP, "owner", a.Owner)
		}
	}
	txn.Commit()
}

// hold releases a: its file goes (a restart frees it), its row stays as
// Releasing until FinishReleases.
func (i *IPAM) hold(txn statedb.WriteTxn, a *Allocation) error {
	if err := i.store.remove(a.IP); err != nil {
		return err
	}
	held := &Allocation{IP: a.IP, Owner: a.Owner, State: Releasing, Since: time.Now()}
	if _, _, err := i.tbl.Insert(txn, held); err != nil {
		return err
	}
	return nil
}

// releaseByHand releases an address for the API: a reserved or unclaimed
// one. In-use addresses belong to endpoints, which release them.
func (i *IPAM) releaseByHand(ip netip.Addr) (*Allocation, error) {
	if err := validAddr(ip); err != nil {
		return nil, err
	}
	txn := i.db.WriteTxn(i.tbl)
	defer txn.Abort()
	old, _, found := i.tbl.Get(txn, AllocationIP.Query(ip))
	switch {
	case !found:
		return nil, errorf(ErrNotFound, "address %s is not allocated", ip)
	case old.State == Router:
		return nil, errorf(ErrInUse, "address %s is the router address of its pool and cannot be released", ip)
	case old.State == InUse:
		return nil, errorf(ErrInUse, "address %s is in use by the endpoint of container %q: delete the endpoint instead", ip, old.Owner)
	case old.State == Releasing:
		return nil, errorf(ErrInUse, "address %s is being released (%s deletes what its last owner %q left first)", ip, i.holderName(), old.Owner)
	}
	if err := i.delete(txn, old); err != nil {
		return nil, err
	}
	txn.Commit()
	return old, nil
}

func (i *IPAM) delete(txn statedb.WriteTxn, a *Allocation) error {
	if err := i.store.remove(a.IP); err != nil {
		return err
	}
	if _, _, err := i.tbl.Delete(txn, a); err != nil {
		return err
	}
	i.log.Debug("Released address", "ip", a.IP, "owner", a.Owner, "state", a.State)
	return nil
}

func (i *IPAM) holderName() string {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.holder
}
