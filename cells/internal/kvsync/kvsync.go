// Package kvsync is the one "kvstore prefix → table" loop of the cells
// that share state through the kvstore (nodes, ipcache, identity), and the
// one way an agent keeps the keys it owns as it wrote them.
//
// The contract:
//
//   - [Follow] reads a prefix's watch and hands its consumer, a batch at a
//     time, the keys as they now are: each accepted key with its parsed
//     value, each gone key as a deletion.
//   - One rule for a bad key (a value larger than the rule's bound, or one
//     its Parse refuses): the key is refused. A refused key that was
//     accepted before is handed on as a deletion, so the stale claim goes
//     with it; nothing else changes. Every refusal is logged with the key
//     and why, and the keys refused now are named in the follower's health
//     (Degraded) until they are fixed or deleted, as cells/internal/refused
//     keeps and names them.
//   - An [Owner] holds the keys this agent writes under a prefix and their
//     values. It writes what changes, leased, and deletes what it no longer
//     wants; when the follower sees one of its keys deleted or holding
//     another value (anyone else's write, whatever it says), the Owner
//     writes its value back on its lease. Each such repair is logged with
//     the key and counted in cellium_kvstore_repairs_total{module}.
//
// A cell that publishes and follows keys:
//
//	owner := kvsync.NewOwner(log, kv, repairs, "node")
//	jobs.Add(job.OneShot("kvstore-write", owner.Run))
//	jobs.Add(job.OneShot("kvstore-watch", func(ctx context.Context, h cell.Health) error {
//		return kvsync.Follow(ctx, kv, log, h, rule, owner, func(changes []kvsync.Change[Spec], listed bool) { ... })
//	}))
//	owner.Want(map[string][]byte{"state/nodes/v1/node-1": value})
package kvsync

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cellium/cellium/cells/internal/chans"
	"github.com/cellium/cellium/cells/internal/refused"
	"github.com/cellium/cellium/cells/kvstore"
)

// Rule says which keys under a prefix a follower accepts.
type Rule[T any] struct {
	// Prefix is the keys' prefix, relative to --kvstore-prefix.
	Prefix string
	// MaxValue bounds a value's size in bytes.
	MaxValue int
	// Parse reads a key and its value; an error refuses the key and says
	// why (the key is named by the follower).
	Parse func(key string, value []byte) (T, error)
	// What names the keys in logs and health: "node key", "ipcache key".
	What string
}

// Change is one key as it now is: accepted with Value, or Deleted (gone,
// or refused after it had been accepted).
type Change[T any] struct {
	Key     string
	Value   T
	Deleted bool
	// CreateRevision is when the key was created (kvstore.Event's).
	CreateRevision int64
}

// batchMax bounds the events applied in one call of the consumer: a
// listing of 100,000 keys is a hundred calls, not 100,000.
const batchMax = 1024

// Follow follows r.Prefix until ctx ends: it calls apply with each batch
// of changes (listed is true once the listing is complete, then with each
// later batch), and passes every event to owner (nil for none) so that it
// can put its keys back. Health says how many keys are followed, or names
// the refused ones.
func Follow[T any](ctx context.Context, kv kvstore.Client, log *slog.Logger, health cell.Health, r Rule[T], owner *Owner,
	apply func(changes []Change[T], listed bool)) error {
	accepted := map[string]bool{}
	bad := refused.New(log, nil, r.What)
	listed := false
	var changes []Change[T]
	for batch := range chans.Batches(kv.Watch(ctx, r.Prefix), batchMax) {
		changes = changes[:0]
		firstListed := false
		for _, ev := range batch {
			if owner != nil {
				owner.observe(ev)
			}
			switch ev.Kind {
			case kvstore.EventListed:
				firstListed = firstListed || !listed
				listed = true
			case kvstore.EventDelete:
				bad.Note(ev.Key, nil)
				if accepted[ev.Key] {
					delete(accepted, ev.Key)
					changes = append(changes, Change[T]{Key: ev.Key, Deleted: true})
				}
			case kvstore.EventUpsert:
				v, err := parse(r, ev.Key, ev.Value)
				if err != nil {
					bad.Note(ev.Key, err)
					if accepted[ev.Key] {
						// What it said before no longer holds.
						delete(accepted, ev.Key)
						changes = append(changes, Change[T]{Key: ev.Key, Deleted: true})
					}
					continue
				}
				bad.Note(ev.Key, nil)
				accepted[ev.Key] = true
				changes = append(changes, Change[T]{Key: ev.Key, Value: v, CreateRevision: ev.CreateRevision})
			}
		}
		if len(changes) > 0 || firstListed {
			apply(changes, listed)
		}
		if !listed {
			continue
		}
		if bad.Len() == 0 {
			health.OK(fmt.Sprintf("Following %d %ss", len(accepted), r.What))
			continue
		}
		health.Degraded(fmt.Sprintf("Following %d %ss, %d refused", len(accepted), r.What, bad.Len()), bad.Err())
	}
	return nil
}

// parse applies the rule's bound and its Parse to a key.
func parse[T any](r Rule[T], key string, value []byte) (T, error) {
	if r.MaxValue > 0 && len(value) > r.MaxValue {
		var zero T
		return zero, fmt.Errorf("value of %d bytes, more than the %d a %s may hold", len(value), r.MaxValue, r.What)
	}
	return r.Parse(key, value)
}

