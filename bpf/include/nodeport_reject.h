/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Refusals for nodeport.c (issue 25): a packet from outside to a frontend
 * that has no backend is answered, as the socket programs answer a local
 * client (ECONNREFUSED) and as the node's own stack answers a closed port,
 * instead of being dropped, which left the client waiting until its own
 * timeout:
 *   - TCP: a reset, from the frontend to the client (RFC 9293 3.10.7.1:
 *     seq from the segment's ACK, or else ACK of everything it carried);
 *     a reset is not answered.
 *   - UDP: ICMP port unreachable from the frontend's address, quoting the
 *     datagram's IPv4 header and first 8 bytes (RFC 792).
 * The packet is rewritten into the answer in place and sent back out of
 * the device it came in by, to the MAC it came from.
 *
 * Checksums are computed from scratch: the answer has nothing of the
 * packet's checksums left to update.
 */
#ifndef CELLIUM_NODEPORT_REJECT_H
#define CELLIUM_NODEPORT_REJECT_H

#include <stdbool.h>
#include <stddef.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/tcp.h>

#define ICMP_PORT_UNREACH 3
#define IPV4_DF 0x4000
#define REJECT_TTL 64

/* The TCP pseudo header and a header without options, summed as one. */
struct reject4_tcp {
	__be32 saddr;
	__be32 daddr;
	__u8 zero;
	__u8 proto;
	__be16 len;
	struct tcphdr tcp;
};

/* The answer's headers after the Ethernet header, for the UDP case. */
struct reject4_icmp {
	struct iphdr ip;
	struct icmp4_error_hdr icmp;
};

/* Room the ICMP answer adds before the quoted packet. */
#define REJECT4_ICMP_ROOM sizeof(struct reject4_icmp)

/* The quote: the IPv4 header, up to 60 bytes with options, and 8 bytes. */
#define REJECT4_QUOTE_MAX (60 + 8)

/* reject4_ip fills an answer's IPv4 header and its checksum. */
static __always_inline void reject4_ip(struct iphdr *ip, __be32 saddr, __be32 daddr, __u8 proto, __u16 len,
				       __be16 frag_off)
{
	ip->version = 4;
	ip->ihl = 5;
	ip->tos = 0;
	ip->tot_len = bpf_htons(len);
	ip->id = 0;
	ip->frag_off = frag_off;
	ip->ttl = REJECT_TTL;
	ip->protocol = proto;
	ip->check = 0;
	ip->saddr = saddr;
	ip->daddr = daddr;
	ip->check = icmp4_csum_apply(0xffff, bpf_csum_diff(NULL, 0, (__be32 *)ip, sizeof(*ip), 0));
}

/* reject4_eth turns the frame's Ethernet header around. */
static __always_inline int reject4_eth(struct __sk_buff *skb, struct ethhdr *eth)
{
	__u8 mac[ETH_ALEN];

	__builtin_memcpy(mac, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, eth->h_source, ETH_ALEN);
	__builtin_memcpy(eth->h_source, mac, ETH_ALEN);
	return bpf_skb_store_bytes(skb, 0, eth, sizeof(*eth), 0);
}

/* reject4_tcp rewrites a TCP segment into the reset that answers it. */
static __always_inline int reject4_tcp(struct __sk_buff *skb, const struct packet4 *p)
{
	struct ethhdr eth;
	struct iphdr ip;
	struct tcphdr in;
	struct reject4_tcp out = {};
	__u32 ihl, doff, payload;

	if (bpf_skb_load_bytes(skb, 0, &eth, sizeof(eth)) || bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)) ||
	    bpf_skb_load_bytes(skb, p->l4_off, &in, sizeof(in)))
		return TC_ACT_SHOT;
	if (in.rst)
		return TC_ACT_SHOT;
	ihl = ip.ihl * 4;
	doff = in.doff * 4;
	if (doff < sizeof(in) || bpf_ntohs(ip.tot_len) < ihl + doff)
		return TC_ACT_SHOT;
	payload = bpf_ntohs(ip.tot_len) - ihl - doff;

	out.saddr = p->daddr;
	out.daddr = p->saddr;
	out.proto = IPPROTO_TCP;
	out.len = bpf_htons(sizeof(out.tcp));
	out.tcp.source = p->dport;
	out.tcp.dest = p->sport;
	out.tcp.doff = sizeof(out.tcp) / 4;
	out.tcp.rst = 1;
	if (in.ack) {
		out.tcp.seq = in.ack_seq;
	} else {
		out.tcp.ack = 1;
		out.tcp.ack_seq = bpf_htonl(bpf_ntohl(in.seq) + payload + in.syn + in.fin);
	}
	out.tcp.check = icmp4_csum_apply(0xffff, bpf_csum_diff(NULL, 0, (__be32 *)&out, sizeof(out), 0));
	reject4_ip(&ip, p->daddr, p->saddr, IPPROTO_TCP, sizeof(ip) + sizeof(out.tcp), bpf_htons(IPV4_DF));

	if (bpf_skb_change_tail(skb, ETH_HLEN + sizeof(ip) + sizeof(out.tcp), 0) || reject4_eth(skb, &eth) ||
	    bpf_skb_store_bytes(skb, ETH_HLEN, &ip, sizeof(ip), 0) ||
	    bpf_skb_store_bytes(skb, ETH_HLEN + sizeof(ip), &out.tcp, sizeof(out.tcp), 0))
		return TC_ACT_SHOT;
	return bpf_redirect(skb->ifindex, 0);
}

