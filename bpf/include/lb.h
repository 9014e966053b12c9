/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The load-balancing maps: their keys, values and flags.
 *
 * These layouts are a contract with the agent, which declares the maps
 * (cells/lbmaps), fills them (the lb-maps reconciler) and mirrors every
 * struct in Go (pkg/lbmap, whose test compares each Go type with the BTF of
 * these structs). Change a struct here and there together.
 *
 * Addresses and ports are in network byte order, as struct bpf_sock_addr
 * carries them, so the programs copy them without swapping. IPv6 structs
 * hold the address as four 32-bit words because that is how bpf_sock_addr
 * exposes user_ip6, and are padded to a multiple of 8 bytes.
 *
 * The max_entries below only shape the declaration: the agent sizes the
 * maps from its flags and the loader takes the sizes of the maps it hands
 * to the programs.
 *
 * Only the agent writes the hash maps, so they allocate entries as it
 * inserts them (BPF_F_NO_PREALLOC) instead of reserving their whole size
 * up front; the programs write the LRU maps, which must be preallocated.
 */
#ifndef CELLIUM_LB_H
#define CELLIUM_LB_H

#include "cellium.h"

/* Flags of a service's master entry (slot 0), struct lb4_service.flags. */
/* Keep a client on one backend: backend_id of the master entry is the timeout. */
#define SVC_F_AFFINITY (1 << 0)
/* Pick the backend from the service's Maglev table instead of a random slot. */
#define SVC_F_MAGLEV (1 << 1)
/* A NodePort at the wildcard address (0.0.0.0, ::): it also answers on loopback. */
#define SVC_F_NODEPORT_WILDCARD (1 << 2)
/* Traffic policy Local: the backends are this node's only. A NodePort with
 * none drops (as kube-proxy does) instead of refusing: the node has none
 * but the service may have, and a load balancer learns it from the health
 * check node port, not from its clients' connections refused. */
#define SVC_F_LOCAL (1 << 3)

/*
 * A service frontend and one of its slots. Slot 0 is the master entry,
 * slots 1..count name the backends. Scope 0 is the only scope the socket
 * programs look up; other values are left to datapaths that tell traffic
 * policies apart.
 */
struct lb4_key {
	__be32 address;
	__be16 dport;
	__u16 backend_slot;
	__u8 proto; /* IPPROTO_TCP, IPPROTO_UDP */
	__u8 scope;
	__u8 pad[2];
};

struct lb4_service {
	/* Slot > 0: the backend's ID. Slot 0: the affinity timeout in seconds, 0 = none. */
	__u32 backend_id;
	/* Slot 0: how many backend slots follow. */
	__u16 count;
	/* The frontend's ID: the key of the reverse NAT, affinity and Maglev maps. */
	__u16 rev_nat_index;
	/* Slot 0: SVC_F_*. */
	__u8 flags;
	__u8 pad[3];
};

struct lb4_backend {
	__be32 address;
	__be16 port;
	__u8 proto;
	/* Reserved for the backend's state; the socket programs ignore it. */
	__u8 flags;
};

/* The frontend of a rev_nat_index: what a client sees as its peer. */
struct lb4_reverse_nat {
	__be32 address;
	__be16 port;
	__u16 pad;
};

struct lb6_key {
	__be32 address[4];
	__be16 dport;
	__u16 backend_slot;
	__u8 proto;
	__u8 scope;
	__u8 pad[2];
};

struct lb6_service {
	__u32 backend_id;
	__u16 count;
	__u16 rev_nat_index;
	__u8 flags;
	__u8 pad[3];
};

struct lb6_backend {
	__be32 address[4];
	__be16 port;
	__u8 proto;
	__u8 flags;
	__u8 pad[4];
};

struct lb6_reverse_nat {
	__be32 address[4];
	__be16 port;
	__u8 pad[6];
};

/*
 * Session affinity. At socket level the client is a network namespace (a
 * pod, or the host), so its identity is the namespace's cookie. One map
 * serves both families: rev_nat_index values come from one space.
 */
struct lb_affinity_key {
	__u64 netns_cookie;
	__u16 rev_nat_index;
	__u8 pad[6];
};

struct lb_affinity_val {
	__u32 backend_id;
	/* Seconds of CLOCK_BOOTTIME (bpf_ktime_get_boot_ns), refreshed on each use. */
	__u32 last_used;
};

/*
 * Socket reverse NAT: which frontend a socket meant when it was sent to a
 * backend, so that recvmsg and getpeername can show the frontend again.
 * Keyed by the socket's cookie, which the kernel never reuses, so an entry
 * left by a closed socket is only dead weight for the LRU to evict.
 */
struct lb4_sock_revnat_key {
	__u64 cookie;
	__be32 address; /* backend */
	__be16 port;
	__u16 pad;
};

struct lb4_sock_revnat {
	__be32 address; /* frontend, as the client gave it */
	__be16 port;
	__u16 rev_nat_index;
};

struct lb6_sock_revnat_key {
	__u64 cookie;
	__be32 address[4];
	__be16 port;
	__u8 pad[6];
};

struct lb6_sock_revnat {
	__be32 address[4];
	__be16 port;
	__u16 rev_nat_index;
	__u8 pad[4];
};

/*
 * A Maglev table: backend IDs indexed by hash % maglev_table_size. The
 * outer map holds one single-entry array per rev_nat_index. The size here
 * is the default; the agent creates the inner arrays with the table size
 * of its flag and sets maglev_table_size to match.
 */
#define LB_MAGLEV_TABLE_SIZE_DEFAULT 16381

struct lb_maglev_inner {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32[LB_MAGLEV_TABLE_SIZE_DEFAULT]);
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct lb4_key);
	__type(value, struct lb4_service);
	__uint(max_entries, 65536);
} cellium_lb4_services SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct lb4_backend);
	__uint(max_entries, 65536);
} cellium_lb4_backends SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u16);
	__type(value, struct lb4_reverse_nat);
	__uint(max_entries, 65536);
} cellium_lb4_revnat SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH_OF_MAPS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u16);
	__uint(max_entries, 65536);
	__array(values, struct lb_maglev_inner);
} cellium_lb4_maglev SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct lb4_sock_revnat_key);
	__type(value, struct lb4_sock_revnat);
	__uint(max_entries, 262144);
} cellium_lb4_sock_revnat SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct lb6_key);
	__type(value, struct lb6_service);
	__uint(max_entries, 65536);
} cellium_lb6_services SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct lb6_backend);
	__uint(max_entries, 65536);
} cellium_lb6_backends SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u16);
	__type(value, struct lb6_reverse_nat);
	__uint(max_entries, 65536);
} cellium_lb6_revnat SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH_OF_MAPS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u16);
	__uint(max_entries, 65536);
	__array(values, struct lb_maglev_inner);
} cellium_lb6_maglev SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct lb6_sock_revnat_key);
	__type(value, struct lb6_sock_revnat);
	__uint(max_entries, 262144);
} cellium_lb6_sock_revnat SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct lb_affinity_key);
	__type(value, struct lb_affinity_val);
	__uint(max_entries, 65536);
} cellium_lb_affinity SEC(".maps");

#endif /* CELLIUM_LB_H */
