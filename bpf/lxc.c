// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)

// Not Go's to build: bpf2go compiles it (see gen.go).
//go:build ignore

/*
 * The endpoint datapath: TC programs on the host side of an endpoint's veth
 * that track the endpoint's connections and report its packets.
 *
 *   cellium_from_endpoint  tcx ingress of the host-side veth: what the
 *                          endpoint sends
 *   cellium_to_endpoint    tcx egress of the host-side veth: what goes into
 *                          the endpoint
 *
 * They translate nothing (the socket programs of sock_lb.c translate
 * services), except for Direct Server Return (dsr.h, --lb-mode=dsr):
 * the to-endpoint program remembers the frontend that a packet from
 * another node's NodePort carries, the from-endpoint program sends the
 * pod's replies from it. Otherwise they parse the packet, account it in
 * the conntrack maps of ct.h, find the source's and the destination's
 * security identities in the ipcache (ipcache.h), and write trace and drop
 * events (events.h) that carry them.
 * A packet they pass goes on with TC_ACT_UNSPEC, which is tcx's TCX_NEXT,
 * so that other programs on the same hook still see it.
 *
 * Conntrack keeps one entry per connection and per program kind, keyed by
 * the connection's original tuple: the from-endpoint program's entries have
 * flags 0, the to-endpoint program's CT_KEY_F_INCOMING. A program looks up
 * a packet's tuple with its own flag; on a miss, the reversed tuple with
 * the other flag, which is how the entry of a connection opened the other
 * way is keyed (a reply); on a miss again it creates an entry with its own
 * flag. Pod A connecting to pod B on this node thus makes (A->B, 0) in A's
 * from-endpoint program and (A->B, INCOMING) in B's to-endpoint program, and
 * B's answer finds the first in A's to-endpoint program and the second in
 * B's from-endpoint program.
 *
 * Headers are copied out with bpf_skb_load_bytes rather than read in
 * place: the programs only read, and the helper works the same whether or
 * not the headers are in the skb's linear part, which saves the pulls and
 * the pointer revalidation that direct access would need.
 */
#include "cellium.h"
#include "ct.h"
#include "dsr.h"
#include "endpoints.h"
#include "events.h"
#include "ipcache.h"

#include <stdbool.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <linux/icmpv6.h>

/*
 * Set by the loader from the agent's flags (ctmaps.Config.ProgramConstants):
 * read-only, so the verifier and the JIT see them as constants. Lifetimes
 * are seconds.
 */
/* A TCP connection until its SYN is answered. */
volatile const __u32 ct_lifetime_syn = 60;
/* An established TCP connection after its last packet. */
volatile const __u32 ct_lifetime_tcp = 21600;
/* A TCP connection once both sides sent a FIN, or one sent a RST. */
volatile const __u32 ct_lifetime_close = 10;
/* UDP, ICMP echo and other protocols after the last packet. */
volatile const __u32 ct_lifetime_nontcp = 60;
/*
 * 1: report a tracked packet only when it creates its entry, changes the
 * entry's flags, or is the first of its direction in the current second,
 * which keeps the event rate of a busy connection near one per second per
 * direction. 0: report every packet.
 */
volatile const __u32 monitor_aggregation = 1;
/*
 * 1 (--lb-mode=dsr): honour the DSR option of dsr.h. Off otherwise, so
 * that an option from anywhere cannot make a pod answer from another
 * address on a node that does not use DSR.
 */
volatile const __u32 lb_dsr = 0;

#define NSEC_PER_SEC 1000000000ULL

/* The flags byte of the TCP header (struct flow_summary.tcp_flags). */
#define TCP_HDR_FIN 0x01
#define TCP_HDR_SYN 0x02
#define TCP_HDR_RST 0x04
#define TCP_HDR_ACK 0x10

/* ICMP types (linux/icmp.h would pull in libc headers). */
#define ICMP_ECHOREPLY 0
#define ICMP_ECHO 8

/*
 * The first 8 bytes of ICMP and ICMPv6 messages, which share their layout:
 * type, code, checksum and, for echo, identifier and sequence number.
 */
struct icmp_echo_hdr {
	__u8 type;
	__u8 code;
	__sum16 checksum;
	__be16 id;
	__be16 sequence;
};

/* struct iphdr.frag_off: the fragment offset; not 0 after the first. */
#define IPV4_FRAG_OFFSET 0x1fff

