package policy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/tools/cache"

	"github.com/cellium/cellium/cells/daemon"
	"github.com/cellium/cellium/cells/endpointmanager"
	idcell "github.com/cellium/cellium/cells/identity"
	"github.com/cellium/cellium/cells/internal/tables"
	"github.com/cellium/cellium/cells/ipcache"
	"github.com/cellium/cellium/cells/k8sclient"
	"github.com/cellium/cellium/cells/kvstore"
)

// Cell provides the tables "policy-rules", "policy-entries",
// "policy-enforcement" and "policy-prefixes" and the job that computes the
// last three.
var Cell = cell.Module(
	"policy",
	"Kubernetes NetworkPolicy into per-endpoint desired policy entries",

	cell.ProvidePrivate(NewRulesTable, job.Registry.NewGroup),
	cell.Provide(
		NewEntriesTable, NewEnforcementTable, NewPrefixesTable,
		statedb.RWTable[*Rule].ToTable, statedb.RWTable[*Entry].ToTable, statedb.RWTable[*Enforcement].ToTable,
		statedb.RWTable[*Prefix].ToTable,
		newPolicy, apiRoutes, newMetrics, liveCondition, policyView,
	),
	cell.Invoke(func(*Policy) {}),
)

type params struct {
	cell.In

	Log         *slog.Logger
	DB          *statedb.DB
	Clientset   k8sclient.Clientset
	NodeName    daemon.NodeName
	Rules       statedb.RWTable[*Rule]
	Entries     statedb.RWTable[*Entry]
	Enforcement statedb.RWTable[*Enforcement]
	Prefixes    statedb.RWTable[*Prefix]
	Identities  statedb.Table[*idcell.Identity]
	Endpoints   statedb.Table[*endpointmanager.Endpoint]
	// IPCache gives `agent policy trace` the identity of an address.
	IPCache statedb.Table[*ipcache.Entry] `optional:"true"`
	// Allocator's label filter makes a pod's identity label set, to find
	// the pods of a peer identity for egress named ports; without it (in
	// tests) every label counts.
	Allocator *idcell.Allocator `optional:"true"`
	// KVStore says whether etcd is unreachable: the policy is then
	// computed without the kvstore's identities (see run).
	KVStore kvstore.Client `optional:"true"`
	Jobs    job.Group
}

// Policy computes the desired policy of the local endpoints. The job
// compute-policy owns the engine; the API reads it under mu.
type Policy struct {
	log         *slog.Logger
	db          *statedb.DB
	rules       statedb.RWTable[*Rule]
	entries     statedb.RWTable[*Entry]
	enforcement statedb.RWTable[*Enforcement]
	prefixes    statedb.RWTable[*Prefix]
	identities  statedb.Table[*idcell.Identity]
	endpoints   statedb.Table[*endpointmanager.Endpoint]
	ipcache     statedb.Table[*ipcache.Entry]
	kv          kvstore.Client
	watcher     *policyWatcher
	pods        *podPorts
	// computed marks the output tables initialized after the first
	// computation with every input initialized: policy-maps prunes then.
	computed []func(statedb.WriteTxn)
	// progress is how far the computation has read the endpoints table.
	progress *progress

	computeSeconds prometheus.Histogram

	mu       sync.Mutex
	engine   *engine
	problems map[string]string
	summary  string
}

