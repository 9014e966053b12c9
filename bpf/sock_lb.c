// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)

// Not Go's to build: bpf2go compiles it (see gen.go).
//go:build ignore

/*
 * Socket-level load balancing: cgroup sock_addr programs that send a
 * socket bound for a service frontend to one of its backends, by rewriting
 * the address of connect() and of unconnected sendmsg() before the kernel
 * routes anything. No packet is ever translated: the socket itself talks
 * to the backend, so replies need no reverse NAT on the wire. What the
 * application sees is kept consistent instead: getpeername() and the
 * source address of received datagrams show the frontend again.
 *
 *   connect4/6      TCP and UDP connect(): translate, remember for reverse
 *   sendmsg4/6      unconnected UDP sendto(): the same, per datagram
 *   recvmsg4/6      UDP recvfrom(): a reply from a backend appears to come
 *                   from the frontend the socket sent to
 *   getpeername4/6  the peer of a connected socket is the frontend
 *
 * The maps are in lb.h. A destination that is no service is left alone,
 * whatever the maps hold about anything else.
 *
 * Every translation, either way, is reported as an EVENT_SOCK_LB record in
 * the event ring buffer (events.h).
 */
#include "cellium.h"
#include "events.h"
#include "lb.h"
#include "lb_select.h"

#include <stdbool.h>
#include <linux/in.h>
#include <linux/errno.h>

/* Return values of cgroup sock_addr programs. */
#define SYS_REJECT 0
#define SYS_PROCEED 1

/* Results of a translation; errors are negative errnos. */
#define LB_UNTOUCHED 0
#define LB_TRANSLATED 1

#define NSEC_PER_SEC 1000000000ULL

/*
 * Fails the system call with err: returning SYS_REJECT alone would make it
 * EPERM, which tells an application the wrong thing about a service with
 * no backends.
 */
static __always_inline int refuse(int err)
{
	bpf_set_retval(err);
	return SYS_REJECT;
}

static __always_inline __u32 now_seconds(void)
{
	return bpf_ktime_get_boot_ns() / NSEC_PER_SEC;
}

/*
 * Spreads socket cookies, which are consecutive, over 32 bits (Fibonacci
 * hashing), so that consecutive sockets land on unrelated Maglev slots.
 */
static __always_inline __u32 hash_cookie(__u64 cookie)
{
	return (cookie * 0x9e3779b97f4a7c15ULL) >> 32;
}

/*
 * The backend this client used last for the service, if it is younger than
 * timeout seconds and still exists, or 0.
 */
static __always_inline __u32 affinity_lookup(const struct lb_affinity_key *key, __u32 timeout,
					     void *backends)
{
	const struct lb_affinity_val *val;
	__u32 backend_id;

	val = bpf_map_lookup_elem(&cellium_lb_affinity, key);
	if (!val)
		return 0;
	/* Unsigned: a last_used in the future (a clock reset) counts as expired. */
	if (now_seconds() - val->last_used >= timeout)
		return 0;
	backend_id = val->backend_id;
	if (!bpf_map_lookup_elem(backends, &backend_id))
		return 0;
	return backend_id;
}

/* Records, or refreshes, the client's backend for the service. */
static __always_inline void affinity_record(const struct lb_affinity_key *key, __u32 backend_id)
{
	struct lb_affinity_val val = {
		.backend_id = backend_id,
		.last_used = now_seconds(),
	};

	bpf_map_update_elem(&cellium_lb_affinity, key, &val, BPF_ANY);
}

/*
 * lb4_translate replaces the frontend *addr:*port with a backend of the
 * service and records the pair for the reverse direction. It returns
 * LB_TRANSLATED, with the service's *rev_nat_index, LB_UNTOUCHED when the
 * destination is no service, or a negative errno when it is a service that
 * cannot take the connection: one without backends, or one whose backend
 * is missing from the maps, which is refused rather than let through to
 * the frontend address.
 */