// Repairs is cellium_kvstore_repairs_total{module} for one module: its
// keys put back after someone else changed or deleted them. Each module
// registers its own, under the same name with its module label, as
// cellium_kernel_repairs_total (cells/internal/drift) is.
type Repairs struct{ prometheus.Counter }

// NewRepairs is the repairs counter of module (its id), for the module's
// metrics group.
func NewRepairs(module string) *Repairs {
	return &Repairs{prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "cellium", Subsystem: "kvstore", Name: "repairs_total",
		Help:        "kvstore keys of this agent put back after someone else changed or deleted them, by owning module",
		ConstLabels: prometheus.Labels{"module": module},
	})}
}

// Owner holds the keys this agent owns under a prefix, writes them
// (leased) when they change and puts them back when someone else does.
type Owner struct {
	log     *slog.Logger
	kv      kvstore.Client
	repairs *Repairs
	// what names the keys in logs: "node key", "pod address key".
	what string

	mu   sync.Mutex
	want map[string][]byte
	// written is what this agent last wrote of each key.
	written map[string][]byte
	// suspect are keys the follower saw deleted or changed.
	suspect map[string]bool
	wake    chan struct{}
}

// NewOwner makes an Owner; its Run job does the writing.
func NewOwner(log *slog.Logger, kv kvstore.Client, repairs *Repairs, what string) *Owner {
	return &Owner{log: log, kv: kv, repairs: repairs, what: what,
		want: map[string][]byte{}, written: map[string][]byte{}, suspect: map[string]bool{}, wake: make(chan struct{}, 1)}
}

// Want makes keys (key → value) every key the Owner owns: Run writes
// those that differ from what it wrote and deletes the others.
func (o *Owner) Want(keys map[string][]byte) {
	o.mu.Lock()
	o.want = keys
	o.mu.Unlock()
	o.signal()
}

func (o *Owner) signal() {
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// observe marks an owned key that an event shows deleted or written, for
// Run to look at. A write of the wanted value is looked at too: it may
// have taken the key off this node's lease (a key that would then outlive
// the node). This agent's own writes come back as events as well; Run
// tells them apart at the cost of one comparison in etcd (a write that
// finds the key as wanted, on its lease, changes nothing and is no repair).
func (o *Owner) observe(ev kvstore.Event) {
	if ev.Kind == kvstore.EventListed {
		return
	}
	o.mu.Lock()
	_, mark := o.want[ev.Key]
	if mark {
		o.suspect[ev.Key] = true
	}
	o.mu.Unlock()
	if mark {
		o.signal()
	}
}

// Run writes the owned keys until ctx ends: on each change of what is
// wanted, the keys whose value changed and the deletions; for each key
// the follower saw changed, its value again, logged and counted when the
// write found it changed. A failure is retried a second later.
func (o *Owner) Run(ctx context.Context, health cell.Health) error {
	for {
		err := o.sync(ctx)
		var retry <-chan time.Time
		if err != nil {
			health.Degraded(fmt.Sprintf("Writing this node's %ss to the kvstore", o.what), err)
			retry = time.After(time.Second)
		} else {
			o.mu.Lock()
			n := len(o.written)
			o.mu.Unlock()
			health.OK(fmt.Sprintf("Published %d %ss", n, o.what))
		}
		select {
		case <-o.wake:
		case <-retry:
		case <-ctx.Done():
			return nil
		}
	}
}

// writeTimeout bounds one write of Run.
const writeTimeout = 10 * time.Second

// sync is one pass of Run.
func (o *Owner) sync(ctx context.Context) error {
	o.mu.Lock()
	want := o.want
	written := maps.Clone(o.written)
	suspect := o.suspect
	o.suspect = map[string]bool{}
	o.mu.Unlock()

	var failed error
	record := func(key string, v []byte) {
		o.mu.Lock()
		if v == nil {
			delete(o.written, key)
		} else {
			o.written[key] = v
		}
		o.mu.Unlock()
	}
	retryLater := func(key string) {
		o.mu.Lock()
		o.suspect[key] = true
		o.mu.Unlock()
	}
	for _, key := range slices.Sorted(maps.Keys(want)) {
		v := want[key]
		regular := !bytes.Equal(written[key], v)
		if !regular && !suspect[key] {
			continue
		}
		wctx, cancel := context.WithTimeout(ctx, writeTimeout)
		changed, err := o.kv.UpdateIfDifferent(wctx, key, v, kvstore.Leased())
		cancel()
		if err != nil {
			failed = err
			record(key, nil)
			if suspect[key] {
				retryLater(key)
			}
			continue
		}
		record(key, v)
		if !regular && changed {
			o.repairs.Inc()
			o.log.Warn("A key of this node was changed or deleted in the kvstore by someone else; written back", "key", key, "what", o.what)
		}
	}
	for key := range written {
		if _, ok := want[key]; ok {
			continue
		}
		wctx, cancel := context.WithTimeout(ctx, writeTimeout)
		err := o.kv.Delete(wctx, key)
		cancel()
		if err != nil {
			failed = err
			continue
		}
		record(key, nil)
	}
	return failed
}
