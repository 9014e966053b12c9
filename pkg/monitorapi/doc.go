// Package monitorapi is the format of the datapath's events: the records
// the BPF programs write into the ring buffer cellium_events
// (bpf/include/events.h), their Go types, and [Decode], which turns one
// into the other.
//
// The contract:
//
//   - Every record starts with a 16-byte header: type, subtype, endpoint
//     ID, ifindex and the time in nanoseconds of CLOCK_BOOTTIME
//     (bpf_ktime_get_boot_ns). The rest depends on the type:
//     EVENT_TRACE, EVENT_DROP and EVENT_POLICY_VERDICT carry a flow
//     summary (64 bytes),
//     EVENT_SOCK_LB a socket translation (64 bytes). [HeaderLen],
//     [FlowSummaryLen] and [SockLBSummaryLen] are the sizes, which the
//     package's tests check against the BTF of the compiled programs.
//   - Multi-byte fields are little endian (the machine's order) except
//     ports and addresses, which are in network byte order as in the
//     packet. Decoded events give ports in host order and addresses as
//     netip.Addr (IPv4 as a 4-byte address).
//   - [Decode] accepts a record longer than it knows (a newer datapath may
//     append fields) and refuses a shorter one, an unknown type, or an
//     unknown address family, with an error that says which.
//   - Times become wall-clock time through a [BootClock]: the boot instant,
//     read once with [SystemBootClock].
//   - [AgentEvent] is not from the datapath: the monitor makes it from the
//     agent's own changes. It has no binary form.
//
// Every event has a Kind, "trace", "drop", "sock-lb", "policy-verdict" or
// "agent", which is
// also what `agent monitor --type` filters on, and JSON tags for
// `agent monitor -o json`.
//
//	boot := monitorapi.SystemBootClock()
//	rec, _ := reader.Read()                  // github.com/cilium/ebpf/ringbuf
//	ev, err := monitorapi.Decode(rec.RawSample, boot)
//	switch ev := ev.(type) {
//	case *monitorapi.TraceEvent:             // ev.Point, ev.Flow.Src, ev.Flow.CTState ...
//	case *monitorapi.DropEvent:              // ev.Reason.String() == "invalid-packet"
//	case *monitorapi.SockLBEvent:            // ev.Original -> ev.Translated
//	case *monitorapi.PolicyVerdictEvent:     // ev.Match, ev.Flow.Direction
//	}
package monitorapi