static __always_inline int lb4_translate(struct bpf_sock_addr *ctx, __be32 *addr, __be16 *port,
					 __u16 *rev_nat_index)
{
	struct lb4_key key = {
		.address = *addr,
		.dport = *port,
		.proto = ctx->protocol,
	};
	struct lb_affinity_key affinity = {};
	struct lb4_sock_revnat_key rkey = {};
	struct lb4_sock_revnat rval = {};
	const struct lb4_service *svc;
	const struct lb4_backend *backend;
	__u32 backend_id = 0;
	__u64 cookie;

	if (!is_lb_proto(key.proto))
		return LB_UNTOUCHED;
	svc = lb4_lookup_service(&key);
	if (!svc)
		return LB_UNTOUCHED;
	if (svc->count == 0)
		return -ECONNREFUSED;

	cookie = bpf_get_socket_cookie(ctx);
	if (svc->flags & SVC_F_AFFINITY) {
		affinity.netns_cookie = bpf_get_netns_cookie(ctx);
		affinity.rev_nat_index = svc->rev_nat_index;
		backend_id = affinity_lookup(&affinity, svc->backend_id, &cellium_lb4_backends);
	}
	/* Without a Maglev table (not written yet), a random slot still works. */
	if (!backend_id && (svc->flags & SVC_F_MAGLEV))
		backend_id = maglev_select(&cellium_lb4_maglev, svc->rev_nat_index, hash_cookie(cookie));
	if (!backend_id)
		backend_id = lb4_select_slot(&key, svc->count);
	backend = bpf_map_lookup_elem(&cellium_lb4_backends, &backend_id);
	if (!backend)
		return -ECONNREFUSED;
	if (svc->flags & SVC_F_AFFINITY)
		affinity_record(&affinity, backend_id);

	rkey.cookie = cookie;
	rkey.address = backend->address;
	rkey.port = backend->port;
	rval.address = *addr;
	rval.port = *port;
	rval.rev_nat_index = svc->rev_nat_index;
	bpf_map_update_elem(&cellium_lb4_sock_revnat, &rkey, &rval, BPF_ANY);

	*rev_nat_index = svc->rev_nat_index;
	*addr = backend->address;
	*port = backend->port;
	return LB_TRANSLATED;
}

/*
 * lb4_reverse replaces the backend *addr:*port with the frontend this
 * socket was translated from, if it was and the frontend still exists
 * under the same index. A wildcard NodePort matches the loopback address
 * the client used. Returns whether it replaced anything; when it did,
 * *rev_nat_index is the frontend's.
 */
static __always_inline bool lb4_reverse(struct bpf_sock_addr *ctx, __be32 *addr, __be16 *port,
					__u16 *rev_nat_index)
{
	struct lb4_sock_revnat_key key = {
		.cookie = bpf_get_socket_cookie(ctx),
		.address = *addr,
		.port = *port,
	};
	const struct lb4_sock_revnat *val;
	const struct lb4_reverse_nat *frontend;

	val = bpf_map_lookup_elem(&cellium_lb4_sock_revnat, &key);
	if (!val)
		return false;
	*rev_nat_index = val->rev_nat_index;
	frontend = bpf_map_lookup_elem(&cellium_lb4_revnat, rev_nat_index);
	if (!frontend || frontend->port != val->port ||
	    (frontend->address && frontend->address != val->address))
		return false;
	*addr = val->address;
	*port = val->port;
	return true;
}

static __always_inline bool ipv6_is_v4mapped(const __be32 *addr)
{
	return addr[0] == 0 && addr[1] == 0 && addr[2] == bpf_htonl(0xffff);
}

static __always_inline void ipv6_copy(__be32 *dst, const __be32 *src)
{
	dst[0] = src[0];
	dst[1] = src[1];
	dst[2] = src[2];
	dst[3] = src[3];
}

