/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Lifetimes of the NodePort programs' NAT entries (nodeport.c's
 * cellium_nodeport4_nat), which the agent's conntrack garbage collector
 * (cells/ctgc) deletes once expired, and which snat_port4 may take over
 * for a new connection before that.
 *
 * Include it after the NAT map's declaration: its helpers use the map and
 * the key and value structs.
 *
 * The clock and the lifetimes are the conntrack maps' (ct.h, lxc.c): a
 * lifetime is the expiry in seconds of CLOCK_BOOTTIME, and the constants
 * below come from the same --conntrack-lifetime-* flags. The two entries of
 * a connection carry the same lifetime and state: a packet of either
 * direction refreshes both. The entry is written only when its lifetime or
 * state changes, that is at most once a second per connection plus one
 * write per TCP state change, so a busy connection's entries stay shared
 * between the CPUs' caches.
 */
#ifndef CELLIUM_NODEPORT_NAT_H
#define CELLIUM_NODEPORT_NAT_H

#include "cellium.h"

#include <stdbool.h>
#include <linux/in.h>
#include <linux/tcp.h>

/*
 * Set by the loader from the agent's flags (ctmaps.Config.ProgramConstants),
 * in seconds; read-only, so the verifier sees constants.
 */
/* A TCP connection until a reply passed. */
volatile const __u32 ct_lifetime_syn = 60;
/* An established TCP connection after its last packet. */
volatile const __u32 ct_lifetime_tcp = 21600;
/* A TCP connection once both sides sent a FIN, or one sent a RST. */
volatile const __u32 ct_lifetime_close = 10;
/* UDP after its last packet. */
volatile const __u32 ct_lifetime_nontcp = 60;

/*
 * struct nodeport4_nat.state: what passed of a connection. REPLY: the
 * backend answered, seen in its reply or, for TCP, implied by the client's
 * ACK of the handshake (a connection whose replies do not pass this node
 * is established too).
 */
#define NODEPORT_NAT_S_REPLY (1 << 0)
#define NODEPORT_NAT_S_IN_FIN (1 << 1)
#define NODEPORT_NAT_S_OUT_FIN (1 << 2)
#define NODEPORT_NAT_S_RST (1 << 3)
#define NODEPORT_NAT_S_CLOSING (NODEPORT_NAT_S_IN_FIN | NODEPORT_NAT_S_OUT_FIN | NODEPORT_NAT_S_RST)

/* The flags byte of the TCP header. */
#define NAT_TCP_FIN 0x01
#define NAT_TCP_SYN 0x02
#define NAT_TCP_RST 0x04
#define NAT_TCP_ACK 0x10

#define NAT_NSEC_PER_SEC 1000000000ULL

static __always_inline __u32 nat_now(void)
{
	return bpf_ktime_get_boot_ns() / NAT_NSEC_PER_SEC;
}

/*
 * nat_tcp_flags is the flags byte of the TCP header at l4_off; 0 for
 * another protocol.
 */
static __always_inline __u8 nat_tcp_flags(struct __sk_buff *skb, __u8 proto, __u32 l4_off)
{
	__u8 flags = 0;

	if (proto == IPPROTO_TCP)
		bpf_skb_load_bytes(skb, l4_off + 13, &flags, 1);
	return flags;
}

/*
 * nat_state_bits are the state bits a packet with TCP flags tcp adds, from
 * the client (reply false) or the backend.
 */
static __always_inline __u32 nat_state_bits(__u8 proto, __u8 tcp, bool reply)
{
	__u32 bits = reply ? NODEPORT_NAT_S_REPLY : 0;

	if (proto != IPPROTO_TCP)
		return bits;
	if ((tcp & (NAT_TCP_SYN | NAT_TCP_ACK)) == NAT_TCP_ACK)
		bits |= NODEPORT_NAT_S_REPLY;
	if (tcp & NAT_TCP_FIN)
		bits |= reply ? NODEPORT_NAT_S_OUT_FIN : NODEPORT_NAT_S_IN_FIN;
	if (tcp & NAT_TCP_RST)
		bits |= NODEPORT_NAT_S_RST;
	return bits;
}

/*
 * nat_restarts says whether the packet opens a new connection on the tuple
 * of one in state: a SYN from the client on a connection that was closing
 * (the client reused its port), which starts over from no state.
 */
static __always_inline bool nat_restarts(__u8 proto, __u32 state, __u8 tcp, bool reply)
{
	return proto == IPPROTO_TCP && !reply && (tcp & (NAT_TCP_SYN | NAT_TCP_ACK)) == NAT_TCP_SYN &&
	       (state & NODEPORT_NAT_S_CLOSING);
}

