// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)

// Not Go's to build: bpf2go compiles it (see gen.go).
//go:build ignore

/*
 * The endpoint datapath: TC programs on the host side of an endpoint's veth
 * that track the endpoint's connections and report its packets. Each is a
 * direct-action bpf filter on the host side's clsact qdisc (the loader's
 * cells/loader/tc.go; endpoints an earlier agent attached may still hold
 * a pinned tcx link instead).
 *
 *   cellium_from_endpoint  ingress filter of the host-side veth: what the
 *                          endpoint sends
 *   cellium_to_endpoint    egress filter of the host-side veth: what goes
 *                          into the endpoint
 *
 * They translate nothing (the socket programs of sock_lb.c translate
 * services), except for Direct Server Return (dsr.h, --lb-mode=dsr):
 * the to-endpoint program remembers the frontend that a packet from
 * another node's NodePort carries, the from-endpoint program sends the
 * pod's replies from it. Otherwise they parse the packet, account it in
 * the conntrack maps of ct.h, find the source's and the destination's
 * security identities in the ipcache (ipcache.h), enforce the endpoint's
 * network policy (policy.h), and write trace, drop and policy-verdict
 * events (events.h) that carry them.
 * A packet they pass goes on with TC_ACT_UNSPEC: the hook's next filter
 * (or, on a tcx link, the next program: TCX_NEXT) still sees it.
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
 * The from-endpoint program drops, before conntrack, a packet whose source
 * is not an address of the endpoint whose veth it came in on
 * (DROP_INVALID_SOURCE): conntrack keys carry no endpoint, so a forged
 * source would be judged by another endpoint's policy, or none, and could
 * plant entries that other endpoints' connections find as replies.
 *
 * Policy is decided once per connection and program, when conntrack would
 * create the entry: from-endpoint decides the endpoint's egress with the
 * destination's identity as the peer, to-endpoint its ingress with the
 * source's. A denied packet creates no entry, so its connection stays
 * new and every retry is decided again; an allowed one creates it, and
 * the connection's later packets and its replies find it and pay no policy
 * lookup. ICMP errors about a tracked connection (CT_RELATED) pass; so do
 * IPv6 neighbour discovery and MLD. IPv6 extension headers are walked to
 * the upper-layer header. A fragment after the first has no ports: it
 * passes if its datagram's first fragment did (cellium_frags), and in an
 * isolated direction otherwise only where every port of its protocol is
 * allowed to the peer, so that it never carries denied traffic.
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
#include "policy.h"

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
#define ICMP_DEST_UNREACH 3
#define ICMP_ECHO 8
#define ICMP_TIME_EXCEEDED 11
#define ICMP_PARAMETERPROB 12
/* ICMPv6 errors are the types below 128; MLD and neighbour discovery
 * these. */
#define ICMPV6_MLD_QUERY 130
#define ICMPV6_ND_REDIRECT 137
#define ICMPV6_MLD2_REPORT 143

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

/* IPv6 extension headers the parser walks (RFC 8200 4.1, RFC 4302). */
#define IPV6_EXT_HOP 0
#define IPV6_EXT_ROUTING 43
#define IPV6_EXT_FRAGMENT 44
#define IPV6_EXT_AUTH 51
#define IPV6_EXT_DEST 60
/* At most this many of them; a packet with more is invalid-packet. Real
 * packets carry at most a few (hop-by-hop, destination options, routing,
 * fragment, AH, destination options). */
#define IPV6_MAX_EXT_HDRS 8
/* The fragment header's offset field (in the big-endian 16 bits that also
 * hold the M flag): not 0 after the first fragment. */
#define IPV6_FRAG_OFFSET 0xfff8

/* struct iphdr.frag_off: more fragments follow. */
#define IPV4_FRAG_MORE 0x2000
/* The fragment header's M flag. */
#define IPV6_FRAG_MORE 0x0001