/* What the parser made of a packet; negative values are -DROP_*. */
/* Track it in conntrack. */
#define PKT_TRACK 0
/* Report it untracked: no tuple to track (a later IPv4 fragment, ICMP other than echo). */
#define PKT_UNTRACKED 1
/* Pass it silently: ARP. */
#define PKT_PASS_SILENT 2

/* Both directions sent a FIN. */
#define CTF_CLOSED (CTF_TX_CLOSING | CTF_RX_CLOSING)

static __always_inline __u32 now_seconds(void)
{
	return bpf_ktime_get_boot_ns() / NSEC_PER_SEC;
}

/*
 * parse_l4 reads the transport header at off, which must end before end
 * (the end of the IP packet, short of any Ethernet padding), into the
 * ports, TCP flags and ICMP type of flow.
 */
static __always_inline int parse_l4(struct __sk_buff *skb, __u32 off, __u32 end, struct flow_summary *flow)
{
	switch (flow->proto) {
	case IPPROTO_TCP: {
		struct tcphdr tcp;

		if (off + sizeof(tcp) > end || bpf_skb_load_bytes(skb, off, &tcp, sizeof(tcp)))
			return -DROP_INVALID_PACKET;
		/* The data offset counts the options, which must fit too. */
		if (tcp.doff < 5 || off + tcp.doff * 4 > end)
			return -DROP_INVALID_PACKET;
		flow->sport = tcp.source;
		flow->dport = tcp.dest;
		/* The byte after the data offset: the flags, CWR to FIN. */
		flow->tcp_flags = ((const __u8 *)&tcp)[13];
		return PKT_TRACK;
	}
	case IPPROTO_UDP: {
		struct udphdr udp;

		if (off + sizeof(udp) > end || bpf_skb_load_bytes(skb, off, &udp, sizeof(udp)))
			return -DROP_INVALID_PACKET;
		flow->sport = udp.source;
		flow->dport = udp.dest;
		return PKT_TRACK;
	}
	case IPPROTO_ICMP:
	case IPPROTO_ICMPV6: {
		struct icmp_echo_hdr icmp;
		bool v6 = flow->proto == IPPROTO_ICMPV6;

		if (off + sizeof(icmp) > end || bpf_skb_load_bytes(skb, off, &icmp, sizeof(icmp)))
			return -DROP_INVALID_PACKET;
		flow->icmp_type = icmp.type;
		flow->icmp_code = icmp.code;
		/* An echo reply's tuple reversed is its request's: the
		 * identifier is the request's source port. */
		if (icmp.type == (v6 ? ICMPV6_ECHO_REQUEST : ICMP_ECHO)) {
			flow->sport = icmp.id;
			return PKT_TRACK;
		}
		if (icmp.type == (v6 ? ICMPV6_ECHO_REPLY : ICMP_ECHOREPLY)) {
			flow->dport = icmp.id;
			return PKT_TRACK;
		}
		/* Errors, neighbour discovery, ...: no connection of their own. */
		return PKT_UNTRACKED;
	}
	}
	/* Any other protocol is tracked by addresses alone. */
	return PKT_TRACK;
}

/*
 * The length of an IP packet whose header says 0: a BIG TCP aggregate
 * (larger than 64 KiB), which the stack hands over with a zero length and
 * the real one in the skb. Anything else that says 0 is broken.
 */
static __always_inline __u32 big_packet_len(struct __sk_buff *skb)
{
	return skb->gso_size ? skb->len - ETH_HLEN : 0;
}

static __always_inline int parse_ipv4(struct __sk_buff *skb, struct flow_summary *flow)
{
	struct iphdr ip;
	__u32 hlen, len;

	if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)))
		return -DROP_INVALID_PACKET;
	hlen = ip.ihl * 4;
	len = bpf_ntohs(ip.tot_len);
	if (len == 0)
		len = big_packet_len(skb);
	if (ip.version != 4 || ip.ihl < 5 || len < hlen || ETH_HLEN + len > skb->len)
		return -DROP_INVALID_PACKET;

	flow->family = EVENT_FAMILY_IPV4;
	flow->proto = ip.protocol;
	__builtin_memcpy(flow->src, &ip.saddr, 4);
	__builtin_memcpy(flow->dst, &ip.daddr, 4);
	/* Only the first fragment carries the transport header. */
	if (ip.frag_off & bpf_htons(IPV4_FRAG_OFFSET))
		return PKT_UNTRACKED;
	return parse_l4(skb, ETH_HLEN + hlen, ETH_HLEN + len, flow);
}

