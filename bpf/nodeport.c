// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)

// Not Go's to build: bpf2go compiles it (see gen.go).
//go:build ignore

/*
 * NodePort, ExternalIP and LoadBalancer frontends for clients outside the
 * cluster: TC programs on the node's external devices (the devices table's
 * selected devices) that translate packets on the wire, where the socket
 * programs of sock_lb.c cannot reach.
 *
 *   cellium_nodeport_ingress  tcx ingress of a device: a TCP or UDP IPv4
 *                             packet to a service frontend goes to a
 *                             backend on this node (DNAT); the client's
 *                             address stays
 *   cellium_nodeport_egress   tcx egress of a device: the backend's reply
 *                             leaves with the frontend as its source again
 *
 * The frontend is looked up, and the backend chosen, by lb_select.h, in the
 * same service and backend maps as the socket programs: one source of
 * truth. A connection keeps its backend through cellium_nodeport4_nat,
 * which holds two entries per connection: the client's tuple (client ->
 * frontend, NODEPORT_NAT_IN) names the backend, the reply's tuple (backend
 * -> client, NODEPORT_NAT_OUT) names the frontend.
 *
 * A backend on another node gets the packet in one of two ways, by the
 * read-only constant lb_mode (--lb-mode): SNAT, from the node's address,
 * its reply coming back here to be translated (NODEPORT_NAT_F_SNAT); or
 * DSR (dsr.h), with the client's address and the frontend in an IPv4
 * option, the backend's node answering the client itself
 * (NODEPORT_NAT_F_DSR).
 *
 * ICMP errors (destination unreachable, time exceeded) about the packets
 * of a translated connection are translated too: nodeport_icmp.h.
 *
 * A packet to a frontend that has no backend (or whose backend is missing
 * from the maps) is refused, a TCP segment with a reset and a UDP
 * datagram with ICMP port unreachable, sent back out of the device:
 * nodeport_reject.h.
 *
 * Not done yet: IPv6; ICMP errors about DSR connections.
 *
 * A packet they do not translate goes on with TC_ACT_UNSPEC (tcx's
 * TCX_NEXT), so other programs on the same hook still see it.
 */
#include "cellium.h"
#include "dsr.h"
#include "endpoints.h"
#include "lb.h"
#include "lb_select.h"

#include <stdbool.h>
#include <stddef.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/tcp.h>
#include <linux/udp.h>

/* struct nodeport4_nat_key.dir */
#define NODEPORT_NAT_IN 0
#define NODEPORT_NAT_OUT 1

/* struct iphdr.frag_off: more fragments, and the offset. */
#define IPV4_FRAGMENT 0x3fff

struct nodeport4_nat_key {
	__be32 src_addr;
	__be32 dst_addr;
	__be16 src_port;
	__be16 dst_port;
	__u8 proto;
	__u8 dir; /* NODEPORT_NAT_* */
	__u8 pad[2];
};

/*
 * IN: the backend the packet goes to and, with NODEPORT_NAT_F_SNAT, the
 * node address and port it is sent from. OUT: the frontend the reply comes
 * from and, with NODEPORT_NAT_F_SNAT, the client it goes back to.
 */
struct nodeport4_nat {
	__be32 address;
	__be16 port;
	__u16 rev_nat_index;
	__be32 snat_address;
	__be16 snat_port;
	__u8 flags; /* NODEPORT_NAT_F_* */
	__u8 pad;
	/* Expiry, seconds of CLOCK_BOOTTIME: see nodeport_nat.h. */
	__u32 lifetime;
	__u32 state; /* NODEPORT_NAT_S_*; 32 bits for atomic ORs */
};

/* The source was translated too: the backend is on another node. */
#define NODEPORT_NAT_F_SNAT 1
/* The backend is on another node and answers the client directly (dsr.h). */
#define NODEPORT_NAT_F_DSR 2

/* lb_mode, --lb-mode: how a backend on another node is reached. */
#define LB_MODE_SNAT 0
#define LB_MODE_DSR 1

/* Set by the loader from --lb-mode. */
volatile const __u32 lb_mode = LB_MODE_SNAT;

