// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)

// Not Go's to build: bpf2go compiles it (see gen.go).
//go:build ignore

/*
 * count_l3 counts packets per L3 protocol class and passes every packet.
 * It is the smallest program that shows how the datapath is built: the
 * map is declared here for the verifier, but the agent creates and pins it
 * (cells/bpfmaps) and hands it to the program at load time.
 */
#include "cellium.h"

/* The key of l3_counts. */
enum l3_class {
	L3_CLASS_IPV4,
	L3_CLASS_IPV6,
	L3_CLASS_OTHER,
	L3_CLASS_MAX,
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, enum l3_class);
	__type(value, __u64);
	__uint(max_entries, L3_CLASS_MAX);
} l3_counts SEC(".maps");

SEC("tc")
int count_l3(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	enum l3_class class = L3_CLASS_OTHER;
	__u64 *count;

	if ((void *)(eth + 1) <= data_end) {
		switch (eth->h_proto) {
		case bpf_htons(ETH_P_IP):
			class = L3_CLASS_IPV4;
			break;
		case bpf_htons(ETH_P_IPV6):
			class = L3_CLASS_IPV6;
			break;
		}
	}

	count = bpf_map_lookup_elem(&l3_counts, &class);
	if (count)
		*count += 1; /* per-CPU: no other CPU writes this slot */

	return TC_ACT_OK;
}

char __license[] SEC("license") = "Dual BSD/GPL";