/*
 * A fragmented datagram is a connection's only in its first fragment, the
 * one with the transport header. The programs remember each first fragment
 * they let pass, by what the receiver reassembles a datagram by (the
 * addresses, the protocol and the identification) and by the program, for
 * FRAG_LIFETIME seconds: a later fragment that finds its datagram passes,
 * one that does not is decided by policy in an isolated direction as a
 * connection of its protocol to port 0. A later fragment can only join
 * the datagram of its own key at the receiver, whose first fragment passed.
 *
 * The map is the programs' own (the loader creates it with them, no agent
 * cell pins it): a restart forgets the datagrams in flight, whose later
 * fragments are then decided as if their first were not seen. LRU: a full
 * map forgets the oldest datagrams.
 */
#define FRAG_LIFETIME 60

struct frag_key {
	/* IPv4 in the first 4 bytes. */
	__u8 src[16];
	__u8 dst[16];
	/* The identification: IPv4's 16 bits in the low half. */
	__u32 id;
	__u8 family;
	__u8 proto;
	/* CT_KEY_F_INCOMING: the to-endpoint program's. */
	__u8 flags;
	__u8 pad;
};

struct frag_entry {
	/* Seconds of CLOCK_BOOTTIME, as conntrack's lifetime. */
	__u32 expires;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct frag_key);
	__type(value, struct frag_entry);
	__uint(max_entries, 8192);
} cellium_frags SEC(".maps");

/* What the parser tells of a fragment. */
struct frag_info {
	__u32 id;
	/* The first fragment of a fragmented datagram (offset 0, more follow). */
	bool first;
	/* The protocol every fragment names: IPv4's, or the next header of
	 * IPv6's Fragment header (which a later fragment has, not what the
	 * first's walk found behind a Destination Options header or AH). */
	__u8 proto;
};

/* What the parser made of a packet; negative values are -DROP_*. */
/* Track it in conntrack. */
#define PKT_TRACK 0
/* Report it untracked: no tuple to track (a later IPv4 fragment, ICMP other than echo). */
#define PKT_UNTRACKED 1
/* Pass it silently: ARP. */
#define PKT_PASS_SILENT 2
/* Report it untracked, and look for the connection it is an error about: an
 * ICMP or ICMPv6 error. */
#define PKT_ICMP_ERROR 3
/* Report it untracked, and pass it whatever the policy and whatever its
 * source: IPv6 neighbour discovery and MLD, without which the endpoint has
 * no network. */
#define PKT_UNTRACKED_ALWAYS 4
/* A fragment after the first, which has no transport header: reported
 * untracked; it passes if its datagram's first fragment did (cellium_frags),
 * and is decided by policy with port 0 otherwise. */
#define PKT_FRAGMENT 5

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
	case IPPROTO_SCTP: {
		/* The common header: the ports, as UDP's, then the
		 * verification tag and the checksum. Policy matches SCTP
		 * ports as it does TCP's and UDP's, never as TCP. */
		__be16 hdr[6];

		if (off + sizeof(hdr) > end || bpf_skb_load_bytes(skb, off, hdr, sizeof(hdr)))
			return -DROP_INVALID_PACKET;
		flow->sport = hdr[0];
		flow->dport = hdr[1];
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
		if (v6 ? icmp.type < ICMPV6_ECHO_REQUEST
		       : icmp.type == ICMP_DEST_UNREACH || icmp.type == ICMP_TIME_EXCEEDED ||
				 icmp.type == ICMP_PARAMETERPROB)
			return PKT_ICMP_ERROR;
		if (v6 && ((icmp.type >= ICMPV6_MLD_QUERY && icmp.type <= ICMPV6_ND_REDIRECT) ||
			   icmp.type == ICMPV6_MLD2_REPORT))
			return PKT_UNTRACKED_ALWAYS;
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

static __always_inline int parse_ipv4(struct __sk_buff *skb, struct flow_summary *flow, __u32 *l4_off,
				      struct frag_info *frag)
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
	frag->id = bpf_ntohs(ip.id);
	frag->proto = ip.protocol;
	if (ip.frag_off & bpf_htons(IPV4_FRAG_OFFSET))
		return PKT_FRAGMENT;
	frag->first = ip.frag_off & bpf_htons(IPV4_FRAG_MORE);
	*l4_off = ETH_HLEN + hlen;
	return parse_l4(skb, ETH_HLEN + hlen, ETH_HLEN + len, flow);
}

