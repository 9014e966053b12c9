package kvstore

import (
	"context"
	"errors"
	"time"
)

// Client is the cluster's shared store as the other cells use it. Keys are
// relative to --kvstore-prefix: "state/identities/v1/id/256" is stored at
// "cellium/state/identities/v1/id/256" with the default prefix.
//
// Every method but Enabled and Status returns ErrDisabled when no kvstore is
// configured, and an error wrapping ErrUnavailable when etcd cannot be
// reached before ctx ends: callers decide whether to wait, retry or fall
// back, the client never blocks past ctx.
type Client interface {
	// Enabled says whether a kvstore is configured (--kvstore=etcd).
	Enabled() bool

	// Get is the value of key; found is false when there is none.
	Get(ctx context.Context, key string) (value []byte, found bool, err error)

	// List is every key under prefix, in key order.
	List(ctx context.Context, prefix string) ([]KeyValue, error)

	// Watch lists every key under prefix as EventUpsert, then sends one
	// EventListed, then every change, until ctx ends; then it closes the
	// channel. When the connection is lost, or the store is found replaced
	// (restored, rebuilt empty), it lists again by itself: the new listing
	// sends EventUpsert for every key that changed or is new and
	// EventDelete for every key seen before that is gone, then EventListed
	// again. A consumer that only needs "listed once" marks its table
	// initializer at the first EventListed.
	Watch(ctx context.Context, prefix string) <-chan Event

	// CreateOnly writes key only if it does not exist; created says whether
	// this call wrote it.
	CreateOnly(ctx context.Context, key string, value []byte, opts ...WriteOption) (created bool, err error)

	// UpdateIfDifferent writes key unless it already holds value (and, with
	// Leased, is already on one of this agent's leases); changed says
	// whether this call wrote it.
	UpdateIfDifferent(ctx context.Context, key string, value []byte, opts ...WriteOption) (changed bool, err error)

	// Delete removes key, and forgets it if it was leased (it is not
	// written again when its lease is lost). A missing key is no error.
	Delete(ctx context.Context, key string) error

	// Txn applies, in one transaction, the writes of the first branch
	// whose conditions all hold, and returns that branch's index, -1 when
	// none held (and nothing was written): a compare-and-swap over several
	// keys in one round trip. The branches may have one Leased write
	// between them, of one key.
	Txn(ctx context.Context, branches ...Branch) (applied int, err error)

	// Lock takes the cluster-wide lock named key, waiting for it until ctx
	// ends. The lock lives on a short lease (about 25 s), so the locks of an
	// agent that dies expire; a lock held in this process for longer than the
	// stale timeout is force-released by the kvstore-locks-gc job.
	Lock(ctx context.Context, key string) (Unlocker, error)

	// TryLock takes the lock named key if nobody holds it, else returns
	// ErrLocked at once.
	TryLock(ctx context.Context, key string) (Unlocker, error)

	// Status is the connection's state now.
	Status() Status
}

// Unlocker releases a lock taken with Lock or TryLock.
type Unlocker interface {
	Unlock(ctx context.Context) error
}

var (
	// ErrDisabled: no kvstore is configured.
	ErrDisabled = errors.New("kvstore disabled (--kvstore is not set)")
	// ErrUnavailable: etcd could not be reached in time.
	ErrUnavailable = errors.New("kvstore unavailable")
	// ErrLocked: TryLock found the lock held.
	ErrLocked = errors.New("lock held by another owner")
)

// KeyValue is one key read from the store.
type KeyValue struct {
	// Key is relative to the prefix, like the keys given to Client.
	Key         string
	Value       []byte
	ModRevision int64
	// Lease is the etcd lease the key is attached to, 0 for none.
	Lease int64
}

// EventKind says what an Event reports.
type EventKind uint8

const (
	// EventUpsert: the key was created or changed (or listed).
	EventUpsert EventKind = iota
	// EventDelete: the key is gone; Value is nil.
	EventDelete
	// EventListed: every key that existed when the listing began has been
	// sent. Key and Value are empty.
	EventListed
)

