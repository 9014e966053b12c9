/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Common includes of the Cellium datapath. Programs include this first.
 *
 * Headers come from the kernel UAPI and libbpf-dev, not from a generated
 * vmlinux.h: the programs only touch UAPI structures (__sk_buff, packet
 * headers), so they need no CO-RE and build the same on every machine.
 */
#ifndef CELLIUM_H
#define CELLIUM_H

#include <linux/types.h>
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/pkt_cls.h>

#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#endif /* CELLIUM_H */