/*
 * Connections that --lb-mode=dsr sent to a remote backend with SNAT
 * after all, because their first packet could not take the option (it
 * had IPv4 options, or 8 more bytes would exceed the MTU). The agent
 * exports it as cellium_nodeport_dsr_fallbacks_total.
 */
__u64 dsr_fallbacks = 0;

/* A selected device's IPv4 node address, which the agent writes. */
struct nodeport4_device {
	__be32 address;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32); /* ifindex */
	__type(value, struct nodeport4_device);
	__uint(max_entries, 256);
} cellium_nodeport4_devices SEC(".maps");

/*
 * The ports a connection to a remote backend is sent from, on the node's
 * address: above Linux's default ephemeral range (32768-60999), so that
 * they are not the node's own connections' ports.
 */
#define SNAT_PORT_MIN 61000
#define SNAT_PORT_COUNT (65536 - SNAT_PORT_MIN)
#define SNAT_PORT_TRIES 8

#ifndef AF_INET
#define AF_INET 2
#endif

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct nodeport4_nat_key);
	__type(value, struct nodeport4_nat);
	__uint(max_entries, 262144);
} cellium_nodeport4_nat SEC(".maps");

#include "nodeport_nat.h"

/* A TCP or UDP IPv4 packet's addresses, ports and checksum offsets. */
struct packet4 {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u32 l4_off;
	__u32 csum_off;
	/* BPF_F_MARK_MANGLED_0 for UDP, whose checksum 0 means none. */
	__u64 csum_flags;
};

/* Offsets in the frame of the IPv4 header's fields the programs rewrite. */
#define IP_CSUM_OFF (ETH_HLEN + offsetof(struct iphdr, check))
#define IP_SADDR_OFF (ETH_HLEN + offsetof(struct iphdr, saddr))
#define IP_DADDR_OFF (ETH_HLEN + offsetof(struct iphdr, daddr))
#define IP_TTL_OFF (ETH_HLEN + offsetof(struct iphdr, ttl))

/* parse4 fills p from a TCP or UDP IPv4 packet and says whether it is one. */
static __always_inline bool parse4(struct __sk_buff *skb, struct packet4 *p)
{
	struct ethhdr eth;
	struct iphdr ip;
	__be16 ports[2];

	if (bpf_skb_load_bytes(skb, 0, &eth, sizeof(eth)) || eth.h_proto != bpf_htons(ETH_P_IP))
		return false;
	if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)) || ip.version != 4 || ip.ihl < 5)
		return false;
	/* A fragment has no ports, or not all of the datagram: left alone. */
	if (ip.frag_off & bpf_htons(IPV4_FRAGMENT))
		return false;
	p->proto = ip.protocol;
	p->l4_off = ETH_HLEN + ip.ihl * 4;
	switch (ip.protocol) {
	case IPPROTO_TCP:
		p->csum_off = p->l4_off + offsetof(struct tcphdr, check);
		p->csum_flags = 0;
		break;
	case IPPROTO_UDP:
		p->csum_off = p->l4_off + offsetof(struct udphdr, check);
		p->csum_flags = BPF_F_MARK_MANGLED_0;
		break;
	default:
		return false;
	}
	if (bpf_skb_load_bytes(skb, p->l4_off, ports, sizeof(ports)))
		return false;
	p->saddr = ip.saddr;
	p->daddr = ip.daddr;
	p->sport = ports[0];
	p->dport = ports[1];
	return true;
}

/*
 * rewrite4 replaces the source (src true) or destination address and port
 * of p with addr:port, fixing the IP and transport checksums. Returns 0 or
 * a negative errno of a helper.
 */
static __always_inline int rewrite4(struct __sk_buff *skb, const struct packet4 *p, bool src, __be32 addr,
				    __be16 port)
{
	__be32 old_addr = src ? p->saddr : p->daddr;
	__be16 old_port = src ? p->sport : p->dport;
	__u32 port_off = p->l4_off + (src ? 0 : 2);
	int ret;

	if (old_addr != addr) {
		ret = bpf_l4_csum_replace(skb, p->csum_off, old_addr, addr,
					  p->csum_flags | BPF_F_PSEUDO_HDR | sizeof(addr));
		if (!ret)
			ret = bpf_l3_csum_replace(skb, IP_CSUM_OFF, old_addr, addr, sizeof(addr));
		if (!ret)
			ret = bpf_skb_store_bytes(skb, src ? IP_SADDR_OFF : IP_DADDR_OFF, &addr, sizeof(addr), 0);
		if (ret)
			return ret;
	}
	if (old_port != port) {
		ret = bpf_l4_csum_replace(skb, p->csum_off, old_port, port, p->csum_flags | sizeof(port));
		if (!ret)
			ret = bpf_skb_store_bytes(skb, port_off, &port, sizeof(port), 0);
		if (ret)
			return ret;
	}
	return 0;
}

