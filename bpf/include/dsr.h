/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Direct Server Return (--lb-mode=dsr) for NodePort, ExternalIP and
 * LoadBalancer frontends whose backend is on another node: the node a
 * client's packet arrives at (nodeport.c) keeps the client's address,
 * sends the packet to the backend and tells the backend's node the
 * frontend in an IPv4 option; the backend's node (lxc.c) remembers it per
 * connection and sends the backend's replies to the client itself, from
 * the frontend. docs/loadbalancer.md explains the choices.
 *
 * The option (RFC 4727's experimental type 30 with the copied flag set,
 * so that fragments carry it too; RFC 791 layout):
 *
 *   0        1        2        3        4                          8
 *   +--------+--------+--------+--------+--------+--------+--------+--------+
 *   |  0x9E  |   8    | frontend port   |        frontend IPv4              |
 *   +--------+--------+--------+--------+--------+--------+--------+--------+
 *
 * Port and address in network byte order. It is the packet's only option,
 * right after the 20-byte header: the ingress node adds it only to packets
 * without options of their own, so the backend's node finds it at a fixed
 * place. Linux ignores an option type it does not know on receive, so the
 * option may stay in the packet that reaches the pod.
 */
#ifndef CELLIUM_DSR_H
#define CELLIUM_DSR_H

#include "cellium.h"

#include <stdbool.h>
#include <stddef.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/tcp.h>
#include <linux/udp.h>

#define DSR_OPT_TYPE 0x9e
#define DSR_OPT_LEN 8
/* The IPv4 header with the option, in 32-bit words. */
#define DSR_IHL 7

struct dsr_opt4 {
	__u8 type;
	__u8 len;
	__be16 port;
	__be32 address;
};

/*
 * A DSR connection on the backend's node, from the pod's side: the
 * backend pod's address and port and the client's. The value is the
 * frontend the pod's replies must come from.
 */
struct lb4_dsr_key {
	__be32 pod_addr;
	__be32 client_addr;
	__be16 pod_port;
	__be16 client_port;
	__u8 proto;
	__u8 pad[3];
};

struct lb4_dsr {
	__be32 address;
	__be16 port;
	__u16 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct lb4_dsr_key);
	__type(value, struct lb4_dsr);
	__uint(max_entries, 65536);
} cellium_lb4_dsr SEC(".maps");

/* The Ethernet header, then the IPv4 header. */
#define DSR_IP_OFF ETH_HLEN

/*
 * dsr_can_insert4 says whether the option can go into skb: an IPv4 header
 * without options, and 8 more bytes within the MTU of device ifindex (0:
 * the device it arrived on). The forwarding path asks with the device the
 * route to the backend leaves by, often the tunnel device, whose MTU is
 * smaller than the one the client's packets came in on.
 */
static __always_inline bool dsr_can_insert4(struct __sk_buff *skb, __u32 ifindex)
{
	__u8 ver_ihl;
	__u32 mtu = 0;

	if (bpf_skb_load_bytes(skb, DSR_IP_OFF, &ver_ihl, 1) || (ver_ihl & 0x0f) != 5)
		return false;
	return bpf_check_mtu(skb, ifindex, &mtu, DSR_OPT_LEN, 0) == BPF_MTU_CHK_RET_SUCCESS;
}

/*
 * dsr_insert4 puts the option naming frontend addr:port after the IPv4
 * header of skb, which dsr_can_insert4 accepted, and rewrites the header's
 * length, total length and checksum. The transport checksum does not
 * change: its pseudo header has neither. Returns 0; 1 when the kernel
 * would not make room (a UDP GSO packet, say), the packet unchanged; or -1
 * when the packet is left broken.
 */
static __always_inline int dsr_insert4(struct __sk_buff *skb, __be32 addr, __be16 port)
{
	union {
		struct {
			struct iphdr ip;
			struct dsr_opt4 opt;
		} h;
		__u16 words[14];
	} hdr;
	__u32 sum = 0;
	int i;

	if (bpf_skb_load_bytes(skb, DSR_IP_OFF, &hdr.h.ip, sizeof(hdr.h.ip)) ||
	    bpf_skb_adjust_room(skb, DSR_OPT_LEN, BPF_ADJ_ROOM_NET, 0))
		return 1;
	hdr.h.ip.ihl = DSR_IHL;
	hdr.h.ip.tot_len = bpf_htons(bpf_ntohs(hdr.h.ip.tot_len) + DSR_OPT_LEN);
	hdr.h.ip.check = 0;
	hdr.h.opt.type = DSR_OPT_TYPE;
	hdr.h.opt.len = DSR_OPT_LEN;
	hdr.h.opt.port = port;
	hdr.h.opt.address = addr;
#pragma unroll
	for (i = 0; i < 14; i++)
		sum += hdr.words[i];
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	hdr.h.ip.check = (__sum16)~sum;
	return bpf_skb_store_bytes(skb, DSR_IP_OFF, &hdr, sizeof(hdr.h), 0) ? -1 : 0;
}

