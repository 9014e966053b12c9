// Package lbmaps is the lb-maps cell: the BPF maps of socket-level load
// balancing, declared with their sizes from the agent's flags, for the
// programs of bpf/sock_lb.c.
//
// The contract:
//
//   - [Maps] holds every map, typed with the layouts of pkg/lbmap: per
//     family the services, backends, reverse NAT, Maglev and socket reverse
//     NAT maps, and the affinity map both families share. The maps are
//     pinned under the bpf-maps cell's directory and keep their entries
//     across restarts (see cells/bpfmaps); a cell that takes *Maps may use
//     them from its start hooks on.
//   - The flags size the maps; a size that changes between runs replaces
//     that map with an empty one. --lb-maglev-table-size is also the length
//     of every Maglev table ([MaglevMap.TableSize]), and the loader tells
//     the programs about it. --lb-algorithm is for whoever fills the maps:
//     with "maglev", services get SVC_F_MAGLEV and a table.
//   - [Maps.EBPF] names each map as bpf/sock_lb.c does, which is what
//     ebpf.CollectionOptions.MapReplacements needs.
//
// Filling a service by hand, as the datapath tests do:
//
//	fe := netip.MustParseAddr("10.96.0.10")
//	maps.Backends4.Put(1, lbmap.NewBackend4(netip.MustParseAddr("10.244.1.5"), 8080, lbmap.TCP))
//	maps.Services4.Put(lbmap.NewService4Key(fe, 80, lbmap.TCP, 1), lbmap.NewServiceSlot(1, 1))
//	maps.Services4.Put(lbmap.NewService4Key(fe, 80, lbmap.TCP, 0), lbmap.NewServiceMaster(1, 1, 0, 0))
//	maps.RevNAT4.Put(1, lbmap.NewRevNAT4(fe, 80))
package lbmaps