func newPolicy(p params) (*Policy, error) {
	watcher, err := newPolicyWatcher(p.Log, p.Clientset, p.DB, p.Rules)
	if err != nil {
		return nil, err
	}
	alloc := p.Allocator
	if alloc == nil {
		alloc = new(idcell.Allocator)
	}
	pods, err := newPodPorts(p.Clientset, string(p.NodeName), alloc.PodLabels)
	if err != nil {
		return nil, err
	}
	pol := &Policy{
		log: p.Log, db: p.DB, rules: p.Rules, entries: p.Entries, enforcement: p.Enforcement, prefixes: p.Prefixes,
		identities: p.Identities, endpoints: p.Endpoints, ipcache: p.IPCache, kv: p.KVStore, watcher: watcher, pods: pods,
		engine: newEngine(p.Entries, p.Enforcement, p.Prefixes, pods.ports, pods.peerPorts), progress: newProgress(),
		computeSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "cellium_policy_computation_seconds",
			Help:    "Time to compute and write one batch of policy changes (policies, identities, endpoints, pods)",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10),
		}),
	}
	txn := p.DB.WriteTxn(p.Entries, p.Enforcement, p.Prefixes)
	pol.computed = []func(statedb.WriteTxn){
		p.Entries.RegisterInitializer(txn, "policy-computed"),
		p.Enforcement.RegisterInitializer(txn, "policy-computed"),
		p.Prefixes.RegisterInitializer(txn, "policy-computed"),
	}
	txn.Commit()
	p.Jobs.Add(
		job.OneShot("watch-networkpolicies", func(ctx context.Context, _ cell.Health) error {
			watcher.run(ctx)
			return nil
		}),
		job.OneShot("watch-pod-ports", func(ctx context.Context, _ cell.Health) error {
			pods.run(ctx)
			return nil
		}),
		job.OneShot("compute-policy", pol.run),
	)
	return pol, nil
}