/*
 * dsr_record4 remembers, on the backend's node, the frontend that a packet
 * going into a pod carries in the option: proto, src and dst are the
 * packet's (the client's and the pod's). A packet without the option
 * changes nothing, as only some of a connection's packets may carry it,
 * unless it is a TCP SYN (syn): that opens a connection of the same tuple
 * that came some other way (the first packet of a DSR connection always
 * carries the option), whose replies must not be rewritten.
 */
static __always_inline void dsr_record4(struct __sk_buff *skb, __u8 proto, __be32 src, __be32 dst,
					__be16 sport, __be16 dport, bool syn)
{
	struct dsr_opt4 opt;
	struct lb4_dsr_key key = {
		.pod_addr = dst,
		.client_addr = src,
		.pod_port = dport,
		.client_port = sport,
		.proto = proto,
	};
	struct lb4_dsr val = {};
	const struct lb4_dsr *old;
	__u8 ver_ihl;

	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return;
	if (bpf_skb_load_bytes(skb, DSR_IP_OFF, &ver_ihl, 1) || (ver_ihl & 0x0f) < DSR_IHL ||
	    bpf_skb_load_bytes(skb, DSR_IP_OFF + sizeof(struct iphdr), &opt, sizeof(opt)) ||
	    opt.type != DSR_OPT_TYPE || opt.len != DSR_OPT_LEN) {
		if (syn)
			bpf_map_delete_elem(&cellium_lb4_dsr, &key);
		return;
	}
	val.address = opt.address;
	val.port = opt.port;
	old = bpf_map_lookup_elem(&cellium_lb4_dsr, &key);
	/* Every packet carries the option: write only on change, which keeps
	 * the entry's cache line shared between CPUs. */
	if (old && old->address == val.address && old->port == val.port)
		return;
	bpf_map_update_elem(&cellium_lb4_dsr, &key, &val, BPF_ANY);
}

/*
 * dsr_reply4 sends a pod's reply to a DSR connection from the frontend:
 * it rewrites the source address and port of the packet from the pod
 * (proto, src -> dst) and fixes the IP and transport checksums. Returns 0,
 * also when the packet is no such reply, or a negative errno.
 */
static __always_inline int dsr_reply4(struct __sk_buff *skb, __u8 proto, __be32 src, __be32 dst, __be16 sport,
				      __be16 dport)
{
	struct lb4_dsr_key key = {
		.pod_addr = src,
		.client_addr = dst,
		.pod_port = sport,
		.client_port = dport,
		.proto = proto,
	};
	const struct lb4_dsr *fe;
	__u32 l4_off, csum_off;
	__u64 csum_flags = 0;
	__be32 addr;
	__be16 port;
	__u8 ver_ihl;

	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return 0;
	fe = bpf_map_lookup_elem(&cellium_lb4_dsr, &key);
	if (!fe)
		return 0;
	addr = fe->address;
	port = fe->port;
	if (bpf_skb_load_bytes(skb, DSR_IP_OFF, &ver_ihl, 1))
		return -1;
	l4_off = DSR_IP_OFF + (ver_ihl & 0x0f) * 4;
	if (proto == IPPROTO_TCP) {
		csum_off = l4_off + offsetof(struct tcphdr, check);
	} else {
		csum_off = l4_off + offsetof(struct udphdr, check);
		csum_flags = BPF_F_MARK_MANGLED_0;
	}
	if (bpf_l4_csum_replace(skb, csum_off, src, addr, csum_flags | BPF_F_PSEUDO_HDR | sizeof(addr)) ||
	    bpf_l3_csum_replace(skb, DSR_IP_OFF + offsetof(struct iphdr, check), src, addr, sizeof(addr)) ||
	    bpf_skb_store_bytes(skb, DSR_IP_OFF + offsetof(struct iphdr, saddr), &addr, sizeof(addr), 0))
		return -1;
	if (bpf_l4_csum_replace(skb, csum_off, sport, port, csum_flags | sizeof(port)) ||
	    bpf_skb_store_bytes(skb, l4_off, &port, sizeof(port), 0))
		return -1;
	return 0;
}

#endif /* CELLIUM_DSR_H */
