// Package bpfmaps owns the agent's BPF maps: the BPF filesystem they are
// pinned on, their pins, and the registry that lists them.
//
// The contract:
//
//   - At start the cell makes sure a BPF filesystem is mounted at --bpf-root
//     (mounting one if not) and creates <bpf-root>/<bpf-map-prefix>/, where
//     every map of the agent is pinned.
//   - A cell declares each map it owns with [NewMap] from its constructor.
//     Declaring does no I/O; names are unique across the agent. The map is
//     opened by a start hook appended to the declaring cell's lifecycle: it
//     runs after the registry's hook, and before any hook the declaring
//     cell appends after NewMap, which may therefore use the map.
//   - Opening reuses a pin with the same layout, keeping its entries across
//     agent restarts; it replaces a pin with another layout by an empty map
//     (logged as a warning: a layout change loses the map's entries); and
//     creates the map if there is no pin. [Map.Origin] says which happened.
//   - Stopping closes the map but keeps its pin: programs attached to
//     interfaces keep using their maps, and traffic keeps flowing, while the
//     agent is down.
//   - A map of maps ([NewMapOfMaps]) holds unpinned inner maps of one
//     layout, Spec.InnerMap, which opening a pin checks too.
//   - [Cleaner] removes everything the agent pinned, for `agent cleanup`:
//     what cells contribute as [Cleanup]s (links under [Registry.PinDir]),
//     the maps, then the pin directory.
//   - GET /v1/maps lists every declared map with its layout, origin and
//     current number of entries (`agent map list`); GET /v1/maps/{name}
//     shows one.
//
// A map's key and value are Go types whose layout is the C one: fixed-size
// fields, explicit padding. Programs get the agent's maps through
// ebpf.CollectionOptions.MapReplacements, so the agent, not the loader,
// decides which map (and which pin) a program uses:
//
//	type backendKey struct{ ID uint32 }
//	type backend struct {
//		Addr [16]byte
//		Port uint16
//		_    [2]byte
//	}
//
//	func newBackendMap(lc cell.Lifecycle, reg *bpfmaps.Registry) (*bpfmaps.Map[backendKey, backend], error) {
//		return bpfmaps.NewMap[backendKey, backend](lc, reg, bpfmaps.Spec{
//			Name: "cellium_backends", Type: ebpf.Hash, MaxEntries: 65536,
//		})
//	}
//
//	// Later, from a start hook or a job:
//	backends.Put(backendKey{ID: 1}, backend{Port: 8080})
//	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{
//		MapReplacements: map[string]*ebpf.Map{"cellium_backends": backends.EBPF()},
//	})
package bpfmaps
