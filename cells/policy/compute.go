package policy

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/pkg/identity"
	"github.com/cellium/cellium/pkg/labels"
)

// hostPolicy is the name entries from the node itself are allowed by: the
// node's traffic (kubelet probes, host-network pods) is never denied.
const hostPolicy = "reserved:host"

// namedPort is a container port with a name.
type namedPort struct {
	name     string
	protocol uint8
	port     uint16
}

// endpointState is a local endpoint as the engine sees it: its pod, the
// named ports of its containers and the applied policies that select it.
type endpointState struct {
	ep    *endpointmanager.Endpoint
	ports []namedPort
	rules map[string]*Rule
}

// engine computes the desired entries and enforcement of each local
// endpoint from the applied policies, the selector cache and the
// endpoints, and writes only what changed. Its inputs come in through
// setRule, setEndpoint, deleteEndpoint, addIdentity, removeIdentity and
// podChanged; flush writes what they made pending.
type engine struct {
	entries     statedb.RWTable[*Entry]
	enforcement statedb.RWTable[*Enforcement]
	prefixTable statedb.RWTable[*Prefix]
	// podPorts are the named ports of a pod of this node.
	podPorts func(namespace, name string) []namedPort
	// peerPorts are the named ports of the pods whose identity label set
	// has the text key (identView.portKey); with key "", every pod's.
	peerPorts func(key string) []namedPort

	cache    *selectorCache
	prefixes *prefixCache
	// rules are the applied policies by name: the last version of each
	// that could be applied.
	rules map[string]*Rule
	// ruleEndpoints are the local endpoints each applied policy selects.
	ruleEndpoints map[string]map[uint16]struct{}
	endpoints     map[uint16]*endpointState
	// egressNamed counts the applied policies with a named egress port:
	// while there are any, a pod's named ports changing changes the
	// endpoints' entries.
	egressNamed int
	// bad are the policies that cannot be applied, with why.
	bad map[string]string
	// revision is the policy revision the engine has read up to.
	revision uint64

	// Pending work for flush.
	full    map[uint16]struct{}
	partial map[uint16]map[identity.NumericIdentity]struct{}
	deleted map[uint16]struct{}
}

func newEngine(entries statedb.RWTable[*Entry], enforcement statedb.RWTable[*Enforcement], prefixes statedb.RWTable[*Prefix],
	podPorts func(string, string) []namedPort, peerPorts func(string) []namedPort) *engine {
	return &engine{
		entries: entries, enforcement: enforcement, prefixTable: prefixes, podPorts: podPorts, peerPorts: peerPorts,
		cache: newSelectorCache(), prefixes: newPrefixCache(), rules: map[string]*Rule{}, ruleEndpoints: map[string]map[uint16]struct{}{},
		endpoints: map[uint16]*endpointState{}, bad: map[string]string{},
		full: map[uint16]struct{}{}, partial: map[uint16]map[identity.NumericIdentity]struct{}{}, deleted: map[uint16]struct{}{},
	}
}

// setRule applies a new version of the policy name (nil: deleted). A
// version that cannot be applied is recorded as bad and changes nothing:
// the last good version stays in force.
func (e *engine) setRule(name string, r *Rule) {
	if r != nil && r.Error != "" {
		e.bad[name] = r.Error
		return
	}
	delete(e.bad, name)
	if old, ok := e.rules[name]; ok {
		for key := range old.selectors {
			e.cache.release(key, name)
		}
		for _, b := range old.blocks() {
			e.prefixes.release(b.key(), name, e.blockChanged)
		}
		for id := range e.ruleEndpoints[name] {
			delete(e.endpoints[id].rules, name)
			e.full[id] = struct{}{}
		}
		delete(e.ruleEndpoints, name)
		delete(e.rules, name)
		if namedPorts(old.EgressRules) {
			e.egressNamed--
		}
	}
	if r == nil {
		return
	}
	e.rules[name] = r
	for _, sel := range r.selectors {
		e.cache.acquire(sel, name)
	}
	for _, b := range r.blocks() {
		e.prefixes.acquire(b, name, e.blockChanged)
	}
	eps := map[uint16]struct{}{}
	for id, st := range e.endpoints {
		if st.ep.PodName != "" && r.selects(st.ep.PodNamespace, st.ep.Labels) {
			st.rules[name] = r
			eps[id] = struct{}{}
			e.full[id] = struct{}{}
		}
	}
	e.ruleEndpoints[name] = eps
	if namedPorts(r.EgressRules) {
		e.egressNamed++
	}
}