/*
 * IPv6 extension headers are not walked: a packet whose next header is
 * not TCP, UDP or ICMPv6 is tracked under that header's number with no
 * ports, which still tells its connections apart by address.
 */
static __always_inline int parse_ipv6(struct __sk_buff *skb, struct flow_summary *flow)
{
	struct ipv6hdr ip6;
	__u32 end;

	if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip6, sizeof(ip6)))
		return -DROP_INVALID_PACKET;
	end = ETH_HLEN + sizeof(ip6) + bpf_ntohs(ip6.payload_len);
	if (!ip6.payload_len)
		end = ETH_HLEN + big_packet_len(skb);
	if (ip6.version != 6 || end < ETH_HLEN + sizeof(ip6) || end > skb->len)
		return -DROP_INVALID_PACKET;

	flow->family = EVENT_FAMILY_IPV6;
	flow->proto = ip6.nexthdr;
	__builtin_memcpy(flow->src, &ip6.saddr, 16);
	__builtin_memcpy(flow->dst, &ip6.daddr, 16);
	return parse_l4(skb, ETH_HLEN + sizeof(ip6), end, flow);
}

/* parse_packet fills flow from the packet and says what to do with it. */
static __always_inline int parse_packet(struct __sk_buff *skb, struct flow_summary *flow)
{
	struct ethhdr eth;

	if (bpf_skb_load_bytes(skb, 0, &eth, sizeof(eth)))
		return -DROP_INVALID_PACKET;
	switch (eth.h_proto) {
	case bpf_htons(ETH_P_IP):
		return parse_ipv4(skb, flow);
	case bpf_htons(ETH_P_IPV6):
		return parse_ipv6(skb, flow);
	case bpf_htons(ETH_P_ARP):
		/* Neighbour resolution: nothing to track or report. */
		return PKT_PASS_SILENT;
	}
	return -DROP_UNSUPPORTED_L3;
}

/* The local endpoint that has addr, of flow's family, or NULL. */
static __always_inline const struct endpoint_info *endpoint_lookup(const struct flow_summary *flow,
								   const __u8 *addr)
{
	struct endpoint_key key = {.family = flow->family};

	if (flow->family == EVENT_FAMILY_IPV4)
		__builtin_memcpy(key.addr, addr, 4);
	else
		__builtin_memcpy(key.addr, addr, 16);
	return bpf_map_lookup_elem(&cellium_endpoints, &key);
}

/* A SYN that opens a connection: the handshake's first packet. */
static __always_inline bool tcp_opens(__u8 tcp_flags)
{
	return (tcp_flags & (TCP_HDR_SYN | TCP_HDR_ACK)) == TCP_HDR_SYN;
}

/* The entry flags a TCP packet adds, in the original direction or the reply's. */
static __always_inline __u16 tcp_entry_flags(__u8 tcp_flags, bool reply)
{
	__u16 flags = 0;

	if (tcp_flags & TCP_HDR_RST)
		flags |= CTF_RST_SEEN;
	if (tcp_flags & TCP_HDR_FIN)
		flags |= reply ? CTF_RX_CLOSING : CTF_TX_CLOSING;
	return flags;
}

/* How long an entry with flags lives past its last packet, in seconds. */
static __always_inline __u32 ct_lifetime(__u8 proto, __u16 flags)
{
	if (proto != IPPROTO_TCP)
		return ct_lifetime_nontcp;
	if ((flags & CTF_RST_SEEN) || (flags & CTF_CLOSED) == CTF_CLOSED)
		return ct_lifetime_close;
	if (flags & CTF_ESTABLISHED)
		return ct_lifetime_tcp;
	return ct_lifetime_syn;
}

/* ct_create records the connection that flow opens under key. */
static __always_inline int ct_create(void *map, const void *key, const struct flow_summary *flow,
				     __u16 endpoint_id, __u32 now)
{
	struct ct_entry entry = {
		.endpoint_id = endpoint_id,
		.packets_tx = 1,
		.bytes_tx = flow->len,
		.last_tx = now,
	};

	/* TCP first seen after its handshake (the agent restarted, the
	 * entry was evicted) is taken as established, not refused. */
	if (flow->proto == IPPROTO_TCP)
		entry.flags = (tcp_opens(flow->tcp_flags) ? CTF_SYN_SEEN : CTF_ESTABLISHED) |
			      tcp_entry_flags(flow->tcp_flags, false);
	entry.lifetime = now + ct_lifetime(flow->proto, entry.flags);
	/* BPF_ANY: two CPUs may create the same connection at once, and a
	 * SYN restarts a closed entry in place. */
	if (bpf_map_update_elem(map, key, &entry, BPF_ANY))
		return -DROP_CT_CREATE_FAILED;
	return 0;
}