// run follows the rules, identities and endpoints tables and the pods of
// this node, and writes each batch of their changes into the entries and
// enforcement tables, until ctx ends.
func (p *Policy) run(ctx context.Context, health cell.Health) error {
	wtxn := p.db.WriteTxn(p.rules, p.identities, p.endpoints)
	ruleChanges, err := p.rules.Changes(wtxn)
	if err != nil {
		wtxn.Abort()
		return fmt.Errorf("watch table %s: %w", p.rules.Name(), err)
	}
	defer ruleChanges.Close()
	idChanges, err := p.identities.Changes(wtxn)
	if err != nil {
		wtxn.Abort()
		return fmt.Errorf("watch table %s: %w", p.identities.Name(), err)
	}
	defer idChanges.Close()
	epChanges, err := p.endpoints.Changes(wtxn)
	if err != nil {
		wtxn.Abort()
		return fmt.Errorf("watch table %s: %w", p.endpoints.Name(), err)
	}
	defer epChanges.Close()
	wtxn.Commit()

	// Until the NetworkPolicies, endpoints and pods are complete, a pod
	// could look unselected, and so allowed everything: nothing is
	// written before. The identities are not waited for: an identity not
	// yet known is only one whose allows are not written yet (a selector
	// selects fewer identities, never more), and in kvstore mode their
	// listing waits for etcd, which a node restarted during an outage
	// must not (its restored and own identities are in the table).
	health.OK("Waiting for the NetworkPolicies, endpoints and pods")
	if tables.WaitInitialized(ctx, p.db, p.rules.ToTable()) != nil ||
		tables.WaitInitialized(ctx, p.db, p.endpoints) != nil ||
		!cache.WaitFor(ctx, "", p.pods.synced) {
		return nil
	}

	first, marked, live := true, false, false
	var computedUpTo statedb.Revision
	for {
		txn := p.db.ReadTxn()
		start := time.Now()
		// Read before the changes: initialized then, the batch has every
		// identity the listing gave.
		idsListed, idsInit := p.identities.Initialized(txn)
		p.mu.Lock()
		idSeq, idWatch := idChanges.Next(txn)
		for c := range idSeq {
			if c.Deleted {
				p.engine.removeIdentity(c.Object.ID)
			} else {
				p.engine.addIdentity(c.Object.ID, c.Object.Labels)
			}
		}
		epSeq, epWatch := epChanges.Next(txn)
		for c := range epSeq {
			if c.Deleted {
				p.engine.deleteEndpoint(c.Object.ID)
			} else {
				p.engine.setEndpoint(c.Object)
			}
		}
		local, peers := p.pods.take()
		for _, pod := range local {
			ns, name, _ := strings.Cut(pod, "/")
			p.engine.podChanged(ns, name)
		}
		if peers {
			p.engine.peerPortsChanged()
		}
		ruleSeq, ruleWatch := ruleChanges.Next(txn)
		for c := range ruleSeq {
			if c.Deleted {
				p.engine.setRule(c.Object.Name, nil)
			} else {
				p.engine.setRule(c.Object.Name, c.Object)
			}
		}
		p.engine.revision = p.rules.Revision(txn)
		wtxn := p.db.WriteTxn(p.entries, p.enforcement, p.prefixes)
		stats, err := p.engine.flush(wtxn)
		if err != nil {
			wtxn.Abort()
			p.mu.Unlock()
			return fmt.Errorf("write the policy entries: %w", err)
		}
		// Pruning (policy-maps deletes what the tables do not hold) waits
		// for a computation with every identity: until then restored
		// allows of identities not yet listed stay in the maps.
		if idsListed && !marked {
			for _, done := range p.computed {
				done(wtxn)
			}
			marked = true
		}
		wtxn.Commit()
		computedUpTo = p.endpoints.Revision(txn)
		// New endpoints go live (their CNI ADD returns) with the
		// identities listed, or without them once etcd is unreachable: a
		// new pod would otherwise find the allows of peers not yet listed
		// missing, and during an outage no pod could start.
		if !live && !idsListed && kvstore.Unreachable(p.kv) {
			st := p.kv.Status()
			p.log.Warn("Policy computed without the kvstore's identities: etcd is unreachable; allows of identities not yet listed follow once it answers",
				"state", st.State, "error", st.LastError)
			live = true
		}
		live = live || idsListed
		if live {
			p.progress.set(computedUpTo)
		}
		p.report(health, first)
		p.mu.Unlock()
		if first || stats.endpoints > 0 {
			p.computeSeconds.Observe(time.Since(start).Seconds())
		}
		if stats.written+stats.deleted > 0 {
			p.log.Debug("Policy entries written", "endpoints", stats.endpoints, "written", stats.written, "deleted", stats.deleted,
				"revision", p.engine.revision, "duration", time.Since(start))
		}
		first = false

		// Until the identities are listed: wake when they are, and look
		// at the kvstore's status each second (it has no notification).
		var idsListedWatch <-chan struct{}
		var recheck <-chan time.Time
		var timer *time.Timer
		if !idsListed {
			idsListedWatch = idsInit
			if !live && p.kv != nil && p.kv.Enabled() {
				timer = time.NewTimer(kvstore.UnreachableRecheck)
				recheck = timer.C
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-idWatch:
		case <-idsListedWatch:
		case <-recheck:
		case <-epWatch:
		case <-ruleWatch:
		case <-p.pods.wake:
		}
		if timer != nil {
			timer.Stop()
		}
	}
}

// report puts the policies the agent cannot apply (or applies in part) in
// health and the log, each once, by name.
func (p *Policy) report(health cell.Health, first bool) {
	problems := p.engine.problems()
	summary := fmt.Sprintf("%d NetworkPolicies applied to %d endpoints, revision %d",
		len(p.engine.rules), len(p.engine.endpoints), p.engine.revision)
	if !first && summary == p.summary && maps.Equal(problems, p.problems) {
		return
	}
	p.summary = summary
	for name, why := range problems {
		if p.problems[name] != why {
			p.log.Warn("NetworkPolicy not applied as written", "policy", name, "problem", why)
		}
	}
	for name := range p.problems {
		if _, ok := problems[name]; !ok {
			p.log.Info("NetworkPolicy now applied as written", "policy", name)
		}
	}
	p.problems = problems
	if len(problems) == 0 {
		health.OK(summary)
		return
	}
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(problems)) {
		errs = append(errs, errors.New(problems[name]))
	}
	health.Degraded(fmt.Sprintf("%s; %d with problems", summary, len(problems)), errors.Join(errs...))
}
