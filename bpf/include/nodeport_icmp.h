/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * ICMP errors about NodePort-translated connections (issue 14), for
 * nodeport.c, which includes this after its NAT map and helpers: an error
 * (destination unreachable, all codes, fragmentation needed included; time
 * exceeded) quotes the header of the packet it is about, and when that
 * packet was translated the quote and the error's own addresses are
 * translated too, so that the other end of the connection recognises it
 * (path MTU discovery through a NodePort, for one).
 *
 * At the device's ingress (nodeport4_icmp_ingress):
 *   - about a packet sent to a remote backend (quoted node:natport ->
 *     backend, the error addressed to the node): the reply's entry (OUT,
 *     with SNAT) names the frontend and the client; the quote becomes
 *     client -> frontend, the error frontend -> client, and it is
 *     redirected to the client like the backend's replies.
 *   - about a reply the node translated, from the client (quoted frontend
 *     -> client, the error addressed to the frontend): the client's entry
 *     (IN) names the backend; the quote becomes backend -> client and the
 *     error goes to the backend, on to the stack for a local backend (the
 *     source stays the client's, as the connection's does), redirected
 *     from the node address for a remote one (quote backend ->
 *     node:natport).
 * At the device's egress (nodeport4_icmp_egress):
 *   - about a packet to a local backend (quoted client -> backend), sent
 *     by the node (fragmentation needed on the way to the pod) or by the
 *     backend (port unreachable): the reply's entry (OUT, no SNAT) names
 *     the frontend; the quote becomes client -> frontend and an error from
 *     the backend comes from the frontend.
 *
 * Anything else, an error without an entry, or a quote too short to hold
 * the IPv4 header and the ports, passes untouched (TC_ACT_UNSPEC).
 *
 * Checksums: the quoted IPv4 header's is updated, and the quoted TCP or
 * UDP checksum when the quote holds it (a UDP checksum of 0 stays 0); the
 * kernel checks neither, but the other end may look at them. The ICMP
 * checksum, over the whole message, is updated by the difference of every
 * quoted byte changed, and the outer IPv4 header's by its addresses'. They
 * are computed here, not with bpf_l4_csum_replace, which leaves a field
 * alone on a CHECKSUM_PARTIAL skb. A CHECKSUM_COMPLETE skb's csum needs no
 * update: both headers still sum to zero afterwards, as before.
 */
#ifndef CELLIUM_NODEPORT_ICMP_H
#define CELLIUM_NODEPORT_ICMP_H

#include <stdbool.h>
#include <stddef.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/tcp.h>
#include <linux/udp.h>

/* linux/icmp.h would pull in libc headers. */
#define ICMP_DEST_UNREACH 3
#define ICMP_TIME_EXCEEDED 11

/* An ICMP error's header: the unused word holds the next hop's MTU of a
 * fragmentation needed. */
struct icmp4_error_hdr {
	__u8 type;
	__u8 code;
	__sum16 checksum;
	__be32 unused;
};

/* struct iphdr.frag_off: the fragment offset. */
#define IPV4_FRAGMENT_OFFSET 0x1fff

/* An ICMP error about a TCP or UDP IPv4 packet, as found in the frame. */
struct icmp4_error {
	struct iphdr outer;
	struct iphdr inner; /* the quoted header's first 20 bytes */
	__be16 ports[2];    /* the quoted source and destination ports */
	/* The 4-byte aligned word of the quoted transport header that holds
	 * its checksum (UDP: length and checksum; TCP: checksum and urgent
	 * pointer), when the quote has it. */
	__be16 csum_word[2];
	__u32 icmp_off;
	__u32 inner_off;
	__u32 ports_off;
	__u32 csum_word_off;
	bool has_csum;
};

/* The checksum field value csum after data whose one's complement sum
 * changed by diff (bpf_csum_diff's result): RFC 1624's equation 3. */
static __always_inline __sum16 icmp4_csum_apply(__sum16 csum, __s64 diff)
{
	__u64 s = (__u16)~csum;

	s += (__u32)diff;
	s = (s & 0xffffffff) + (s >> 32);
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return (__sum16)~s;
}

/* icmp4_parse fills e from an ICMP error about a TCP or UDP IPv4 packet
 * and says whether the frame is one. */