/* See lb4_translate. */
static __always_inline int lb6_translate(struct bpf_sock_addr *ctx, __be32 *addr, __be16 *port,
					 __u16 *rev_nat_index)
{
	struct lb6_key key = {
		.dport = *port,
		.proto = ctx->protocol,
	};
	struct lb_affinity_key affinity = {};
	struct lb6_sock_revnat_key rkey = {};
	struct lb6_sock_revnat rval = {};
	const struct lb6_service *svc;
	const struct lb6_backend *backend;
	__u32 backend_id = 0;
	__u64 cookie;

	if (!is_lb_proto(key.proto))
		return LB_UNTOUCHED;
	ipv6_copy(key.address, addr);
	svc = lb6_lookup_service(&key);
	if (!svc)
		return LB_UNTOUCHED;
	if (svc->count == 0)
		return -ECONNREFUSED;

	cookie = bpf_get_socket_cookie(ctx);
	if (svc->flags & SVC_F_AFFINITY) {
		affinity.netns_cookie = bpf_get_netns_cookie(ctx);
		affinity.rev_nat_index = svc->rev_nat_index;
		backend_id = affinity_lookup(&affinity, svc->backend_id, &cellium_lb6_backends);
	}
	if (!backend_id && (svc->flags & SVC_F_MAGLEV))
		backend_id = maglev_select(&cellium_lb6_maglev, svc->rev_nat_index, hash_cookie(cookie));
	if (!backend_id)
		backend_id = lb6_select_slot(&key, svc->count);
	backend = bpf_map_lookup_elem(&cellium_lb6_backends, &backend_id);
	if (!backend)
		return -ECONNREFUSED;
	if (svc->flags & SVC_F_AFFINITY)
		affinity_record(&affinity, backend_id);

	rkey.cookie = cookie;
	ipv6_copy(rkey.address, backend->address);
	rkey.port = backend->port;
	ipv6_copy(rval.address, addr);
	rval.port = *port;
	rval.rev_nat_index = svc->rev_nat_index;
	bpf_map_update_elem(&cellium_lb6_sock_revnat, &rkey, &rval, BPF_ANY);

	*rev_nat_index = svc->rev_nat_index;
	ipv6_copy(addr, backend->address);
	*port = backend->port;
	return LB_TRANSLATED;
}

/* See lb4_reverse. */
static __always_inline bool lb6_reverse(struct bpf_sock_addr *ctx, __be32 *addr, __be16 *port,
					__u16 *rev_nat_index)
{
	struct lb6_sock_revnat_key key = {
		.cookie = bpf_get_socket_cookie(ctx),
		.port = *port,
	};
	const struct lb6_sock_revnat *val;
	const struct lb6_reverse_nat *frontend;

	ipv6_copy(key.address, addr);
	val = bpf_map_lookup_elem(&cellium_lb6_sock_revnat, &key);
	if (!val)
		return false;
	*rev_nat_index = val->rev_nat_index;
	frontend = bpf_map_lookup_elem(&cellium_lb6_revnat, rev_nat_index);
	if (!frontend || frontend->port != val->port)
		return false;
	if ((frontend->address[0] | frontend->address[1] | frontend->address[2] | frontend->address[3]) &&
	    (frontend->address[0] != val->address[0] || frontend->address[1] != val->address[1] ||
	     frontend->address[2] != val->address[2] || frontend->address[3] != val->address[3]))
		return false;
	ipv6_copy(addr, val->address);
	*port = val->port;
	return true;
}

/*
 * Reports a translation of the socket's address from orig to xlated, of
 * family EVENT_FAMILY_IPV4 (addresses of 4 bytes) or EVENT_FAMILY_IPV6.
 */