func (k EventKind) String() string {
	switch k {
	case EventUpsert:
		return "upsert"
	case EventDelete:
		return "delete"
	case EventListed:
		return "listed"
	}
	return "unknown"
}

// Event is one change seen by Watch.
type Event struct {
	Kind EventKind
	// Key is relative to the prefix.
	Key   string
	Value []byte
	// CreateRevision is the store's revision at which an upserted key was
	// created: of two keys, the one with the lower was there first, which a
	// consumer can trust across restarts (a claim's age).
	CreateRevision int64
}

// Branch is one alternative of a Txn: its writes, if its conditions hold.
type Branch struct {
	If   []Cond
	Then []Op
}

// Cond is a condition of a Txn, on one key or on every key under a prefix.
type Cond struct {
	key    string
	prefix bool
	kind   condKind
	value  []byte
	rev    int64
}

type condKind uint8

const (
	condAbsent condKind = iota
	condValue
	condValueNot
	condModRevision
)

// Absent holds when key does not exist.
func Absent(key string) Cond { return Cond{key: key, kind: condAbsent} }

// NoneUnder holds when no key exists under prefix.
func NoneUnder(prefix string) Cond { return Cond{key: prefix, prefix: true, kind: condAbsent} }

// ValueIs holds when key exists and holds value.
func ValueIs(key string, value []byte) Cond { return Cond{key: key, kind: condValue, value: value} }

// EveryValueUnder holds when there are keys under prefix and all of them
// hold value.
func EveryValueUnder(prefix string, value []byte) Cond {
	return Cond{key: prefix, prefix: true, kind: condValue, value: value}
}

// EveryValueUnderIsNot holds when there are keys under prefix and none of
// them holds value.
func EveryValueUnderIsNot(prefix string, value []byte) Cond {
	return Cond{key: prefix, prefix: true, kind: condValueNot, value: value}
}

// ModRevisionIs holds when key was last written at revision rev (a
// KeyValue's ModRevision).
func ModRevisionIs(key string, rev int64) Cond {
	return Cond{key: key, kind: condModRevision, rev: rev}
}

// Op is a write of a Txn.
type Op struct {
	key    string
	value  []byte
	delete bool
	leased bool
}

// Put writes key; with Leased it goes on one of the agent's leases, as with
// UpdateIfDifferent.
func Put(key string, value []byte, opts ...WriteOption) Op {
	return Op{key: key, value: value, leased: writeOpts(opts).leased}
}

// Del deletes key.
func Del(key string) Op { return Op{key: key, delete: true} }

// WriteOption changes how CreateOnly, UpdateIfDifferent and Put write.
type WriteOption func(*writeOptions)

type writeOptions struct {
	leased bool
}

// Leased attaches the key to one of the agent's leases (at most 1000 keys
// each, renewed while the agent lives, --kvstore-lease-ttl): the key goes
// away when the agent does, and is written again with the same value when
// its lease is lost while the agent runs.
func Leased() WriteOption { return func(o *writeOptions) { o.leased = true } }

// State is the connection's state.
type State string

const (
	StateDisabled   State = "disabled"
	StateConnecting State = "connecting"
	StateConnected  State = "connected"
	// StateQuorumLost: the client reaches an endpoint but the cluster
	// cannot answer a linearizable read.
	StateQuorumLost State = "quorum-lost"
)

// Status is what `agent status` and the health tree show of the kvstore.
type Status struct {
	State     State     `json:"state"`
	Endpoints []string  `json:"endpoints,omitempty"`
	LastError string    `json:"lastError,omitempty"`
	Since     time.Time `json:"since"`
	// Leases and LeasedKeys count this agent's leases and the keys on them.
	Leases     int `json:"leases"`
	LeasedKeys int `json:"leasedKeys"`
}