// setEndpoint adds or updates a local endpoint.
func (e *engine) setEndpoint(ep *endpointmanager.Endpoint) {
	old, ok := e.endpoints[ep.ID]
	if ok && old.ep.Identity == ep.Identity && old.ep.PodNamespace == ep.PodNamespace &&
		old.ep.PodName == ep.PodName && maps.Equal(old.ep.Labels, ep.Labels) {
		old.ep = ep
		return
	}
	if ok {
		e.forgetEndpoint(ep.ID)
	}
	st := &endpointState{ep: ep, rules: map[string]*Rule{}}
	if ep.PodName != "" {
		st.ports = e.podPorts(ep.PodNamespace, ep.PodName)
		for name, r := range e.rules {
			if r.selects(ep.PodNamespace, ep.Labels) {
				st.rules[name] = r
				e.ruleEndpoints[name][ep.ID] = struct{}{}
			}
		}
	}
	e.endpoints[ep.ID] = st
	delete(e.deleted, ep.ID)
	e.full[ep.ID] = struct{}{}
}

func (e *engine) deleteEndpoint(id uint16) {
	if _, ok := e.endpoints[id]; !ok {
		return
	}
	e.forgetEndpoint(id)
	delete(e.endpoints, id)
	delete(e.full, id)
	delete(e.partial, id)
	e.deleted[id] = struct{}{}
}

func (e *engine) forgetEndpoint(id uint16) {
	for name := range e.endpoints[id].rules {
		delete(e.ruleEndpoints[name], id)
	}
}

// peerPortsChanged: a pod's named ports, or the identity labels of a pod
// with named ports, changed, which changes the egress entries of named
// ports towards it.
func (e *engine) peerPortsChanged() {
	if e.egressNamed == 0 {
		return
	}
	for id := range e.endpoints {
		e.full[id] = struct{}{}
	}
}

// podChanged reads the named ports of a pod of this node again.
func (e *engine) podChanged(namespace, name string) {
	for id, st := range e.endpoints {
		if st.ep.PodNamespace != namespace || st.ep.PodName != name {
			continue
		}
		ports := e.podPorts(namespace, name)
		if slices.Equal(ports, st.ports) {
			continue
		}
		st.ports = ports
		e.full[id] = struct{}{}
	}
}

// addIdentity and removeIdentity change the selector cache and make the
// entries of that one identity pending for the endpoints of the policies
// whose selectors changed.
func (e *engine) addIdentity(id identity.NumericIdentity, ls labels.Labels) {
	e.cache.addIdentity(id, ls, func(cs *cachedSelector) { e.selectorChanged(cs, id) })
}

func (e *engine) removeIdentity(id identity.NumericIdentity) {
	e.cache.removeIdentity(id, func(cs *cachedSelector) { e.selectorChanged(cs, id) })
}

func (e *engine) selectorChanged(cs *cachedSelector, id identity.NumericIdentity) {
	e.usersChanged(cs.users, id)
}

// blockChanged: an ipBlock now selects the prefix ID id, or no longer.
func (e *engine) blockChanged(cb *cachedBlock, id identity.NumericIdentity) {
	e.usersChanged(cb.users, id)
}

// usersChanged makes the entries of id pending for the endpoints of the
// policies users.
func (e *engine) usersChanged(users map[string]struct{}, id identity.NumericIdentity) {
	for user := range users {
		for ep := range e.ruleEndpoints[user] {
			if e.partial[ep] == nil {
				e.partial[ep] = map[identity.NumericIdentity]struct{}{}
			}
			e.partial[ep][id] = struct{}{}
		}
	}
}

// flushStats is what one flush did.
type flushStats struct {
	endpoints int
	written   int
	deleted   int
}