/*
 * ct_process finds the packet's connection in map, or creates it, and
 * accounts the packet: fwd is the packet's tuple with this program's key
 * flag, rev the tuple reversed with the other program's. It sets
 * flow->ct_state, and *report when the packet is worth an event under
 * aggregation. It returns 0 or -DROP_CT_CREATE_FAILED.
 *
 * Several CPUs may update one entry: the counters are added atomically;
 * flags, lifetime and times are plain stores, where a lost update costs at
 * most an event or a second of lifetime.
 */
static __always_inline int ct_process(void *map, const void *fwd, const void *rev, struct flow_summary *flow,
				      __u16 endpoint_id, bool *report)
{
	__u32 now = now_seconds();
	struct ct_entry *entry;
	bool reply = false;
	__u16 flags, old;
	__u32 last, lifetime;

	entry = bpf_map_lookup_elem(map, fwd);
	if (!entry) {
		entry = bpf_map_lookup_elem(map, rev);
		reply = entry != NULL;
	}
	/* A SYN on the tuple of a connection that saw a FIN or a RST opens a
	 * new connection (the port was reused): it replaces the old entry.
	 * Found as a reply, the old one is keyed the other way round, so it
	 * goes. */
	if (entry && tcp_opens(flow->tcp_flags) && (entry->flags & (CTF_TX_CLOSING | CTF_RX_CLOSING | CTF_RST_SEEN))) {
		if (reply)
			bpf_map_delete_elem(map, rev);
		entry = NULL;
		reply = false;
	}
	if (!entry) {
		flow->ct_state = CT_NEW;
		*report = true;
		return ct_create(map, fwd, flow, endpoint_id, now);
	}

	old = entry->flags;
	flags = old;
	if (flow->proto == IPPROTO_TCP)
		flags |= tcp_entry_flags(flow->tcp_flags, reply);
	if (reply) {
		flags |= CTF_SEEN_REPLY | CTF_ESTABLISHED;
		flow->ct_state = CT_REPLY;
		__sync_fetch_and_add(&entry->packets_rx, 1);
		__sync_fetch_and_add(&entry->bytes_rx, flow->len);
		last = entry->last_rx;
		if (last != now)
			entry->last_rx = now;
	} else {
		flow->ct_state = CT_ESTABLISHED;
		__sync_fetch_and_add(&entry->packets_tx, 1);
		__sync_fetch_and_add(&entry->bytes_tx, flow->len);
		last = entry->last_tx;
		if (last != now)
			entry->last_tx = now;
	}
	if (flags != old)
		entry->flags = flags;
	/* Stores only on change keep the entry's cache line shared between
	 * the CPUs of a busy connection. */
	lifetime = now + ct_lifetime(flow->proto, flags);
	if (entry->lifetime != lifetime)
		entry->lifetime = lifetime;
	*report = flags != old || last != now;
	return 0;
}

static __always_inline int ct_track4(struct flow_summary *flow, __u8 key_flag, __u16 endpoint_id, bool *report)
{
	void *map = flow->proto == IPPROTO_TCP ? (void *)&cellium_ct4_tcp : (void *)&cellium_ct4_any;
	struct ct4_key fwd = {
		.src_port = flow->sport,
		.dst_port = flow->dport,
		.proto = flow->proto,
		.flags = key_flag,
	};
	struct ct4_key rev = {
		.src_port = flow->dport,
		.dst_port = flow->sport,
		.proto = flow->proto,
		.flags = key_flag ^ CT_KEY_F_INCOMING,
	};

	__builtin_memcpy(&fwd.src_addr, flow->src, 4);
	__builtin_memcpy(&fwd.dst_addr, flow->dst, 4);
	rev.src_addr = fwd.dst_addr;
	rev.dst_addr = fwd.src_addr;
	return ct_process(map, &fwd, &rev, flow, endpoint_id, report);
}