/* reject4_udp rewrites a UDP datagram into the ICMP port unreachable that
 * answers it: room for the new headers in front, the datagram cut after
 * the quote. */
static __always_inline int reject4_udp(struct __sk_buff *skb, const struct packet4 *p)
{
	struct ethhdr eth;
	struct reject4_icmp out = {};
	__be32 quote[REJECT4_QUOTE_MAX / 4];
	/* The IPv4 header's length is a multiple of 4 up to 60: the mask
	 * changes nothing but shows the verifier the bound. */
	__u32 len = ((p->l4_off - ETH_HLEN) & 0x3c) + 8;
	__s64 sum;

	if (bpf_skb_load_bytes(skb, 0, &eth, sizeof(eth)) || bpf_skb_load_bytes(skb, ETH_HLEN, quote, len))
		return TC_ACT_SHOT;
	if (bpf_skb_change_head(skb, REJECT4_ICMP_ROOM, 0) ||
	    bpf_skb_change_tail(skb, ETH_HLEN + REJECT4_ICMP_ROOM + len, 0))
		return TC_ACT_SHOT;

	out.icmp.type = ICMP_DEST_UNREACH;
	out.icmp.code = ICMP_PORT_UNREACH;
	sum = bpf_csum_diff(NULL, 0, (__be32 *)&out.icmp, sizeof(out.icmp), 0);
	sum = bpf_csum_diff(NULL, 0, quote, len, sum);
	out.icmp.checksum = icmp4_csum_apply(0xffff, sum);
	reject4_ip(&out.ip, p->daddr, p->saddr, IPPROTO_ICMP, sizeof(out) + len, 0);

	if (reject4_eth(skb, &eth) || bpf_skb_store_bytes(skb, ETH_HLEN, &out, sizeof(out), 0))
		return TC_ACT_SHOT;
	return bpf_redirect(skb->ifindex, 0);
}

/* reject4 answers p, sent to a frontend that cannot take it, with a
 * refusal; returns the program's verdict. */
static __always_inline int reject4(struct __sk_buff *skb, const struct packet4 *p)
{
	if (p->proto == IPPROTO_TCP)
		return reject4_tcp(skb, p);
	return reject4_udp(skb, p);
}

#endif