// flush writes the pending endpoints' entries and enforcement: only rows
// that differ from the table's.
func (e *engine) flush(wtxn statedb.WriteTxn) (flushStats, error) {
	var st flushStats
	if err := e.prefixes.flush(wtxn, e.prefixTable); err != nil {
		return st, err
	}
	for id := range e.deleted {
		for entry := range e.entries.List(wtxn, EntryByEndpoint.Query(id)) {
			if _, _, err := e.entries.Delete(wtxn, entry); err != nil {
				return st, err
			}
			st.deleted++
		}
		if enf, _, ok := e.enforcement.Get(wtxn, EnforcementByEndpoint.Query(id)); ok {
			if _, _, err := e.enforcement.Delete(wtxn, enf); err != nil {
				return st, err
			}
		}
	}
	peerPorts := e.portsOfPeers()
	for id := range e.full {
		if err := e.sync(wtxn, e.endpoints[id], nil, peerPorts, &st); err != nil {
			return st, err
		}
	}
	for id, peers := range e.partial {
		if _, ok := e.full[id]; ok {
			continue
		}
		for peer := range peers {
			if err := e.sync(wtxn, e.endpoints[id], &peer, peerPorts, &st); err != nil {
				return st, err
			}
		}
	}
	clear(e.full)
	clear(e.partial)
	clear(e.deleted)
	return st, nil
}

// portsOfPeers gives the named ports of a peer, read once per flush: a pod
// identity's are those of the pods with its label set, anywhere in the
// cluster; any other peer's (any peer, an ipBlock's prefix, a reserved
// identity) are every pod's, since an address may be any pod's.
func (e *engine) portsOfPeers() func(identity.NumericIdentity) []namedPort {
	byKey := map[string][]namedPort{}
	return func(id identity.NumericIdentity) []namedPort {
		key := ""
		if v := e.cache.ids[id]; v != nil {
			key = v.portKey
		}
		ports, ok := byKey[key]
		if !ok {
			ports = e.peerPorts(key)
			byKey[key] = ports
		}
		return ports
	}
}

// sync writes the difference between the desired and the present entries
// of an endpoint: all of them, or those of the peer identity only.
func (e *engine) sync(wtxn statedb.WriteTxn, st *endpointState, only *identity.NumericIdentity,
	peerPorts func(identity.NumericIdentity) []namedPort, stats *flushStats) error {
	desired, ingress, egress := e.desired(st, only, peerPorts)
	id := st.ep.ID
	var present []*Entry
	if only == nil {
		for entry := range e.entries.List(wtxn, EntryByEndpoint.Query(id)) {
			present = append(present, entry)
		}
	} else {
		for entry := range e.entries.List(wtxn, EntryByEndpointIdentity.Query(EndpointIdentity{id, *only})) {
			present = append(present, entry)
		}
	}
	changed := false
	var stale []*Entry
	for _, entry := range present {
		if policies, ok := desired[entry.Key]; ok && slices.Equal(policies, entry.Policies) {
			delete(desired, entry.Key)
		} else if !ok {
			stale = append(stale, entry)
		}
	}
	// Make before break: the reconciler writes the maps in the order of
	// the table's revisions, so the new allows go in before the old ones
	// go. Traffic that both allow passes all along, also while an agent
	// killed in between is down with half the change in its maps.
	for key, policies := range desired {
		if _, _, err := e.entries.Insert(wtxn, &Entry{Key: key, Policies: policies, Status: reconciler.StatusPending()}); err != nil {
			return err
		}
		stats.written++
		changed = true
	}
	for _, entry := range stale {
		if _, _, err := e.entries.Delete(wtxn, entry); err != nil {
			return err
		}
		stats.deleted++
		changed = true
	}
	stats.endpoints++
	// The revision moves when the endpoint's policy changes with it: an
	// identity coming or going changes entries, not the policy revision.
	cur, _, found := e.enforcement.Get(wtxn, EnforcementByEndpoint.Query(id))
	rev := e.revision
	if found && (!changed || only != nil) {
		rev = cur.Revision
	}
	if found && cur.Ingress == ingress && cur.Egress == egress && cur.Revision == rev {
		return nil
	}
	_, _, err := e.enforcement.Insert(wtxn, &Enforcement{EndpointID: id, Ingress: ingress, Egress: egress,
		Revision: rev, Status: reconciler.StatusPending()})
	return err
}