static __always_inline bool ipv6_is_ext(__u8 nexthdr)
{
	return nexthdr == IPV6_EXT_HOP || nexthdr == IPV6_EXT_ROUTING || nexthdr == IPV6_EXT_FRAGMENT ||
	       nexthdr == IPV6_EXT_AUTH || nexthdr == IPV6_EXT_DEST;
}

/* The first 8 bytes of every extension header walked: the next header and
 * the length; frag_off is the fragment header's (offset and M flag). */
struct ipv6_ext_hdr {
	__u8 nexthdr;
	__u8 hdrlen;
	__be16 frag_off;
	__be32 ident;
};

/* ipv6_skip_ext's answer for a fragment after the first. */
#define IPV6_LATER_FRAGMENT 1

/*
 * ipv6_skip_ext walks the extension headers from *off, whose type is *nh,
 * to the upper-layer header, which must start before end: on return *off
 * is where it starts and *nh its protocol, and a fragment header fills
 * frag. It returns 0,
 * IPV6_LATER_FRAGMENT for a fragment after the first (*off just past the
 * fragment header: no upper-layer header follows), or -DROP_INVALID_PACKET
 * for headers cut short or more than IPV6_MAX_EXT_HDRS of them.
 */
static __always_inline int ipv6_skip_ext(struct __sk_buff *skb, __u32 *off, __u32 end, __u8 *nh,
					 struct frag_info *frag)
{
	struct ipv6_ext_hdr hdr;
	int i;

	for (i = 0; i < IPV6_MAX_EXT_HDRS; i++) {
		if (!ipv6_is_ext(*nh))
			return 0;
		if (*off + sizeof(hdr) > end || bpf_skb_load_bytes(skb, *off, &hdr, sizeof(hdr)))
			return -DROP_INVALID_PACKET;
		if (*nh == IPV6_EXT_FRAGMENT) {
			*off += sizeof(hdr);
			*nh = hdr.nexthdr;
			frag->id = bpf_ntohl(hdr.ident);
			frag->proto = hdr.nexthdr;
			if (hdr.frag_off & bpf_htons(IPV6_FRAG_OFFSET))
				return IPV6_LATER_FRAGMENT;
			frag->first = hdr.frag_off & bpf_htons(IPV6_FRAG_MORE);
			continue;
		}
		/* AH counts 4-byte words less 2, the others 8-byte words less 1. */
		*off += *nh == IPV6_EXT_AUTH ? (hdr.hdrlen + 2) * 4 : (hdr.hdrlen + 1) * 8;
		*nh = hdr.nexthdr;
	}
	return ipv6_is_ext(*nh) ? -DROP_INVALID_PACKET : 0;
}

/*
 * The extension headers are walked to the upper-layer header (hop-by-hop,
 * routing, fragment, destination options, AH), so that a first fragment or
 * an MLD message behind its hop-by-hop header is parsed, tracked and
 * decided as its protocol, with its ports. A later fragment has no ports:
 * it is PKT_FRAGMENT under its upper-layer protocol. ESP, no next header
 * and any other protocol are tracked under their number with no ports,
 * which still tells their connections apart by address.
 */
static __always_inline int parse_ipv6(struct __sk_buff *skb, struct flow_summary *flow, __u32 *l4_off,
				      struct frag_info *frag)
{
	struct ipv6hdr ip6;
	__u32 end, off = ETH_HLEN + sizeof(ip6);
	__u8 nh;
	int ret;

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
	nh = ip6.nexthdr;
	ret = ipv6_skip_ext(skb, &off, end, &nh, frag);
	if (ret < 0)
		return ret;
	flow->proto = nh;
	if (ret == IPV6_LATER_FRAGMENT)
		return PKT_FRAGMENT;
	*l4_off = off;
	return parse_l4(skb, off, end, flow);
}

/*
 * parse_packet fills flow from the packet and says what to do with it;
 * *l4_off is where the transport header starts.
 */
static __always_inline int parse_packet(struct __sk_buff *skb, struct flow_summary *flow, __u32 *l4_off,
					struct frag_info *frag)
{
	struct ethhdr eth;