/* Whether addr is an endpoint of this node. */
static __always_inline bool local_endpoint4(__be32 addr)
{
	struct endpoint_key key = {.family = ENDPOINT_FAMILY_IPV4};

	__builtin_memcpy(key.addr, &addr, 4);
	return bpf_map_lookup_elem(&cellium_endpoints, &key) != NULL;
}

/*
 * select_backend4 finds the frontend p is sent to and chooses its backend,
 * as the socket programs do. Returns 1 with *out set, 0 when p is sent to
 * no frontend, -1 when it is a frontend that cannot take it (no
 * backends, or a backend missing from the maps), or -2 when it is a
 * frontend of traffic policy Local with no backend on this node.
 */
static __always_inline int select_backend4(struct __sk_buff *skb, const struct packet4 *p,
					   struct nodeport4_nat *out)
{
	struct lb4_key key = {
		.address = p->daddr,
		.dport = p->dport,
		.proto = p->proto,
	};
	const struct lb4_service *svc;
	const struct lb4_backend *backend;
	__u32 backend_id = 0;

	svc = lb4_lookup_service(&key);
	if (!svc)
		return 0;
	if (svc->count == 0)
		return (svc->flags & SVC_F_LOCAL) ? -2 : -1;
	if (svc->flags & SVC_F_MAGLEV)
		backend_id = maglev_select(&cellium_lb4_maglev, svc->rev_nat_index,
					   flow_hash4(p->saddr, p->daddr, p->sport, p->dport, p->proto));
	if (!backend_id)
		backend_id = lb4_select_slot(&key, svc->count);
	backend = bpf_map_lookup_elem(&cellium_lb4_backends, &backend_id);
	if (!backend)
		return -1;
	out->address = backend->address;
	out->port = backend->port;
	out->rev_nat_index = svc->rev_nat_index;
	return 1;
}

/*
 * route4 decrements the TTL of a packet the program forwards past the
 * stack and sets *ifindex to the device the routing table sends it out
 * of. Returns 0, or -1 when the packet is to be dropped.
 */
static __always_inline int route4(struct __sk_buff *skb, __be32 saddr, __be32 daddr, __u8 proto, __u32 *ifindex)
{
	struct bpf_fib_lookup fib = {
		.family = AF_INET,
		.l4_protocol = proto,
		.ifindex = skb->ifindex,
		.ipv4_src = saddr,
		.ipv4_dst = daddr,
	};
	__u8 word[2], old[2];

	/* Forwarded past the stack, so the TTL is decremented here; one
	 * that runs out is dropped (no ICMP time exceeded yet). */
	if (bpf_skb_load_bytes(skb, IP_TTL_OFF, word, sizeof(word)) || word[0] <= 1)
		return -1;
	old[0] = word[0];
	old[1] = word[1];
	word[0]--;
	if (bpf_l3_csum_replace(skb, IP_CSUM_OFF, *(__be16 *)old, *(__be16 *)word, sizeof(__be16)) ||
	    bpf_skb_store_bytes(skb, IP_TTL_OFF, word, 1, 0))
		return -1;

	if (bpf_fib_lookup(skb, &fib, sizeof(fib), BPF_FIB_LOOKUP_SKIP_NEIGH) != BPF_FIB_LKUP_RET_SUCCESS)
		return -1;
	*ifindex = fib.ifindex;
	return 0;
}

/*
 * forward4 sends a packet whose destination, and source, the program
 * rewrote out of the device the routing table picks for it, with the
 * next hop's MAC from the neighbour table. It cannot go through the
 * stack: a forwarded packet from one of the node's own addresses is a
 * martian there.
 */