static __always_inline bool icmp4_parse(struct __sk_buff *skb, struct icmp4_error *e)
{
	struct ethhdr eth;
	struct icmp4_error_hdr icmp;
	__u32 l4_off, end;

	if (bpf_skb_load_bytes(skb, 0, &eth, sizeof(eth)) || eth.h_proto != bpf_htons(ETH_P_IP))
		return false;
	if (bpf_skb_load_bytes(skb, ETH_HLEN, &e->outer, sizeof(e->outer)) || e->outer.version != 4 ||
	    e->outer.ihl < 5 || e->outer.protocol != IPPROTO_ICMP)
		return false;
	if (e->outer.frag_off & bpf_htons(IPV4_FRAGMENT))
		return false;
	e->icmp_off = ETH_HLEN + e->outer.ihl * 4;
	if (bpf_skb_load_bytes(skb, e->icmp_off, &icmp, sizeof(icmp)))
		return false;
	if (icmp.type != ICMP_DEST_UNREACH && icmp.type != ICMP_TIME_EXCEEDED)
		return false;
	e->inner_off = e->icmp_off + sizeof(icmp);
	if (bpf_skb_load_bytes(skb, e->inner_off, &e->inner, sizeof(e->inner)) || e->inner.version != 4 ||
	    e->inner.ihl < 5)
		return false;
	/* Only the first fragment holds the ports. */
	if (e->inner.frag_off & bpf_htons(IPV4_FRAGMENT_OFFSET))
		return false;
	l4_off = e->inner_off + e->inner.ihl * 4;
	e->ports_off = l4_off;
	/* The message ends where the outer header says, not at the frame's
	 * end, which may be padding. */
	end = ETH_HLEN + bpf_ntohs(e->outer.tot_len);
	if (l4_off + sizeof(e->ports) > end || bpf_skb_load_bytes(skb, l4_off, e->ports, sizeof(e->ports)))
		return false;
	switch (e->inner.protocol) {
	case IPPROTO_UDP:
		e->csum_word_off = l4_off + offsetof(struct udphdr, len);
		break;
	case IPPROTO_TCP:
		e->csum_word_off = l4_off + offsetof(struct tcphdr, check);
		break;
	default:
		return false;
	}
	/* A quote may end before the checksum (RFC 792 asks for 8 bytes of
	 * the transport header, TCP's checksum is past them). */
	e->has_csum = e->csum_word_off + sizeof(e->csum_word) <= end &&
		      !bpf_skb_load_bytes(skb, e->csum_word_off, e->csum_word, sizeof(e->csum_word));
	return true;
}

/* The quoted checksum's index in csum_word. */
static __always_inline int icmp4_csum_idx(const struct icmp4_error *e)
{
	return e->inner.protocol == IPPROTO_UDP ? 1 : 0;
}

/*
 * icmp4_translate rewrites the quote's source and destination to
 * src:sport and dst:dport, and the error's source and destination to
 * outer_src and outer_dst, fixing every checksum. Returns 0 or a
 * negative errno.
 */
static __always_inline int icmp4_translate(struct __sk_buff *skb, struct icmp4_error *e, __be32 src, __be16 sport,
					   __be32 dst, __be16 dport, __be32 outer_src, __be32 outer_dst)
{
	struct iphdr old_inner = e->inner, old_outer = e->outer;
	__be16 old_ports[2] = {e->ports[0], e->ports[1]};
	__be16 old_csum_word[2] = {e->csum_word[0], e->csum_word[1]};
	__u32 icmp_csum_off = e->icmp_off + offsetof(struct icmp4_error_hdr, checksum);
	__s64 addrs, ports, diff;
	__sum16 icmp_csum;
	int ret;

	/* The quoted header: addresses, then its checksum. */
	e->inner.saddr = src;
	e->inner.daddr = dst;
	addrs = bpf_csum_diff(&old_inner.saddr, 8, &e->inner.saddr, 8, 0);
	if (addrs < 0)
		return addrs;
	e->inner.check = icmp4_csum_apply(old_inner.check, addrs);

	/* The quoted transport checksum: the pseudo header's addresses and
	 * the ports. */
	e->ports[0] = sport;
	e->ports[1] = dport;
	ports = bpf_csum_diff((__be32 *)old_ports, 4, (__be32 *)e->ports, 4, 0);
	if (ports < 0)
		return ports;
	if (e->has_csum) {
		int i = icmp4_csum_idx(e);
		__sum16 c = e->csum_word[i];

		if (c || e->inner.protocol != IPPROTO_UDP) {
			__u32 both = (__u32)addrs + (__u32)ports;

			both += both < (__u32)addrs;
			c = icmp4_csum_apply(c, both);
			if (!c && e->inner.protocol == IPPROTO_UDP)
				c = (__sum16)0xffff;
			e->csum_word[i] = c;
		}
	}

	/* The ICMP checksum: every quoted byte that changed. */
	diff = bpf_csum_diff((__be32 *)&old_inner, sizeof(old_inner), (__be32 *)&e->inner, sizeof(e->inner), 0);
	if (diff < 0)
		return diff;
	diff = bpf_csum_diff((__be32 *)old_ports, 4, (__be32 *)e->ports, 4, diff);
	if (diff < 0)
		return diff;
	if (e->has_csum) {
		diff = bpf_csum_diff((__be32 *)old_csum_word, 4, (__be32 *)e->csum_word, 4, diff);
		if (diff < 0)
			return diff;
	}
	if (bpf_skb_load_bytes(skb, icmp_csum_off, &icmp_csum, sizeof(icmp_csum)))
		return -1;
	icmp_csum = icmp4_csum_apply(icmp_csum, diff);

	/* The error's own header. */
	e->outer.saddr = outer_src;
	e->outer.daddr = outer_dst;
	diff = bpf_csum_diff(&old_outer.saddr, 8, &e->outer.saddr, 8, 0);
	if (diff < 0)
		return diff;
	e->outer.check = icmp4_csum_apply(old_outer.check, diff);

	ret = bpf_skb_store_bytes(skb, e->inner_off, &e->inner, sizeof(e->inner), 0);
	if (!ret)
		ret = bpf_skb_store_bytes(skb, e->ports_off, e->ports, sizeof(e->ports), 0);
	if (!ret && e->has_csum)
		ret = bpf_skb_store_bytes(skb, e->csum_word_off, e->csum_word, sizeof(e->csum_word), 0);
	if (!ret)
		ret = bpf_skb_store_bytes(skb, icmp_csum_off, &icmp_csum, sizeof(icmp_csum), 0);
	if (!ret)
		ret = bpf_skb_store_bytes(skb, ETH_HLEN, &e->outer, sizeof(e->outer), 0);
	return ret;
}

