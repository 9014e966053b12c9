package bpfmaps

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"slices"
	"sync"

	"github.com/cilium/hive/cell"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/pkg/apiv1"
)

// Registry knows every map the agent owns. Cells declare their maps with
// [NewMap]; the registry checks that names are valid and unique, and lists
// the maps for GET /v1/maps.
type Registry struct {
	log  *slog.Logger
	root string // the bpffs mount point, --bpf-root
	dir  string // where maps are pinned, <root>/<prefix>

	mu      sync.Mutex
	started bool
	maps    map[string]*pinnedMap
}

func newRegistry(cfg Config, lc cell.Lifecycle, log *slog.Logger) (*Registry, error) {
	root, dir, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	r := &Registry{log: log, root: root, dir: dir, maps: map[string]*pinnedMap{}}
	// Cells that declare maps take *Registry, so this hook runs before
	// theirs: the pin directory exists by the time a map is opened.
	lc.Append(cell.Hook{OnStart: r.start})
	return r, nil
}

// PinDir is where the agent pins, <bpf-root>/<bpf-map-prefix>. A cell that
// pins objects other than maps (links) pins them in a subdirectory of its
// own here, created from a start hook (which runs after the registry's when
// the cell's constructor takes the Registry), and removes them through a
// [Cleanup].
func (r *Registry) PinDir() string { return r.dir }

func (r *Registry) start(cell.HookContext) error {
	if err := r.ensureBPFFS(); err != nil {
		return err
	}
	if err := os.Mkdir(r.dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("--bpf-map-prefix: create pin directory %s: %w", r.dir, err)
	}
	if fi, err := os.Stat(r.dir); err != nil {
		return fmt.Errorf("--bpf-map-prefix: %w", err)
	} else if !fi.IsDir() {
		return fmt.Errorf("--bpf-map-prefix: %s exists and is not a directory", r.dir)
	}
	r.mu.Lock()
	r.started = true
	n := len(r.maps)
	r.mu.Unlock()
	r.log.Info("BPF map pin directory ready", "dir", r.dir, "maps", n)
	return nil
}

// ensureBPFFS mounts a BPF filesystem at the root unless one is there.
func (r *Registry) ensureBPFFS() error {
	ok, err := isBPFFS(r.root)
	if ok {
		return nil
	}
	fix := fmt.Sprintf("mount one with `mount -t bpf bpffs %s`, or set --bpf-root to where bpffs is mounted", r.root)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("--bpf-root %s: %w; %s", r.root, err, fix)
	}
	if err := os.MkdirAll(r.root, 0o700); err != nil {
		return fmt.Errorf("--bpf-root %s is not a BPF filesystem and creating it failed: %w; %s", r.root, err, fix)
	}
	if err := unix.Mount("bpffs", r.root, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("--bpf-root %s is not a BPF filesystem and mounting one there failed: %w; %s", r.root, err, fix)
	}
	if ok, err := isBPFFS(r.root); !ok {
		return fmt.Errorf("--bpf-root %s: still not a BPF filesystem after mounting one (%v); %s", r.root, err, fix)
	}
	// Pins live as long as the mount: one that only the agent's mount
	// namespace sees goes away with the agent's container, and with it the
	// maps that keep traffic flowing across restarts.
	r.log.Warn("Mounted a BPF filesystem; in a container, mount it on the host instead so that pinned maps outlive the agent",
		"bpf-root", r.root)
	return nil
}

func isBPFFS(path string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false, &fs.PathError{Op: "statfs", Path: path, Err: err}
	}
	return uint32(st.Type) == unix.BPF_FS_MAGIC, nil
}

// declare registers a map. It does no I/O: the map is opened by its start
// hook.
func (r *Registry) declare(spec Spec, keySize, valueSize uint32) (*pinnedMap, error) {
	if err := spec.validate(); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.started {
		return nil, fmt.Errorf("bpf map %s declared after the bpf-maps cell started: call NewMap from a constructor", spec.Name)
	}
	if _, dup := r.maps[spec.Name]; dup {
		return nil, fmt.Errorf("bpf map %s declared twice: map names are unique in the agent, pick another name", spec.Name)
	}
	p := &pinnedMap{
		log:       r.log,
		dir:       r.dir,
		spec:      spec,
		keySize:   keySize,
		valueSize: valueSize,
	}
	r.maps[spec.Name] = p
	return p, nil
}

// list describes every declared map, sorted by name.
func (r *Registry) list() []apiv1.Map {
	r.mu.Lock()
	maps := make([]*pinnedMap, 0, len(r.maps))
	for _, p := range r.maps {
		maps = append(maps, p)
	}
	r.mu.Unlock()
	slices.SortFunc(maps, func(a, b *pinnedMap) int { return cmp.Compare(a.spec.Name, b.spec.Name) })
	out := make([]apiv1.Map, 0, len(maps))
	for _, p := range maps {
		out = append(out, p.describe())
	}
	return out
}

// lookup describes one map; ok is false when no map has that name.
func (r *Registry) lookup(name string) (m apiv1.Map, ok bool) {
	p, ok := r.pinned(name)
	if !ok {
		return apiv1.Map{}, false
	}
	return p.describe(), true
}

// pinned is the declared map called name.
func (r *Registry) pinned(name string) (*pinnedMap, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, ok := r.maps[name]
	return p, ok
}

// names are the declared map names, sorted.
func (r *Registry) names() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	names := make([]string, 0, len(r.maps))
	for name := range r.maps {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}