static __always_inline int forward4(struct __sk_buff *skb, __be32 saddr, __be32 daddr, __u8 proto)
{
	__u32 ifindex;

	if (route4(skb, saddr, daddr, proto, &ifindex))
		return TC_ACT_SHOT;
	return bpf_redirect_neigh(ifindex, NULL, 0, 0);
}

/*
 * snat_port4 picks the port on the node's address that a connection to a
 * remote backend is sent from, and claims it by creating the reply's entry
 * *out (whose dst_port it sets) with value *frontend: one no live
 * connection to the same backend uses (an expired one's is taken over).
 * Returns 0, or -1 when the tries found none.
 */
static __always_inline int snat_port4(struct nodeport4_nat_key *out, const struct nodeport4_nat *frontend)
{
	__u32 i;

	for (i = 0; i < SNAT_PORT_TRIES; i++) {
		out->dst_port = bpf_htons(SNAT_PORT_MIN + bpf_get_prandom_u32() % SNAT_PORT_COUNT);
		if (!bpf_map_update_elem(&cellium_nodeport4_nat, out, frontend, BPF_NOEXIST))
			return 0;
		if (nat_take_expired(out, frontend))
			return 0;
	}
	return -1;
}

/* reply4 translates the reply of a connection to a remote backend back. */
static __always_inline int reply4(struct __sk_buff *skb, const struct packet4 *p, const struct nodeport4_nat *nat)
{
	__be32 client = nat->snat_address;

	if (rewrite4(skb, p, false, client, nat->snat_port) || rewrite4(skb, p, true, nat->address, nat->port))
		return TC_ACT_SHOT;
	return forward4(skb, nat->address, client, p->proto);
}

/* ICMP errors about the connections above: after the NAT map and
 * forward4, which it uses. */
#include "nodeport_icmp.h"
/* Refusals of packets to a frontend without backends: after packet4 and
 * the ICMP header and checksum helpers, which it uses. */
#include "nodeport_reject.h"