	if (bpf_skb_load_bytes(skb, 0, &eth, sizeof(eth)))
		return -DROP_INVALID_PACKET;
	switch (eth.h_proto) {
	case bpf_htons(ETH_P_IP):
		return parse_ipv4(skb, flow, l4_off, frag);
	case bpf_htons(ETH_P_IPV6):
		return parse_ipv6(skb, flow, l4_off, frag);
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
 * The policy decision of a packet that opens a connection: policy_check's
 * arguments other than the packet's, and its answer (POLICY_NOT_ENFORCED
 * also for a packet that opened nothing).
 */
struct policy_req {
	__u32 peer;
	__u16 endpoint_id;
	__u8 direction;
	int verdict;
	/* The allowing entry's cookie, with a verdict > 0. */
	__u32 cookie;
};

/* policy_decide is policy_check of pol for the packet's new connection to
 * dport: the peer is the source on ingress, the destination on egress. */
static __always_inline int policy_decide(struct policy_req *pol, const struct flow_summary *flow, __be16 dport)
{
	return policy_check(pol->endpoint_id, pol->direction, pol->peer, flow->family,
			    pol->direction == TRAFFIC_INGRESS ? flow->src : flow->dst, flow->proto, dport, &pol->cookie);
}

/*
 * ct_process finds the packet's connection in map, or creates it if the
 * endpoint's policy allows it (pol), and accounts the packet: fwd is the
 * packet's tuple with this program's key flag, rev the tuple reversed with
 * the other program's. It sets flow->ct_state, and *report when the packet
 * is worth an event under aggregation. It returns 0,
 * -DROP_CT_CREATE_FAILED or -DROP_POLICY_DENIED.
 *
 * Several CPUs may update one entry: the counters are added atomically;
 * flags, lifetime and times are plain stores, where a lost update costs at
 * most an event or a second of lifetime.
 */
static __always_inline int ct_process(void *map, const void *fwd, const void *rev, struct flow_summary *flow,
				      struct policy_req *pol, bool *report)
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
		pol->verdict = policy_decide(pol, flow, flow->dport);
		if (pol->verdict < 0)
			return pol->verdict;
		return ct_create(map, fwd, flow, pol->endpoint_id, now);
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

static __always_inline int ct_track4(struct flow_summary *flow, __u8 key_flag, struct policy_req *pol, bool *report)
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
	return ct_process(map, &fwd, &rev, flow, pol, report);
}

static __always_inline int ct_track6(struct flow_summary *flow, __u8 key_flag, struct policy_req *pol, bool *report)
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
	return ct_process(map, &fwd, &rev, flow, pol, report);
}

/*
 * quoted_ports reads the ports of the conntrack tuple of the packet an ICMP
 * error quotes, whose transport header is at off: false if the error quotes
 * no packet that conntrack tracks (an ICMP message other than echo).
 */
static __always_inline bool quoted_ports(struct __sk_buff *skb, __u32 off, __u8 proto, __be16 *sport, __be16 *dport)
{
	struct icmp_echo_hdr icmp;
	__be16 ports[2];

	switch (proto) {
	case IPPROTO_TCP:
	case IPPROTO_UDP:
	case IPPROTO_SCTP:
		if (bpf_skb_load_bytes(skb, off, ports, sizeof(ports)))
			return false;
		*sport = ports[0];
		*dport = ports[1];
		return true;
	case IPPROTO_ICMP:
	case IPPROTO_ICMPV6:
		if (bpf_skb_load_bytes(skb, off, &icmp, sizeof(icmp)))
			return false;
		if (icmp.type == (proto == IPPROTO_ICMPV6 ? ICMPV6_ECHO_REQUEST : ICMP_ECHO)) {
			*sport = icmp.id;
			return true;
		}
		if (icmp.type == (proto == IPPROTO_ICMPV6 ? ICMPV6_ECHO_REPLY : ICMP_ECHOREPLY)) {
			*dport = icmp.id;
			return true;
		}
		return false;
	}
	return true;
}

/*
 * The quoted packet is one of its connection's, sent either way, and the
 * entry is either program's: the four keys it may have.
 */
#define CT_FIND_ANY(map, key, rev)                                                                   \
	({                                                                                           \
		bool found_ = bpf_map_lookup_elem(map, key) || bpf_map_lookup_elem(map, rev);        \
		if (!found_) {                                                                       \
			(key)->flags = CT_KEY_F_INCOMING;                                            \
			(rev)->flags = CT_KEY_F_INCOMING;                                            \
			found_ = bpf_map_lookup_elem(map, key) || bpf_map_lookup_elem(map, rev);     \
		}                                                                                    \
		found_;                                                                              \
	})