/* How long an entry in state lives past its last packet, in seconds. */
static __always_inline __u32 nat_lifetime(__u8 proto, __u32 state)
{
	__u32 fins = NODEPORT_NAT_S_IN_FIN | NODEPORT_NAT_S_OUT_FIN;

	if (proto != IPPROTO_TCP)
		return ct_lifetime_nontcp;
	if ((state & NODEPORT_NAT_S_RST) || (state & fins) == fins)
		return ct_lifetime_close;
	if (state & NODEPORT_NAT_S_REPLY)
		return ct_lifetime_tcp;
	return ct_lifetime_syn;
}

/* nat_init sets the lifetime and state of a new connection's entry v. */
static __always_inline void nat_init(struct nodeport4_nat *v, __u8 proto, __u8 tcp, __u32 now)
{
	v->state = nat_state_bits(proto, tcp, false);
	v->lifetime = now + nat_lifetime(proto, v->state);
}

/* nat_expired says whether v outlived its lifetime at now. */
static __always_inline bool nat_expired(const struct nodeport4_nat *v, __u32 now)
{
	return v->lifetime < now;
}

/*
 * nat_pair_key is the key of the other entry of the connection whose entry
 * under key k is v.
 */
static __always_inline void nat_pair_key(const struct nodeport4_nat_key *k, const struct nodeport4_nat *v,
					 struct nodeport4_nat_key *pair)
{
	bool snat = v->flags & NODEPORT_NAT_F_SNAT;

	pair->proto = k->proto;
	if (k->dir == NODEPORT_NAT_IN) {
		/* v is the backend: the reply comes from it, to the client
		 * or to the node's address the packet was sent from. */
		pair->dir = NODEPORT_NAT_OUT;
		pair->src_addr = v->address;
		pair->src_port = v->port;
		pair->dst_addr = snat ? v->snat_address : k->src_addr;
		pair->dst_port = snat ? v->snat_port : k->src_port;
	} else {
		/* v is the frontend the client sent to. */
		pair->dir = NODEPORT_NAT_IN;
		pair->src_addr = snat ? v->snat_address : k->dst_addr;
		pair->src_port = snat ? v->snat_port : k->dst_port;
		pair->dst_addr = v->address;
		pair->dst_port = v->port;
	}
}

/*
 * nat_refresh accounts a packet of the connection whose entry under key k
 * is v, from the client (reply false) or the backend, at now (nat_now()):
 * the new state and lifetime go to v and to the connection's other entry,
 * when they change.
 *
 * The state bits are ORed in atomically: a client's and a backend's FIN
 * that cross on two CPUs must both stay, since no later packet brings them
 * again. The lifetime is a plain store, which two CPUs may order either
 * way; it follows from the state, so the connection's next packet (the
 * ACK of the last FIN) writes the right one.
 */
static __always_inline void nat_refresh(const struct nodeport4_nat_key *k, struct nodeport4_nat *v, __u8 tcp,
					bool reply, __u32 now)
{
	struct nodeport4_nat_key pair_key = {};
	struct nodeport4_nat *pair = NULL;
	__u32 bits = nat_state_bits(k->proto, tcp, reply);
	__u32 state = v->state;
	__u32 lifetime;
	bool restart = nat_restarts(k->proto, state, tcp, reply);

	if (restart || (bits & ~state)) {
		nat_pair_key(k, v, &pair_key);
		pair = bpf_map_lookup_elem(&cellium_nodeport4_nat, &pair_key);
		if (restart) {
			state = bits;
			v->state = state;
			if (pair)
				pair->state = state;
		} else {
			state = __sync_fetch_and_or(&v->state, bits) | bits;
			if (pair)
				__sync_fetch_and_or(&pair->state, bits);
		}
	}
	lifetime = now + nat_lifetime(k->proto, state);
	if (lifetime == v->lifetime)
		return;
	v->lifetime = lifetime;
	if (!pair) {
		nat_pair_key(k, v, &pair_key);
		pair = bpf_map_lookup_elem(&cellium_nodeport4_nat, &pair_key);
	}
	if (pair)
		pair->lifetime = lifetime;
}

/*
 * nat_take_expired claims the reply's key *out, which another connection's
 * entry holds, with *v if that entry has expired (the garbage collector
 * has not got to it yet): its port is free again. Says whether it did.
 *
 * Not atomic: two CPUs that find the same expired entry at once may both
 * take its port, and the replies then go to the later one's client. That
 * needs two new connections to the same backend to draw the same port of
 * 4536 within the same microseconds, while the port's old entry had
 * expired but was not collected yet.
 */
static __always_inline bool nat_take_expired(const struct nodeport4_nat_key *out, const struct nodeport4_nat *v)
{
	const struct nodeport4_nat *old = bpf_map_lookup_elem(&cellium_nodeport4_nat, out);

	if (!old || !nat_expired(old, nat_now()))
		return false;
	bpf_map_delete_elem(&cellium_nodeport4_nat, out);
	return bpf_map_update_elem(&cellium_nodeport4_nat, out, v, BPF_NOEXIST) == 0;
}

#endif /* CELLIUM_NODEPORT_NAT_H */