SEC("tc")
int cellium_nodeport_ingress(struct __sk_buff *skb)
{
	struct packet4 p = {};
	struct nodeport4_nat_key in = {}, out = {};
	struct nodeport4_nat backend = {}, frontend = {};
	struct nodeport4_nat *known;
	const struct nodeport4_device *dev;
	bool remote;
	__u32 now = 0;
	int ret;

	if (!parse4(skb, &p))
		return nodeport4_icmp_ingress(skb);
	in.src_addr = p.saddr;
	in.dst_addr = p.daddr;
	in.src_port = p.sport;
	in.dst_port = p.dport;
	in.proto = p.proto;

	/* A remote backend's reply to the node's address. */
	in.dir = NODEPORT_NAT_OUT;
	known = bpf_map_lookup_elem(&cellium_nodeport4_nat, &in);
	if (known && (known->flags & NODEPORT_NAT_F_SNAT)) {
		nat_refresh(&in, known, nat_tcp_flags(skb, p.proto, p.l4_off), true, nat_now());
		return reply4(skb, &p, known);
	}

	in.dir = NODEPORT_NAT_IN;
	known = bpf_map_lookup_elem(&cellium_nodeport4_nat, &in);
	/* An expired entry's connection is over: this is a new one, whose
	 * backend is chosen anew (the old reply entry's port may be
	 * another connection's by now). */
	if (known)
		now = nat_now();
	if (known && !nat_expired(known, now)) {
		nat_refresh(&in, known, nat_tcp_flags(skb, p.proto, p.l4_off), false, now);
		backend = *known;
	} else {
		ret = select_backend4(skb, &p, &backend);
		if (ret == 0)
			return TC_ACT_UNSPEC;
		if (ret == -2)
			return TC_ACT_SHOT;
		if (ret < 0)
			return reject4(skb, &p);
		if (!now)
			now = nat_now();

		out.src_addr = backend.address;
		out.dst_addr = p.saddr;
		out.src_port = backend.port;
		out.dst_port = p.sport;
		out.proto = p.proto;
		out.dir = NODEPORT_NAT_OUT;
		frontend.address = p.daddr;
		frontend.port = p.dport;
		frontend.rev_nat_index = backend.rev_nat_index;
		nat_init(&frontend, p.proto, nat_tcp_flags(skb, p.proto, p.l4_off), now);
		backend.state = frontend.state;
		backend.lifetime = frontend.lifetime;
		remote = !local_endpoint4(backend.address);
		if (remote && lb_mode == LB_MODE_DSR && dsr_can_insert4(skb, 0)) {
			/* Another node's backend answers the client itself:
			 * no reply comes back here to translate. */
			backend.flags = NODEPORT_NAT_F_DSR;
		} else if (remote) {
			/* Another node's backend answers the node's address,
			 * from which the packet is sent. */
			__u32 ifindex = skb->ifindex;

			dev = bpf_map_lookup_elem(&cellium_nodeport4_devices, &ifindex);
			if (!dev || !dev->address)
				return TC_ACT_UNSPEC;
			frontend.flags = NODEPORT_NAT_F_SNAT;
			frontend.snat_address = p.saddr;
			frontend.snat_port = p.sport;
			out.dst_addr = dev->address;
			if (snat_port4(&out, &frontend))
				return TC_ACT_SHOT;
			backend.flags = NODEPORT_NAT_F_SNAT;
			backend.snat_address = dev->address;
			backend.snat_port = out.dst_port;
			if (lb_mode == LB_MODE_DSR)
				__sync_fetch_and_add(&dsr_fallbacks, 1);
		} else if (bpf_map_update_elem(&cellium_nodeport4_nat, &out, &frontend, BPF_ANY)) {
			/* The reply's entry first: a packet translated without
			 * it would get an answer that nothing translates back. */
			return TC_ACT_SHOT;
		}
		if (bpf_map_update_elem(&cellium_nodeport4_nat, &in, &backend, BPF_ANY))
			return TC_ACT_SHOT;
	}
	if (rewrite4(skb, &p, false, backend.address, backend.port))
		return TC_ACT_SHOT;
	if (backend.flags & NODEPORT_NAT_F_DSR) {
		/* Every packet carries the frontend, so the backend's node
		 * learns the connection from whichever packet it sees first
		 * (after a restart, or an LRU eviction there). One that cannot
		 * take the option (options of its own, or no room for 8 more
		 * bytes on the device the route leaves by) goes without it:
		 * the backend's node knows the connection from its first
		 * packet, which could. */
		__u32 ifindex;

		if (route4(skb, p.saddr, backend.address, p.proto, &ifindex))
			return TC_ACT_SHOT;
		if (dsr_can_insert4(skb, ifindex) && dsr_insert4(skb, p.daddr, p.dport) < 0)
			return TC_ACT_SHOT;
		return bpf_redirect_neigh(ifindex, NULL, 0, 0);
	}
	if (!(backend.flags & NODEPORT_NAT_F_SNAT))
		return TC_ACT_UNSPEC;
	if (rewrite4(skb, &p, true, backend.snat_address, backend.snat_port))
		return TC_ACT_SHOT;
	return forward4(skb, backend.snat_address, backend.address, p.proto);
}

SEC("tc")
int cellium_nodeport_egress(struct __sk_buff *skb)
{
	struct packet4 p = {};
	struct nodeport4_nat_key out = {};
	struct nodeport4_nat *frontend;

	if (!parse4(skb, &p))
		return nodeport4_icmp_egress(skb);
	out.src_addr = p.saddr;
	out.dst_addr = p.daddr;
	out.src_port = p.sport;
	out.dst_port = p.dport;
	out.proto = p.proto;
	out.dir = NODEPORT_NAT_OUT;
	frontend = bpf_map_lookup_elem(&cellium_nodeport4_nat, &out);
	/* A remote backend's replies arrive at ingress. */
	if (!frontend || (frontend->flags & NODEPORT_NAT_F_SNAT))
		return TC_ACT_UNSPEC;
	nat_refresh(&out, frontend, nat_tcp_flags(skb, p.proto, p.l4_off), true, nat_now());
	if (rewrite4(skb, &p, true, frontend->address, frontend->port))
		return TC_ACT_SHOT;
	return TC_ACT_UNSPEC;
}

char __license[] SEC("license") = "Dual BSD/GPL";
