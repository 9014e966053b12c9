/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Datapath events: the records the programs write into the ring buffer
 * cellium_events, and the counter of records that did not fit.
 *
 * The records are a contract with the agent, which reads them (cells/monitor)
 * and decodes them with pkg/monitorapi; that package's tests compare these
 * structs, from the BTF of the compiled programs, with its decoder. Change a
 * struct here and there together; append fields rather than move them, since
 * the decoder accepts records longer than it knows.
 *
 * Every record is a struct event_hdr followed by a body that depends on the
 * type: a flow summary for EVENT_TRACE, EVENT_DROP and EVENT_POLICY_VERDICT,
 * a socket translation for EVENT_SOCK_LB. Multi-byte fields are in the machine's order, except
 * ports and addresses, which stay in network byte order as the packet or the
 * socket carries them. No struct has implicit padding: the records are
 * copied to user space byte for byte, and the verifier wants every byte of
 * a stack buffer written before a helper reads it.
 */
#ifndef CELLIUM_EVENTS_H
#define CELLIUM_EVENTS_H

#include "cellium.h"

/* struct event_hdr.type */
#define EVENT_TRACE 1
#define EVENT_DROP 2
#define EVENT_SOCK_LB 3
#define EVENT_POLICY_VERDICT 4

/* struct event_hdr.subtype of EVENT_TRACE: where the packet was seen. */
/* From an endpoint to another endpoint of this node. */
#define TRACE_FROM_ENDPOINT 1
/* Into an endpoint. */
#define TRACE_TO_ENDPOINT 2
/* From an endpoint to anything that is no local endpoint, through the host's stack. */
#define TRACE_TO_STACK 3

/* struct event_hdr.subtype of EVENT_DROP: why the packet was dropped. */
/* Truncated or inconsistent headers. */
#define DROP_INVALID_PACKET 1
/* An EtherType other than IPv4, IPv6 and ARP. */
#define DROP_UNSUPPORTED_L3 2
/* The conntrack map refused the connection's new entry. */
#define DROP_CT_CREATE_FAILED 3
/* The endpoint is isolated in the direction and no policy entry allows the
 * packet's new connection (struct flow_summary.direction says which). */
#define DROP_POLICY_DENIED 4
/* The from-endpoint program: the source address is not an address of the
 * endpoint whose interface the packet came in on (a forged source, or an
 * interface of no endpoint). */
#define DROP_INVALID_SOURCE 5

/* struct event_hdr.subtype of EVENT_POLICY_VERDICT: which kind of policy
 * entry allowed a new connection in an isolated direction. */
/* The peer's identity, and the protocol and port. */
#define POLICY_MATCH_L3_L4 1
/* The peer's identity, any protocol. */
#define POLICY_MATCH_L3_ONLY 2
/* Any peer, the protocol and port. */
#define POLICY_MATCH_L4_ONLY 3
/* Any peer, any protocol. */
#define POLICY_MATCH_ALL 4
/* Ingress from the endpoint's own node (identity host), always allowed. */
#define POLICY_MATCH_HOST 5

/* struct flow_summary.direction: the policy direction of the endpoint
 * the program runs for; 0 on events that no policy decision made. */
#define TRAFFIC_INGRESS 1
#define TRAFFIC_EGRESS 2

/* struct event_hdr.subtype of EVENT_SOCK_LB: the socket operation. */
#define SOCK_LB_HOOK_CONNECT 1
#define SOCK_LB_HOOK_SENDMSG 2
#define SOCK_LB_HOOK_RECVMSG 3
#define SOCK_LB_HOOK_GETPEERNAME 4

/* struct flow_summary.ct_state: what conntrack made of the packet. */
/* Not tracked, or dropped before the lookup. */
#define CT_UNKNOWN 0
/* Opened a connection. */
#define CT_NEW 1
/* The original direction of a known connection. */
#define CT_ESTABLISHED 2
/* The reply direction of a known connection. */
#define CT_REPLY 3
/* An ICMP error about a known connection, checked only where policy
 * applies. */
#define CT_RELATED 4

/* struct flow_summary.family, struct sock_lb_summary.family. */
#define EVENT_FAMILY_NONE 0 /* addresses not read */
#define EVENT_FAMILY_IPV4 4 /* addresses in the first 4 bytes, the rest 0 */
#define EVENT_FAMILY_IPV6 6

