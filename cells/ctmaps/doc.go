// Package ctmaps is the ct-maps cell: it declares the datapath's conntrack
// maps and its event ring buffer, owns their flags, and provides them to
// the cells that load programs (loader), collect garbage (ct-gc) and read
// events (monitor).
//
// The contract:
//
//   - Four LRU hash maps, pinned through the bpf-maps registry and kept
//     across restarts: cellium_ct4_tcp and cellium_ct6_tcp for TCP,
//     cellium_ct4_any and cellium_ct6_any for everything else (UDP, ICMP
//     echo, other protocols), sized by --conntrack-tcp-max and
//     --conntrack-any-max. Keys and values are pkg/ctmap's. They are
//     provided as *Maps.
//   - The programs' lifetimes of an entry per state, --conntrack-lifetime-*,
//     are read-only constants of the loaded programs: Config carries them,
//     and [Config.ProgramConstants] is what the loader sets.
//   - One ring buffer, cellium_events (--monitor-ringbuf-size bytes, a
//     power of two of at least a page; by default 512 KiB per CPU, from
//     1 MiB to 64 MiB), that every program writes its
//     events into (pkg/monitorapi), and cellium_events_lost, a per-CPU
//     array of one counter of the events that did not fit. Provided as
//     *Events. The ring buffer is pinned so that programs attached while
//     the agent is down keep writing into the one the next agent reads.
//   - --monitor-aggregation (on by default) makes the TC programs report a
//     tracked connection's packet only when it opens the connection,
//     changes its state, or is the first of its direction in a second of
//     boot time; off, they report every packet.
//   - A flag with an invalid value fails the start with an error naming it
//     and what is valid; nothing is declared.
//
// Changing a map's size (or the ring buffer's) changes its layout: the next
// start replaces the pinned map by an empty one, which loses the tracked
// connections, as bpf-maps documents.
//
//	func newThing(maps *ctmaps.Maps, events *ctmaps.Events) *thing { ... }
//	// In a start hook or job:
//	e, err := maps.TCP4.Lookup(key)
//	rd, err := ringbuf.NewReader(events.Ring.EBPF())
package ctmaps