/* ct_related4 says whether the ICMP error at off quotes a tracked connection. */
static __always_inline bool ct_related4(struct __sk_buff *skb, __u32 off)
{
	struct ct4_key key = {}, rev = {};
	struct iphdr ip;
	void *map;

	if (bpf_skb_load_bytes(skb, off + sizeof(struct icmp_echo_hdr), &ip, sizeof(ip)) || ip.version != 4 ||
	    ip.ihl < 5)
		return false;
	if (!quoted_ports(skb, off + sizeof(struct icmp_echo_hdr) + ip.ihl * 4, ip.protocol, &key.src_port,
			  &key.dst_port))
		return false;
	key.src_addr = ip.saddr;
	key.dst_addr = ip.daddr;
	key.proto = ip.protocol;
	rev.src_addr = key.dst_addr;
	rev.dst_addr = key.src_addr;
	rev.src_port = key.dst_port;
	rev.dst_port = key.src_port;
	rev.proto = key.proto;
	map = key.proto == IPPROTO_TCP ? (void *)&cellium_ct4_tcp : (void *)&cellium_ct4_any;
	return CT_FIND_ANY(map, &key, &rev);
}

/* ct_related6 says whether the ICMPv6 error at off quotes a tracked connection. */
static __always_inline bool ct_related6(struct __sk_buff *skb, __u32 off)
{
	struct ct6_key key = {}, rev = {};
	struct ipv6hdr ip6;
	__u32 l4 = off + sizeof(struct icmp_echo_hdr) + sizeof(ip6);
	struct frag_info frag = {};
	__u8 nh;
	void *map;

	if (bpf_skb_load_bytes(skb, off + sizeof(struct icmp_echo_hdr), &ip6, sizeof(ip6)) || ip6.version != 6)
		return false;
	/* The quoted packet's extension headers, as far as the error
	 * quotes them; a later fragment has no ports to find it by. */
	nh = ip6.nexthdr;
	if (ipv6_skip_ext(skb, &l4, skb->len, &nh, &frag) != 0)
		return false;
	if (!quoted_ports(skb, l4, nh, &key.src_port, &key.dst_port))
		return false;
	__builtin_memcpy(key.src_addr, &ip6.saddr, 16);
	__builtin_memcpy(key.dst_addr, &ip6.daddr, 16);
	__builtin_memcpy(rev.src_addr, &ip6.daddr, 16);
	__builtin_memcpy(rev.dst_addr, &ip6.saddr, 16);
	key.proto = rev.proto = nh;
	rev.src_port = key.dst_port;
	rev.dst_port = key.src_port;
	map = key.proto == IPPROTO_TCP ? (void *)&cellium_ct6_tcp : (void *)&cellium_ct6_any;
	return CT_FIND_ANY(map, &key, &rev);
}

/*
 * policy_untracked decides a packet that conntrack does not track: an ICMP
 * error passes if it is about a tracked connection, which makes it
 * CT_RELATED; anything else is decided as a new connection would be.
 */
static __always_inline int policy_untracked(struct __sk_buff *skb, struct flow_summary *flow, __u32 l4_off,
					    int kind, struct policy_req *pol)
{
	if (!policy_enforced(pol->endpoint_id, pol->direction))
		return 0;
	if (kind == PKT_ICMP_ERROR) {
		bool related = flow->family == EVENT_FAMILY_IPV4 ? ct_related4(skb, l4_off) : ct_related6(skb, l4_off);

		if (related) {
			flow->ct_state = CT_RELATED;
			return 0;
		}
	}
	pol->verdict = policy_decide(pol, flow, 0);
	return pol->verdict < 0 ? pol->verdict : 0;
}

static __always_inline void frag_key_init(struct frag_key *key, const struct flow_summary *flow,
					  const struct frag_info *frag, __u8 key_flag)
{
	__builtin_memcpy(key->src, flow->src, 16);
	__builtin_memcpy(key->dst, flow->dst, 16);
	key->id = frag->id;
	key->family = flow->family;
	key->proto = frag->proto;
	key->flags = key_flag;
}

