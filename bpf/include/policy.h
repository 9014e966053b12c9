/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Network policy: which new connections an endpoint may accept (ingress) and
 * open (egress). The policy-maps cell writes both maps (cells/policymaps,
 * from the tables of cells/policy; the Go types of pkg/policymap mirror
 * these structs and the datapath's tests compare them with this BTF). The
 * programs only read them.
 *
 * cellium_policy_enforcement says, per endpoint, in which directions the
 * endpoint is isolated; a direction not isolated allows everything and
 * costs one hash lookup per new connection. In an isolated direction a new
 * connection passes only if cellium_policy holds an allow for it.
 *
 * cellium_policy is one longest-prefix-match trie shared by every endpoint
 * of the node, keyed by what an allow matches, in this order: the
 * endpoint, the direction, the peer's identity (0: any peer), the protocol
 * (with the identity's prefix: any protocol) and the destination port (a
 * port range is written as the prefix-aligned blocks that cover it). A
 * lookup sets every bit (POLICY_PREFIX_FULL) and tries the peer's identity,
 * then identity 0. The measurements that chose this layout are in
 * docs/datapath.md.
 *
 * cellium_policy_prefix holds the address prefixes of the policies'
 * ipBlocks (their cidr and except prefixes), each with an ID of a range
 * no identity uses. Between the peer's identity and identity 0, a lookup
 * tries the ID of the longest prefix that holds the peer's address: an
 * ipBlock selects the IDs of the prefixes inside its cidr and outside its
 * excepts, so the longest match decides the except clauses. It matches
 * any address, a pod's as well (docs/cells/policy.md).
 */
#ifndef CELLIUM_POLICY_H
#define CELLIUM_POLICY_H

#include "cellium.h"
#include "events.h"
#include "ipcache.h"

#include <stdbool.h>

/* The reserved identity of the endpoint's own node (pkg/identity.Host). */
#define IDENTITY_HOST 1

/* struct policy_key.prefixlen: the bits up to and with the identity: any
 * protocol. */
#define POLICY_PREFIX_IDENTITY 64
/* Up to and with the protocol: every port; a port prefix of n bits adds n. */
#define POLICY_PREFIX_PROTO 80
#define POLICY_PREFIX_FULL 96

struct policy_key {
	__u32 prefixlen;
	/* The fields the trie matches are big endian, so that a prefix of
	 * bits is a prefix of the value. */
	__be16 endpoint_id;
	/* TRAFFIC_INGRESS or TRAFFIC_EGRESS. */
	__u8 direction;
	__u8 pad;
	__be32 identity;
	__u8 pad2;
	__u8 proto;
	/* The destination port: the endpoint's on ingress, the peer's on
	 * egress. */
	__be16 dport;
};

struct policy_value {
	/* The prefixlen of the entry's key. The datapath tells from it what
	 * kind of entry matched; the agent, which looks keys up to write only
	 * what is missing, tells an entry of exactly its key from a shorter
	 * one that covers it. */
	__u32 prefixlen;
	/* Names the policies that allow the entry (a hash of their names;
	 * the agent's table policy-entries resolves it): the policy-verdict
	 * event carries it, for Hubble's allowed_by. */
	__u32 cookie;
};

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct policy_key);
	__type(value, struct policy_value);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} cellium_policy SEC(".maps");

/* Keyed as the ipcache is; the agent writes the distinct prefixes of the
 * node's policies (pkg/policymap.PrefixMaxEntries). */
struct policy_prefix_value {
	__u32 id;
};

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct ipcache_key);
	__type(value, struct policy_prefix_value);
	__uint(max_entries, 1 << 14);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} cellium_policy_prefix SEC(".maps");

/* struct policy_enforcement.flags: the endpoint is isolated in ... */
#define POLICY_F_INGRESS 0x01
#define POLICY_F_EGRESS 0x02

struct policy_enforcement {
	__u8 flags;
	__u8 pad[3];
};

