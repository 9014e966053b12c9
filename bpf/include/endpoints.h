/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The endpoint map: every address of every ready local endpoint, with the
 * endpoint's ID, the ifindex of its host-side veth and the MACs of both
 * ends. The endpoint-maps cell writes it (cells/endpointmaps, whose Go
 * types EndpointKey and EndpointInfo mirror these structs; the datapath's
 * tests compare them with this BTF). The programs only read it.
 */
#ifndef CELLIUM_ENDPOINTS_H
#define CELLIUM_ENDPOINTS_H

#include "cellium.h"

/* struct endpoint_key.family */
#define ENDPOINT_FAMILY_IPV4 4
#define ENDPOINT_FAMILY_IPV6 6

struct endpoint_key {
	/* An IPv4 address in the first 4 bytes, the rest 0. */
	__u8 addr[16];
	__u8 family;
	__u8 pad[3];
};

struct endpoint_info {
	__u32 ifindex;
	__u16 endpoint_id;
	__u8 pad[2];
	__u8 mac[6];
	__u8 host_mac[6];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct endpoint_key);
	__type(value, struct endpoint_info);
	__uint(max_entries, 1 << 17);
} cellium_endpoints SEC(".maps");

#endif /* CELLIUM_ENDPOINTS_H */