static __always_inline int ct_track6(struct flow_summary *flow, __u8 key_flag, __u16 endpoint_id, bool *report)
{
	void *map = flow->proto == IPPROTO_TCP ? (void *)&cellium_ct6_tcp : (void *)&cellium_ct6_any;
	struct ct6_key fwd = {
		.src_port = flow->sport,
		.dst_port = flow->dport,
		.proto = flow->proto,
		.flags = key_flag,
	};
	struct ct6_key rev = {
		.src_port = flow->dport,
		.dst_port = flow->sport,
		.proto = flow->proto,
		.flags = key_flag ^ CT_KEY_F_INCOMING,
	};

	__builtin_memcpy(fwd.src_addr, flow->src, 16);
	__builtin_memcpy(fwd.dst_addr, flow->dst, 16);
	__builtin_memcpy(rev.src_addr, flow->dst, 16);
	__builtin_memcpy(rev.dst_addr, flow->src, 16);
	return ct_process(map, &fwd, &rev, flow, endpoint_id, report);
}

static __always_inline void emit_flow_event(struct __sk_buff *skb, struct flow_record *rec, __u8 type,
					    __u8 subtype, __u16 endpoint_id)
{
	event_hdr_init(&rec->hdr, type, subtype, endpoint_id, skb->ifindex);
	event_output_flow(rec);
}

/*
 * handle_packet is both programs: to_endpoint tells them apart. The
 * endpoint a packet belongs to is its source's on the way out of the
 * endpoint and its destination's on the way in.
 */
static __always_inline int handle_packet(struct __sk_buff *skb, bool to_endpoint)
{
	struct flow_record rec = {};
	struct flow_summary *flow = &rec.flow;
	const struct endpoint_info *ep;
	__u8 point = TRACE_TO_ENDPOINT;
	__u16 endpoint_id = 0;
	bool report = true;
	int ret;

	flow->len = skb->len;
	ret = parse_packet(skb, flow);
	if (ret == PKT_PASS_SILENT)
		return TC_ACT_UNSPEC;

	if (flow->family != EVENT_FAMILY_NONE) {
		const struct ipcache_value *id;

		id = ipcache_lookup(flow->family, flow->src);
		if (id)
			flow->src_identity = id->identity;
		id = ipcache_lookup(flow->family, flow->dst);
		if (id)
			flow->dst_identity = id->identity;
		ep = endpoint_lookup(flow, to_endpoint ? flow->dst : flow->src);
		if (ep)
			endpoint_id = ep->endpoint_id;
		if (!to_endpoint)
			point = endpoint_lookup(flow, flow->dst) ? TRACE_FROM_ENDPOINT : TRACE_TO_STACK;
	}

	if (ret == PKT_TRACK) {
		__u8 key_flag = to_endpoint ? CT_KEY_F_INCOMING : 0;

		if (flow->family == EVENT_FAMILY_IPV4)
			ret = ct_track4(flow, key_flag, endpoint_id, &report);
		else
			ret = ct_track6(flow, key_flag, endpoint_id, &report);
	}
	if (ret < 0) {
		emit_flow_event(skb, &rec, EVENT_DROP, -ret, endpoint_id);
		return TC_ACT_SHOT;
	}
	if (report || !monitor_aggregation)
		emit_flow_event(skb, &rec, EVENT_TRACE, point, endpoint_id);
	/* After conntrack, which tracks the reply under the pod's address,
	 * as the pod's connection is. */
	if (lb_dsr && ret == PKT_TRACK && flow->family == EVENT_FAMILY_IPV4) {
		__be32 src, dst;

		__builtin_memcpy(&src, flow->src, 4);
		__builtin_memcpy(&dst, flow->dst, 4);
		if (to_endpoint)
			dsr_record4(skb, flow->proto, src, dst, flow->sport, flow->dport,
				    flow->proto == IPPROTO_TCP && tcp_opens(flow->tcp_flags));
		else if (dsr_reply4(skb, flow->proto, src, dst, flow->sport, flow->dport))
			return TC_ACT_SHOT;
	}
	return TC_ACT_UNSPEC;
}

SEC("tc")
int cellium_from_endpoint(struct __sk_buff *skb)
{
	return handle_packet(skb, false);
}

SEC("tc")
int cellium_to_endpoint(struct __sk_buff *skb)
{
	return handle_packet(skb, true);
}

char __license[] SEC("license") = "Dual BSD/GPL";
