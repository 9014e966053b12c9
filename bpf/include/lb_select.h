/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Finding a service and choosing its backend in the maps of lb.h: the one
 * lookup that every load-balancing program shares, the socket programs
 * (sock_lb.c) and the NodePort programs on the node's devices
 * (nodeport.c), so that a frontend means the same thing to both.
 *
 * A program that includes this gets the read-only constant
 * maglev_table_size, which the loader sets.
 */
#ifndef CELLIUM_LB_SELECT_H
#define CELLIUM_LB_SELECT_H

#include "cellium.h"
#include "lb.h"

#include <stdbool.h>
#include <linux/in.h>

/*
 * The number of slots of the agent's Maglev tables (--lb-maglev-table-size),
 * set by the loader. A read-only constant, so the verifier knows its value
 * and the bound check against it proves table accesses safe.
 */
volatile const __u32 maglev_table_size = LB_MAGLEV_TABLE_SIZE_DEFAULT;

/*
 * flow_hash4 is the hash a connection arriving on a device takes its
 * Maglev slot from: of the client's packet's addresses, ports and
 * protocol, with a fixed seed, so that every node picks the same backend
 * for the same connection. (The kernel's skb hash has a seed drawn at
 * boot: each node would pick differently.) It is MurmurHash3's 32-bit
 * block mixing and finalizer over four words, the addresses and ports in
 * host order; pkg/maglev.FlowHash4 is the same in Go.
 */
#define FLOW_HASH_SEED 0x63656c6cU /* "cell" */

static __always_inline __u32 flow_hash_mix(__u32 h, __u32 k)
{
	k *= 0xcc9e2d51U;
	k = (k << 15) | (k >> 17);
	k *= 0x1b873593U;
	h ^= k;
	h = (h << 13) | (h >> 19);
	return h * 5 + 0xe6546b64U;
}

static __always_inline __u32 flow_hash4(__be32 saddr, __be32 daddr, __be16 sport, __be16 dport, __u8 proto)
{
	__u32 h = FLOW_HASH_SEED;

	h = flow_hash_mix(h, bpf_ntohl(saddr));
	h = flow_hash_mix(h, bpf_ntohl(daddr));
	h = flow_hash_mix(h, (__u32)bpf_ntohs(sport) << 16 | bpf_ntohs(dport));
	h = flow_hash_mix(h, proto);
	h ^= 16; /* the length in bytes */
	h ^= h >> 16;
	h *= 0x85ebca6bU;
	h ^= h >> 13;
	h *= 0xc2b2ae35U;
	h ^= h >> 16;
	return h;
}

/*
 * The backend of the service's Maglev table for a connection whose hash
 * is hash (spread over 32 bits), or 0.
 */
static __always_inline __u32 maglev_select(void *maglev, __u16 rev_nat_index, __u32 hash)
{
	const __u32 *table;
	__u32 zero = 0;
	void *inner;
	__u64 idx;

	inner = bpf_map_lookup_elem(maglev, &rev_nat_index);
	if (!inner)
		return 0;
	table = bpf_map_lookup_elem(inner, &zero);
	if (!table)
		return 0;
	idx = hash % maglev_table_size;
	/*
	 * The check below is always false; it tells the verifier that idx is
	 * inside the table. The verifier keeps no bounds across a modulo, and
	 * the barrier stops clang from narrowing the check to the 32 bits it
	 * knows idx fits in, which would leave the upper half unbounded.
	 */
	barrier_var(idx);
	if (idx >= maglev_table_size)
		return 0;
	return table[idx];
}

static __always_inline bool is_lb_proto(__u8 proto)
{
	return proto == IPPROTO_TCP || proto == IPPROTO_UDP;
}

static __always_inline bool ipv4_is_loopback(__be32 addr)
{
	return (addr & bpf_htonl(0xff000000)) == bpf_htonl(0x7f000000);
}

/*
 * The master entry for key (slot 0). A NodePort is reachable on every
 * address of the node, loopback included, so a miss on a loopback address
 * falls back to a wildcard NodePort on the same port; key then holds the
 * wildcard address, under which that service's slots are.
 */
static __always_inline const struct lb4_service *lb4_lookup_service(struct lb4_key *key)
{
	const struct lb4_service *svc;

	svc = bpf_map_lookup_elem(&cellium_lb4_services, key);
	if (svc || !ipv4_is_loopback(key->address))
		return svc;
	key->address = 0;
	svc = bpf_map_lookup_elem(&cellium_lb4_services, key);
	if (svc && (svc->flags & SVC_F_NODEPORT_WILDCARD))
		return svc;
	return NULL;
}

/* The backend of a random slot of the service whose master key is key, or 0. */
static __always_inline __u32 lb4_select_slot(struct lb4_key *key, __u16 count)
{
	const struct lb4_service *slot;

	key->backend_slot = bpf_get_prandom_u32() % count + 1;
	slot = bpf_map_lookup_elem(&cellium_lb4_services, key);
	return slot ? slot->backend_id : 0;
}

static __always_inline bool ipv6_is_loopback(const __be32 *addr)
{
	return addr[0] == 0 && addr[1] == 0 && addr[2] == 0 && addr[3] == bpf_htonl(1);
}

/* See lb4_lookup_service. */
static __always_inline const struct lb6_service *lb6_lookup_service(struct lb6_key *key)
{
	const struct lb6_service *svc;

	svc = bpf_map_lookup_elem(&cellium_lb6_services, key);
	if (svc || !ipv6_is_loopback(key->address))
		return svc;
	key->address[3] = 0;
	svc = bpf_map_lookup_elem(&cellium_lb6_services, key);
	if (svc && (svc->flags & SVC_F_NODEPORT_WILDCARD))
		return svc;
	return NULL;
}

static __always_inline __u32 lb6_select_slot(struct lb6_key *key, __u16 count)
{
	const struct lb6_service *slot;

	key->backend_slot = bpf_get_prandom_u32() % count + 1;
	slot = bpf_map_lookup_elem(&cellium_lb6_services, key);
	return slot ? slot->backend_id : 0;
}

#endif /* CELLIUM_LB_SELECT_H */