static __always_inline void report_translation(struct bpf_sock_addr *ctx, __u8 hook, __u8 family,
					       __u16 rev_nat_index, const void *orig, __be16 orig_port,
					       const void *xlated, __be16 xlated_port)
{
	struct sock_lb_record rec = {};

	event_hdr_init(&rec.hdr, EVENT_SOCK_LB, hook, 0, 0);
	rec.lb.family = family;
	rec.lb.proto = ctx->protocol;
	rec.lb.rev_nat_index = rev_nat_index;
	rec.lb.sock_cookie = bpf_get_socket_cookie(ctx);
	rec.lb.netns_cookie = bpf_get_netns_cookie(ctx);
	if (family == EVENT_FAMILY_IPV4) {
		__builtin_memcpy(rec.lb.orig_addr, orig, 4);
		__builtin_memcpy(rec.lb.xlated_addr, xlated, 4);
	} else {
		__builtin_memcpy(rec.lb.orig_addr, orig, 16);
		__builtin_memcpy(rec.lb.xlated_addr, xlated, 16);
	}
	rec.lb.orig_port = orig_port;
	rec.lb.xlated_port = xlated_port;
	event_output_sock_lb(&rec);
}

/* connect() and sendmsg() of IPv4 sockets; hook says which. */
static __always_inline int sock4_forward(struct bpf_sock_addr *ctx, __u8 hook)
{
	__be32 frontend = ctx->user_ip4, addr = frontend;
	__be16 frontend_port = ctx->user_port, port = frontend_port;
	__u16 rev_nat_index;
	int ret;

	ret = lb4_translate(ctx, &addr, &port, &rev_nat_index);
	if (ret < 0)
		return refuse(ret);
	if (ret == LB_TRANSLATED) {
		ctx->user_ip4 = addr;
		ctx->user_port = port;
		report_translation(ctx, hook, EVENT_FAMILY_IPV4, rev_nat_index, &frontend, frontend_port, &addr,
				   port);
	}
	return SYS_PROCEED;
}

/* recvmsg() and getpeername() of IPv4 sockets; hook says which. */
static __always_inline int sock4_reverse(struct bpf_sock_addr *ctx, __u8 hook)
{
	__be32 backend = ctx->user_ip4, addr = backend;
	__be16 backend_port = ctx->user_port, port = backend_port;
	__u16 rev_nat_index;

	if (lb4_reverse(ctx, &addr, &port, &rev_nat_index)) {
		ctx->user_ip4 = addr;
		ctx->user_port = port;
		report_translation(ctx, hook, EVENT_FAMILY_IPV4, rev_nat_index, &backend, backend_port, &addr,
				   port);
	}
	return SYS_PROCEED;
}

static __always_inline void sock6_read(struct bpf_sock_addr *ctx, __be32 *addr, __be16 *port)
{
	addr[0] = ctx->user_ip6[0];
	addr[1] = ctx->user_ip6[1];
	addr[2] = ctx->user_ip6[2];
	addr[3] = ctx->user_ip6[3];
	*port = ctx->user_port;
}

static __always_inline void sock6_write(struct bpf_sock_addr *ctx, const __be32 *addr, __be16 port)
{
	ctx->user_ip6[0] = addr[0];
	ctx->user_ip6[1] = addr[1];
	ctx->user_ip6[2] = addr[2];
	ctx->user_ip6[3] = addr[3];
	ctx->user_port = port;
}

/*
 * Reports a translation of an IPv6 socket's address. An IPv4-mapped one was
 * translated in the IPv4 maps and is reported as IPv4, as the service is.
 */
static __always_inline void report_translation6(struct bpf_sock_addr *ctx, __u8 hook, bool v4mapped,
						__u16 rev_nat_index, const __be32 *orig, __be16 orig_port,
						const __be32 *xlated, __be16 xlated_port)
{
	if (v4mapped)
		report_translation(ctx, hook, EVENT_FAMILY_IPV4, rev_nat_index, &orig[3], orig_port, &xlated[3],
				   xlated_port);
	else
		report_translation(ctx, hook, EVENT_FAMILY_IPV6, rev_nat_index, orig, orig_port, xlated,
				   xlated_port);
}

