/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The ipcache: which security identity an address belongs to, and for an
 * address behind another node, that node's address (the tunnel endpoint).
 * One longest-prefix-match trie holds both families. The ipcache cell
 * writes it (cells/ipcache, from its table; the Go types of pkg/ipcachemap
 * mirror these structs and the datapath's tests compare them with this
 * BTF). The programs only read it.
 */
#ifndef CELLIUM_IPCACHE_H
#define CELLIUM_IPCACHE_H

#include "cellium.h"

/* struct ipcache_key.family, struct ipcache_value.tunnel_family */
#define IPCACHE_FAMILY_IPV4 4
#define IPCACHE_FAMILY_IPV6 6

/* The bits of struct ipcache_key before addr: family and pad. */
#define IPCACHE_PREFIX_HDR_BITS 32

struct ipcache_key {
	/* What the trie matches: IPCACHE_PREFIX_HDR_BITS plus the prefix's
	 * length; a lookup sets IPCACHE_PREFIX_HDR_BITS + 32 or + 128. */
	__u32 prefixlen;
	__u8 family;
	__u8 pad[3];
	/* An IPv4 address in the first 4 bytes, the rest 0. */
	__u8 addr[16];
};

/* struct ipcache_value.flags */
/* The prefix is a local endpoint's address. */
#define IPCACHE_F_LOCAL_ENDPOINT 0x01

struct ipcache_value {
	__u32 identity;
	/* The node behind which the prefix is; tunnel_family 0: none. */
	__u8 tunnel_endpoint[16];
	__u8 tunnel_family;
	__u8 flags;
	__u8 pad[2];
};

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct ipcache_key);
	__type(value, struct ipcache_value);
	__uint(max_entries, 1 << 19);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} cellium_ipcache SEC(".maps");

/*
 * ipcache_lookup is the entry of the longest prefix that holds the address
 * (family IPCACHE_FAMILY_IPV4: addr's first 4 bytes), or NULL.
 */
static __always_inline struct ipcache_value *
ipcache_lookup(__u8 family, const __u8 addr[16])
{
	struct ipcache_key key = {
		.prefixlen = IPCACHE_PREFIX_HDR_BITS + (family == IPCACHE_FAMILY_IPV4 ? 32 : 128),
		.family = family,
	};
	__builtin_memcpy(key.addr, addr, 16);
	return bpf_map_lookup_elem(&cellium_ipcache, &key);
}

#endif /* CELLIUM_IPCACHE_H */