/* Keyed by endpoint ID (a __u32 holding the __u16), large enough for every
 * ID, so that it can never be full. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct policy_enforcement);
	__uint(max_entries, 65536);
} cellium_policy_enforcement SEC(".maps");

/* policy_check's answer when the endpoint is not isolated in the direction:
 * allowed without a policy decision. */
#define POLICY_NOT_ENFORCED 0

/* policy_enforced says whether endpoint_id is isolated in direction. */
static __always_inline bool policy_enforced(__u16 endpoint_id, __u8 direction)
{
	__u32 id = endpoint_id;
	const struct policy_enforcement *enf;

	if (!endpoint_id)
		return false;
	enf = bpf_map_lookup_elem(&cellium_policy_enforcement, &id);
	if (!enf)
		return false;
	return enf->flags & (direction == TRAFFIC_INGRESS ? POLICY_F_INGRESS : POLICY_F_EGRESS);
}

/* policy_prefix_id is the ID of the longest ipBlock prefix that holds the
 * address (family EVENT_FAMILY_IPV4: addr's first 4 bytes), 0 for none. */
static __always_inline __u32 policy_prefix_id(__u8 family, const __u8 addr[16])
{
	struct ipcache_key key = {
		.prefixlen = IPCACHE_PREFIX_HDR_BITS + (family == IPCACHE_FAMILY_IPV4 ? 32 : 128),
		.family = family,
	};
	const struct policy_prefix_value *v;

	__builtin_memcpy(key.addr, addr, 16);
	v = bpf_map_lookup_elem(&cellium_policy_prefix, &key);
	return v ? v->id : 0;
}

/*
 * policy_check decides a new connection of endpoint_id in direction with the
 * peer of identity peer at peer_addr (family EVENT_FAMILY_*; NONE: not
 * read): POLICY_NOT_ENFORCED, a POLICY_MATCH_* that allows it (with the
 * entry's cookie in *cookie, 0 for the host's), or -DROP_POLICY_DENIED.
 */
static __always_inline int policy_check(__u16 endpoint_id, __u8 direction, __u32 peer, __u8 family,
					const __u8 peer_addr[16], __u8 proto, __be16 dport, __u32 *cookie)
{
	struct policy_key key = {
		.prefixlen = POLICY_PREFIX_FULL,
		.endpoint_id = bpf_htons(endpoint_id),
		.direction = direction,
		.identity = bpf_htonl(peer),
		.proto = proto,
		.dport = dport,
	};
	const struct policy_value *v;

	if (!policy_enforced(endpoint_id, direction))
		return POLICY_NOT_ENFORCED;
	if (direction == TRAFFIC_INGRESS && peer == IDENTITY_HOST)
		return POLICY_MATCH_HOST;
	if (peer) {
		v = bpf_map_lookup_elem(&cellium_policy, &key);
		if (v) {
			*cookie = v->cookie;
			return v->prefixlen >= POLICY_PREFIX_PROTO ? POLICY_MATCH_L3_L4 : POLICY_MATCH_L3_ONLY;
		}
	}
	if (family != EVENT_FAMILY_NONE) {
		__u32 prefix = policy_prefix_id(family, peer_addr);

		if (prefix) {
			key.identity = bpf_htonl(prefix);
			v = bpf_map_lookup_elem(&cellium_policy, &key);
			if (v) {
				*cookie = v->cookie;
				return v->prefixlen >= POLICY_PREFIX_PROTO ? POLICY_MATCH_L3_L4 : POLICY_MATCH_L3_ONLY;
			}
		}
	}
	key.identity = 0;
	v = bpf_map_lookup_elem(&cellium_policy, &key);
	if (v) {
		*cookie = v->cookie;
		return v->prefixlen >= POLICY_PREFIX_PROTO ? POLICY_MATCH_L4_ONLY : POLICY_MATCH_ALL;
	}
	return -DROP_POLICY_DENIED;
}

#endif /* CELLIUM_POLICY_H */