/*
 * connect() and sendmsg() of IPv6 sockets. A dual-stack socket reaches an
 * IPv4 service at its IPv4-mapped address (::ffff:a.b.c.d): that is
 * translated with the IPv4 maps and stays mapped, so the socket connects to
 * the IPv4 backend the same way.
 */
static __always_inline int sock6_forward(struct bpf_sock_addr *ctx, __u8 hook)
{
	__be32 frontend[4], addr[4];
	__be16 frontend_port, port;
	__u16 rev_nat_index;
	bool v4mapped;
	int ret;

	sock6_read(ctx, frontend, &frontend_port);
	ipv6_copy(addr, frontend);
	port = frontend_port;
	v4mapped = ipv6_is_v4mapped(addr);
	if (v4mapped)
		ret = lb4_translate(ctx, &addr[3], &port, &rev_nat_index);
	else
		ret = lb6_translate(ctx, addr, &port, &rev_nat_index);
	if (ret < 0)
		return refuse(ret);
	if (ret == LB_TRANSLATED) {
		sock6_write(ctx, addr, port);
		report_translation6(ctx, hook, v4mapped, rev_nat_index, frontend, frontend_port, addr, port);
	}
	return SYS_PROCEED;
}

/* recvmsg() and getpeername() of IPv6 sockets, IPv4-mapped included. */
static __always_inline int sock6_reverse(struct bpf_sock_addr *ctx, __u8 hook)
{
	__be32 backend[4], addr[4];
	__be16 backend_port, port;
	__u16 rev_nat_index;
	bool v4mapped, reversed;

	sock6_read(ctx, backend, &backend_port);
	ipv6_copy(addr, backend);
	port = backend_port;
	v4mapped = ipv6_is_v4mapped(addr);
	if (v4mapped)
		reversed = lb4_reverse(ctx, &addr[3], &port, &rev_nat_index);
	else
		reversed = lb6_reverse(ctx, addr, &port, &rev_nat_index);
	if (reversed) {
		sock6_write(ctx, addr, port);
		report_translation6(ctx, hook, v4mapped, rev_nat_index, backend, backend_port, addr, port);
	}
	return SYS_PROCEED;
}

SEC("cgroup/connect4")
int lb4_connect(struct bpf_sock_addr *ctx)
{
	return sock4_forward(ctx, SOCK_LB_HOOK_CONNECT);
}

SEC("cgroup/sendmsg4")
int lb4_sendmsg(struct bpf_sock_addr *ctx)
{
	return sock4_forward(ctx, SOCK_LB_HOOK_SENDMSG);
}

SEC("cgroup/recvmsg4")
int lb4_recvmsg(struct bpf_sock_addr *ctx)
{
	return sock4_reverse(ctx, SOCK_LB_HOOK_RECVMSG);
}

SEC("cgroup/getpeername4")
int lb4_getpeername(struct bpf_sock_addr *ctx)
{
	return sock4_reverse(ctx, SOCK_LB_HOOK_GETPEERNAME);
}

SEC("cgroup/connect6")
int lb6_connect(struct bpf_sock_addr *ctx)
{
	return sock6_forward(ctx, SOCK_LB_HOOK_CONNECT);
}

SEC("cgroup/sendmsg6")
int lb6_sendmsg(struct bpf_sock_addr *ctx)
{
	return sock6_forward(ctx, SOCK_LB_HOOK_SENDMSG);
}

SEC("cgroup/recvmsg6")
int lb6_recvmsg(struct bpf_sock_addr *ctx)
{
	return sock6_reverse(ctx, SOCK_LB_HOOK_RECVMSG);
}

SEC("cgroup/getpeername6")
int lb6_getpeername(struct bpf_sock_addr *ctx)
{
	return sock6_reverse(ctx, SOCK_LB_HOOK_GETPEERNAME);
}

char __license[] SEC("license") = "Dual BSD/GPL";
