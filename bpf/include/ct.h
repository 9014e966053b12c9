/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Connection tracking: the maps, their keys and entry, and the flags.
 *
 * These layouts are a contract with the agent, which declares the maps
 * (cells/ctmaps), collects their garbage (cells/ctgc) and mirrors every
 * struct in Go (pkg/ctmap; TestLXCLayoutsMatchBTF in bpf/lxc_test.go
 * compares the Go types with the BTF of these structs). Change a struct
 * here and there together.
 *
 * A key is the tuple of a connection's ORIGINAL direction, as the
 * initiator sent its first packet; a reply is looked up with the tuple
 * reversed. Addresses and ports are in network byte order. ICMP echo keys
 * carry the identifier as src_port and 0 as dst_port.
 *
 * Times are seconds of CLOCK_BOOTTIME (bpf_ktime_get_boot_ns() / 1e9),
 * which keeps counting while the machine sleeps and which the agent reads
 * with clock_gettime(CLOCK_BOOTTIME): an entry has expired when its
 * lifetime is in the past. Tx counts the original direction, rx the reply.
 *
 * The maps are LRU hashes because the programs insert: a full map evicts
 * its least recently used entries instead of refusing a connection. Their
 * max_entries only shape the declaration; the agent sizes them.
 */
#ifndef CELLIUM_CT_H
#define CELLIUM_CT_H

#include "cellium.h"

/* struct ct4_key.flags, ct6_key.flags. Bit 0 is reserved. */
/* The to-endpoint program's entry: the connection came into the endpoint. */
#define CT_KEY_F_INCOMING (1 << 1)

/* struct ct_entry.flags. */
#define CTF_SYN_SEEN (1 << 0)
#define CTF_ESTABLISHED (1 << 1)
#define CTF_TX_CLOSING (1 << 2)
#define CTF_RX_CLOSING (1 << 3)
#define CTF_RST_SEEN (1 << 4)
#define CTF_SEEN_REPLY (1 << 5)

struct ct4_key {
	__be32 src_addr;
	__be32 dst_addr;
	__be16 src_port;
	__be16 dst_port;
	__u8 proto;
	__u8 flags;
	__u8 pad[2];
};

struct ct6_key {
	__be32 src_addr[4];
	__be32 dst_addr[4];
	__be16 src_port;
	__be16 dst_port;
	__u8 proto;
	__u8 flags;
	__u8 pad[2];
};

struct ct_entry {
	/* Expiry, seconds of CLOCK_BOOTTIME. */
	__u32 lifetime;
	__u16 flags;
	/* The local endpoint the connection belongs to; 0 for none. */
	__u16 endpoint_id;
	__u64 packets_tx;
	__u64 bytes_tx;
	__u64 packets_rx;
	__u64 bytes_rx;
	/* The last packet of each direction, seconds of CLOCK_BOOTTIME. */
	__u32 last_tx;
	__u32 last_rx;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ct4_key);
	__type(value, struct ct_entry);
	__uint(max_entries, 524288);
} cellium_ct4_tcp SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ct4_key);
	__type(value, struct ct_entry);
	__uint(max_entries, 262144);
} cellium_ct4_any SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ct6_key);
	__type(value, struct ct_entry);
	__uint(max_entries, 524288);
} cellium_ct6_tcp SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ct6_key);
	__type(value, struct ct_entry);
	__uint(max_entries, 262144);
} cellium_ct6_any SEC(".maps");

#endif /* CELLIUM_CT_H */