/* frag_record remembers a first fragment that passed. */
static __always_inline void frag_record(const struct flow_summary *flow, const struct frag_info *frag, __u8 key_flag)
{
	struct frag_key key = {};
	struct frag_entry entry = {.expires = now_seconds() + FRAG_LIFETIME};

	frag_key_init(&key, flow, frag, key_flag);
	bpf_map_update_elem(&cellium_frags, &key, &entry, BPF_ANY);
}

/* frag_seen says whether a later fragment's first fragment passed. */
static __always_inline bool frag_seen(const struct flow_summary *flow, const struct frag_info *frag, __u8 key_flag)
{
	struct frag_key key = {};
	const struct frag_entry *entry;

	frag_key_init(&key, flow, frag, key_flag);
	entry = bpf_map_lookup_elem(&cellium_frags, &key);
	return entry && entry->expires >= now_seconds();
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
	struct policy_req pol = {
		.direction = to_endpoint ? TRAFFIC_INGRESS : TRAFFIC_EGRESS,
	};
	__u8 point = TRACE_TO_ENDPOINT;
	__u8 key_flag = to_endpoint ? CT_KEY_F_INCOMING : 0;
	struct frag_info frag = {};
	bool report = true;
	__u32 l4_off = 0;
	int kind, ret = 0;

	flow->len = skb->len;
	kind = parse_packet(skb, flow, &l4_off, &frag);
	if (kind == PKT_PASS_SILENT)
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
			pol.endpoint_id = ep->endpoint_id;
		/* What an endpoint sends must come from one of its own
		 * addresses: the source's entry names the interface it
		 * belongs to. Conntrack keys carry no endpoint, so a forged
		 * source would otherwise pick another endpoint's egress
		 * policy (none for an unknown address) and plant entries that
		 * the other endpoint's connections find as replies. Neighbour
		 * discovery and MLD, whose sources are link-local or
		 * unspecified, pass as before (ARP did already). */
		if (!to_endpoint && kind >= 0 && kind != PKT_UNTRACKED_ALWAYS &&
		    (!ep || ep->ifindex != skb->ifindex)) {
			kind = -DROP_INVALID_SOURCE;
			pol.endpoint_id = 0;
		}
		if (!to_endpoint)
			point = endpoint_lookup(flow, flow->dst) ? TRACE_FROM_ENDPOINT : TRACE_TO_STACK;
		pol.peer = to_endpoint ? flow->src_identity : flow->dst_identity;
	}

	if (kind < 0) {
		ret = kind;
	} else if (kind == PKT_TRACK) {
		if (flow->family == EVENT_FAMILY_IPV4)
			ret = ct_track4(flow, key_flag, &pol, &report);
		else
			ret = ct_track6(flow, key_flag, &pol, &report);
	} else if (kind != PKT_UNTRACKED_ALWAYS && !(kind == PKT_FRAGMENT && frag_seen(flow, &frag, key_flag))) {
		/* A later fragment whose first was not seen too: in an
		 * isolated direction it passes only if every port of its
		 * protocol is allowed to the peer (port 0), since nothing
		 * tells which connection it belongs to. */
		ret = policy_untracked(skb, flow, l4_off, kind, &pol);
	}
	if (ret == -DROP_POLICY_DENIED)
		flow->direction = pol.direction;
	if (ret < 0) {
		emit_flow_event(skb, &rec, EVENT_DROP, -ret, pol.endpoint_id);
		return TC_ACT_SHOT;
	}
	if (frag.first)
		frag_record(flow, &frag, key_flag);
	if (report || !monitor_aggregation)
		emit_flow_event(skb, &rec, EVENT_TRACE, point, pol.endpoint_id);
	/* One per connection the policy let open, as its first trace. */
	if (pol.verdict > 0) {
		flow->direction = pol.direction;
		flow->policy_cookie = pol.cookie;
		emit_flow_event(skb, &rec, EVENT_POLICY_VERDICT, pol.verdict, pol.endpoint_id);
	}
	/* After conntrack, which tracks the reply under the pod's address,
	 * as the pod's connection is. */
	if (lb_dsr && kind == PKT_TRACK && flow->family == EVENT_FAMILY_IPV4) {
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