/* The NAT entry of dir whose key is the quoted packet's tuple reversed. */
static __always_inline const struct nodeport4_nat *icmp4_lookup(const struct icmp4_error *e, __u8 dir)
{
	struct nodeport4_nat_key key = {
		.src_addr = e->inner.daddr,
		.dst_addr = e->inner.saddr,
		.src_port = e->ports[1],
		.dst_port = e->ports[0],
		.proto = e->inner.protocol,
		.dir = dir,
	};

	return bpf_map_lookup_elem(&cellium_nodeport4_nat, &key);
}

/* nodeport4_icmp_ingress: see the top of the file. The verdict for a frame
 * that is not TCP or UDP IPv4. */
static __always_inline int nodeport4_icmp_ingress(struct __sk_buff *skb)
{
	struct icmp4_error e = {};
	const struct nodeport4_nat *nat;
	struct nodeport4_nat v;

	if (!icmp4_parse(skb, &e))
		return TC_ACT_UNSPEC;
	/* Errors come back to the quoted packet's source. */
	if (e.outer.daddr != e.inner.saddr)
		return TC_ACT_UNSPEC;

	/* About a packet sent to a remote backend: the reply's entry. */
	nat = icmp4_lookup(&e, NODEPORT_NAT_OUT);
	if (nat && (nat->flags & NODEPORT_NAT_F_SNAT)) {
		v = *nat;
		if (icmp4_translate(skb, &e, v.snat_address, v.snat_port, v.address, v.port, v.address,
				    v.snat_address))
			return TC_ACT_SHOT;
		return forward4(skb, v.address, v.snat_address, IPPROTO_ICMP);
	}

	/* About a reply sent to the client: the client's entry, whose key is
	 * the reply's tuple reversed with the frontend in it. */
	nat = icmp4_lookup(&e, NODEPORT_NAT_IN);
	if (!nat)
		return TC_ACT_UNSPEC;
	v = *nat;
	if (!(v.flags & NODEPORT_NAT_F_SNAT)) {
		if (icmp4_translate(skb, &e, v.address, v.port, e.inner.daddr, e.ports[1], e.outer.saddr,
				    v.address))
			return TC_ACT_SHOT;
		return TC_ACT_UNSPEC;
	}
	if (icmp4_translate(skb, &e, v.address, v.port, v.snat_address, v.snat_port, v.snat_address, v.address))
		return TC_ACT_SHOT;
	return forward4(skb, v.snat_address, v.address, IPPROTO_ICMP);
}

/* nodeport4_icmp_egress: see the top of the file. The verdict for a frame
 * that is not TCP or UDP IPv4. */
static __always_inline int nodeport4_icmp_egress(struct __sk_buff *skb)
{
	struct icmp4_error e = {};
	const struct nodeport4_nat *nat;
	struct nodeport4_nat v;
	__be32 outer_src;

	if (!icmp4_parse(skb, &e))
		return TC_ACT_UNSPEC;
	if (e.outer.daddr != e.inner.saddr)
		return TC_ACT_UNSPEC;
	nat = icmp4_lookup(&e, NODEPORT_NAT_OUT);
	/* A remote backend's connections are translated at ingress. */
	if (!nat || (nat->flags & NODEPORT_NAT_F_SNAT))
		return TC_ACT_UNSPEC;
	v = *nat;
	/* The backend's own error comes from the frontend, as its replies
	 * do; a router's (the node's) keeps its source. */
	outer_src = e.outer.saddr == e.inner.daddr ? v.address : e.outer.saddr;
	if (icmp4_translate(skb, &e, e.inner.saddr, e.ports[0], v.address, v.port, outer_src, e.outer.daddr))
		return TC_ACT_SHOT;
	return TC_ACT_UNSPEC;
}

#endif /* CELLIUM_NODEPORT_ICMP_H */