// desired are the entries an endpoint's policies allow (those of peer
// identity only, when only is set), with the policies that allow each,
// and whether it is isolated for ingress and egress.
func (e *engine) desired(st *endpointState, only *identity.NumericIdentity,
	peerPorts func(identity.NumericIdentity) []namedPort) (map[EntryKey][]string, bool, bool) {
	out := map[EntryKey][]string{}
	var ingress, egress bool
	for name, r := range st.rules {
		if r.Ingress {
			ingress = true
			for _, pr := range r.IngressRules {
				e.addPeerRule(out, st, Ingress, name, pr, only, peerPorts)
			}
		}
		if r.Egress {
			egress = true
			for _, pr := range r.EgressRules {
				e.addPeerRule(out, st, Egress, name, pr, only, peerPorts)
			}
		}
	}
	if ingress && (only == nil || *only == identity.Host) {
		k := EntryKey{EndpointID: st.ep.ID, Direction: Ingress, Identity: identity.Host}
		out[k] = append(out[k], hostPolicy)
	}
	for k, policies := range out {
		if len(policies) > 1 {
			slices.Sort(policies)
			out[k] = slices.Compact(policies)
		}
	}
	return out, ingress, egress
}

func (e *engine) addPeerRule(out map[EntryKey][]string, st *endpointState, dir Direction, policy string, pr PeerRule,
	only *identity.NumericIdentity, peerPorts func(identity.NumericIdentity) []namedPort) {
	add := func(peer identity.NumericIdentity) {
		if only != nil && peer != *only {
			return
		}
		if len(pr.Ports) == 0 {
			k := EntryKey{EndpointID: st.ep.ID, Direction: dir, Identity: peer}
			out[k] = append(out[k], policy)
			return
		}
		for _, p := range pr.Ports {
			if p.Name == "" {
				k := EntryKey{EndpointID: st.ep.ID, Direction: dir, Identity: peer, Protocol: p.Protocol, Port: p.Port, EndPort: p.EndPort}
				out[k] = append(out[k], policy)
				continue
			}
			// A named port is the destination's: the endpoint's own on
			// ingress, the peer's pods' on egress.
			ports := st.ports
			if dir == Egress {
				ports = peerPorts(peer)
			}
			for _, np := range ports {
				if np.name == p.Name && np.protocol == p.Protocol {
					k := EntryKey{EndpointID: st.ep.ID, Direction: dir, Identity: peer, Protocol: np.protocol, Port: np.port}
					out[k] = append(out[k], policy)
				}
			}
		}
	}
	if pr.Everyone {
		add(identity.Unknown)
	}
	// addSelected adds the IDs an ipBlock or a selector selects: with
	// only, that one if it is among them.
	addSelected := func(ids map[identity.NumericIdentity]struct{}) {
		if only != nil {
			if _, ok := ids[*only]; ok {
				add(*only)
			}
			return
		}
		for id := range ids {
			add(id)
		}
	}
	for _, b := range pr.IPBlocks {
		addSelected(e.prefixes.selection(b.key()))
	}
	for _, key := range pr.Selectors {
		addSelected(e.cache.selection(key))
	}
}

// problems are the policies the agent cannot apply, or applies only in
// part, each with why: bad input, and ingress named ports that none of
// the local pods the policy selects has.
func (e *engine) problems() map[string]string {
	out := maps.Clone(e.bad)
	for name, r := range e.rules {
		var why []string
		if eps := e.ruleEndpoints[name]; len(eps) > 0 {
			for _, pr := range r.IngressRules {
				for _, p := range pr.Ports {
					if p.Name != "" && !e.anyHasPort(eps, p) {
						why = append(why, fmt.Sprintf("named port %s is on none of the %d local pods it selects", p, len(eps)))
					}
				}
			}
		}
		if len(why) > 0 {
			out[name] = fmt.Sprintf("NetworkPolicy %s: %s", name, strings.Join(slices.Compact(why), "; "))
		}
	}
	return out
}

func (e *engine) anyHasPort(eps map[uint16]struct{}, p Port) bool {
	for id := range eps {
		for _, np := range e.endpoints[id].ports {
			if np.name == p.Name && np.protocol == p.Protocol {
				return true
			}
		}
	}
	return false
}
