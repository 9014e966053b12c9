package policy

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/ipcache"
	"github.com/cellium/cellium/pkg/apiv1"
	"github.com/cellium/cellium/pkg/identity"
)

// party is one side of a traced connection: an identity, its address
// when known (for ipBlocks), and the local endpoint when it is one.
type party struct {
	id   identity.NumericIdentity
	addr netip.Addr
	ep   *endpointmanager.Endpoint
}

func (p *Policy) party(txn statedb.ReadTxn, s string) (party, error) {
	if addr, err := netip.ParseAddr(s); err == nil {
		// Its identity as the datapath finds it: the ipcache's, else
		// the world's.
		pt := party{id: identity.World, addr: addr.Unmap()}
		if p.ipcache != nil {
			if e, ok := ipcache.Lookup(txn, p.ipcache, addr); ok {
				pt.id = e.Winner().Identity
			}
		}
		if ep, _, found := p.endpoints.Get(txn, endpointmanager.EndpointIP.Query(pt.addr)); found && ep.PodName != "" {
			pt.ep = ep
		}
		return pt, nil
	}
	if strings.Contains(s, "/") {
		ep, _, found := p.endpoints.Get(txn, endpointmanager.EndpointPod.Query(s))
		if !found {
			return party{}, fmt.Errorf("no endpoint of pod %s on this node: name a local pod NAMESPACE/POD, an address, or anything else by identity (a number, world, host, ...)", s)
		}
		addr := ep.IPv4
		if !addr.IsValid() {
			addr = ep.IPv6
		}
		return party{id: ep.Identity, addr: addr, ep: ep}, nil
	}
	id, err := identity.Parse(s)
	return party{id: id}, err
}

// parsePort reads PORT/PROTO, PORT (TCP) or a protocol alone (ICMP: any
// port).
func parsePort(s string) (uint8, uint16, error) {
	num, proto, hasProto := strings.Cut(s, "/")
	if !hasProto {
		if _, err := strconv.ParseUint(num, 10, 16); err != nil {
			proto, num = num, ""
		} else {
			proto = "TCP"
		}
	}
	var p uint8
	switch strings.ToUpper(proto) {
	case "TCP":
		p = ProtoTCP
	case "UDP":
		p = ProtoUDP
	case "SCTP":
		p = ProtoSCTP
	case "ICMP":
		p = 1
	default:
		return 0, 0, fmt.Errorf("port %q: want PORT/PROTO with TCP, UDP or SCTP, such as 8080/TCP, or ICMP", s)
	}
	if num == "" {
		return p, 0, nil
	}
	n, err := strconv.ParseUint(num, 10, 16)
	if err != nil || n == 0 {
		return 0, 0, fmt.Errorf("port %q: want a port from 1 to 65535", s)
	}
	return p, uint16(n), nil
}

// trace explains the verdict on a connection from the tables.
func (p *Policy) trace(from, to, port string) (apiv1.PolicyTrace, error) {
	out := apiv1.PolicyTrace{From: from, To: to, Port: port, Allowed: true, Sides: []apiv1.PolicyTraceSide{}}
	proto, dport, err := parsePort(port)
	if err != nil {
		return out, err
	}
	txn := p.db.ReadTxn()
	src, err := p.party(txn, from)
	if err != nil {
		return out, fmt.Errorf("from: %w", err)
	}
	dst, err := p.party(txn, to)
	if err != nil {
		return out, fmt.Errorf("to: %w", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if src.ep != nil {
		out.Sides = append(out.Sides, p.traceSide(txn, src.ep, Egress, dst, proto, dport))
	}
	if dst.ep != nil {
		out.Sides = append(out.Sides, p.traceSide(txn, dst.ep, Ingress, src, proto, dport))
	}
	for _, s := range out.Sides {
		out.Allowed = out.Allowed && s.Allowed
	}
	return out, nil
}

func (p *Policy) traceSide(txn statedb.ReadTxn, ep *endpointmanager.Endpoint, dir Direction, peer party, proto uint8, port uint16) apiv1.PolicyTraceSide {
	side := apiv1.PolicyTraceSide{Endpoint: ep.ID, Pod: ep.PodNamespace + "/" + ep.PodName, Direction: dir.String(),
		Peer: uint32(peer.id), SelectedBy: []string{}, AllowedBy: []string{}}
	// The ipBlock prefix the peer's address is in, as the datapath
	// matches it after the identity.
	prefixID, inPrefix := identity.Unknown, false
	if peer.addr.IsValid() {
		prefixID, inPrefix = p.engine.prefixes.lookup(peer.addr)
		if inPrefix {
			side.PeerPrefix = p.engine.prefixes.ids[prefixID].String()
		}
	}
	if st, ok := p.engine.endpoints[ep.ID]; ok {
		for name, r := range st.rules {
			if (dir == Ingress && r.Ingress) || (dir == Egress && r.Egress) {
				side.SelectedBy = append(side.SelectedBy, name)
			}
		}
		slices.Sort(side.SelectedBy)
	}
	if enf, _, ok := p.enforcement.Get(txn, EnforcementByEndpoint.Query(ep.ID)); ok {
		side.Isolated = (dir == Ingress && enf.Ingress) || (dir == Egress && enf.Egress)
	}
	allowedBy := map[string]struct{}{}
	for e := range p.entries.List(txn, EntryByEndpoint.Query(ep.ID)) {
		if e.Key.Direction == dir && (e.Key.Allows(peer.id, proto, port) || (inPrefix && e.Key.Allows(prefixID, proto, port))) {
			for _, pol := range e.Policies {
				allowedBy[pol] = struct{}{}
			}
		}
	}
	side.AllowedBy = append(side.AllowedBy, slices.Sorted(maps.Keys(allowedBy))...)
	side.Allowed = !side.Isolated || len(side.AllowedBy) > 0
	return side
}