struct event_hdr {
	__u8 type;
	__u8 subtype;
	/* The endpoint the program runs for; 0 when it could not tell. */
	__u16 endpoint_id;
	/* The interface the program runs on; 0 for socket programs. */
	__u32 ifindex;
	/* bpf_ktime_get_boot_ns(). */
	__u64 ktime;
};

/* A packet, as trace and drop events report it. */
struct flow_summary {
	__u8 family;
	__u8 proto;
	/* The flags byte of the TCP header. */
	__u8 tcp_flags;
	__u8 ct_state;
	__u8 icmp_type;
	__u8 icmp_code;
	/* The ports of the conntrack tuple: an ICMP echo identifier is the
	 * source port of a request and the destination port of a reply. */
	__be16 sport;
	__be16 dport;
	__u8 pad[2];
	/* The packet's length, Ethernet header included. */
	__u32 len;
	__u8 src[16];
	__u8 dst[16];
	/* The security identities of the source and the destination, from
	 * the ipcache's longest prefix match; 0 where it has none. */
	__u32 src_identity;
	__u32 dst_identity;
	/* TRAFFIC_*: set on policy drops and policy verdicts. */
	__u8 direction;
	__u8 pad2[3];
	/* The allowing entry's cookie (struct policy_value), on policy
	 * verdicts. */
	__u32 policy_cookie;
};

/*
 * A socket translation. connect and sendmsg: orig is the frontend the
 * application asked for, xlated the backend. recvmsg and getpeername: orig
 * is the backend the kernel knows, xlated the frontend the application is
 * shown. The addresses are bytes so that the ports between them keep the
 * offsets of the format without padding.
 */
struct sock_lb_summary {
	__u8 family;
	__u8 proto;
	__u16 rev_nat_index;
	__u8 pad[4];
	__u64 sock_cookie;
	__u64 netns_cookie;
	__u8 orig_addr[16];
	__be16 orig_port;
	__u8 xlated_addr[16];
	__be16 xlated_port;
	__u8 pad2[4];
};

struct flow_record {
	struct event_hdr hdr;
	struct flow_summary flow;
};

struct sock_lb_record {
	struct event_hdr hdr;
	struct sock_lb_summary lb;
};

/*
 * The ring buffer. Its size here only shapes the declaration: the agent
 * creates it with the size of --monitor-ringbuf-size.
 */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4 << 20);
} cellium_events SEC(".maps");

/* Records that did not fit in the ring buffer, per CPU, at index 0. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 1);
} cellium_events_lost SEC(".maps");

static __always_inline void event_hdr_init(struct event_hdr *hdr, __u8 type, __u8 subtype, __u16 endpoint_id,
					   __u32 ifindex)
{
	hdr->type = type;
	hdr->subtype = subtype;
	hdr->endpoint_id = endpoint_id;
	hdr->ifindex = ifindex;
	hdr->ktime = bpf_ktime_get_boot_ns();
}

/*
 * Outputs a record, or counts it as lost when the ring buffer is full: a
 * reader that falls behind loses records, it never slows the datapath. The
 * counter is per CPU, so a plain increment is enough.
 */
static __always_inline void event_output(const void *rec, __u64 size)
{
	__u32 zero = 0;
	__u64 *lost;

	if (!bpf_ringbuf_output(&cellium_events, (void *)rec, size, 0))
		return;
	lost = bpf_map_lookup_elem(&cellium_events_lost, &zero);
	if (lost)
		*lost += 1;
}

/*
 * The typed outputs are functions of their own (BPF-to-BPF calls) rather than
 * inlined: every call site shares one copy of the code, and their signatures
 * put the record structs into the object's BTF, where the agent's tests find
 * them. A file that does not use one of them does not emit it.
 */
static __noinline __attribute__((unused)) void event_output_flow(const struct flow_record *rec)
{
	event_output(rec, sizeof(*rec));
}

static __noinline __attribute__((unused)) void event_output_sock_lb(const struct sock_lb_record *rec)
{
	event_output(rec, sizeof(*rec));
}

#endif /* CELLIUM_EVENTS_H */
