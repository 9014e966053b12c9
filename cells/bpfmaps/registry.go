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

	"github.com/cellium/cellium/cells/health"
	"github.com/cellium/cellium/pkg/apiv1"
)

// Registry knows every map the agent owns. Cells declare their maps with
// [NewMap]; the registry checks that names are valid and unique, and lists
// the maps for GET /v1/maps.
//
// The pin directory belongs to one agent at a time: the registry holds an
// exclusive lock on it from its start to its stop, and a second agent on
// the same --bpf-map-prefix fails to start before it opens any map.
//
// A start that fails (or is interrupted) undoes what it created: the
// registry stops last, and when the agent never finished starting it
// removes the pins this run created ([Registry.CreatedPin]), and the pin
// directory if this run created it and nothing else is in it. What an
// earlier run pinned stays, so that its datapath keeps working.
type Registry struct {
	log       *slog.Logger
	root      string // the bpffs mount point, --bpf-root
	dir       string // where maps are pinned, <root>/<prefix>
	readiness *health.Readiness

	mu         sync.Mutex
	started    bool
	maps       map[string]*pinnedMap
	lockFD     int      // the pin directory, flocked; -1 when not held
	createdDir bool     // this run created the pin directory
	created    []string // pins this run created, in order
}

type registryParams struct {
	cell.In
	Config    Config
	Lifecycle cell.Lifecycle
	Log       *slog.Logger
	// Readiness says whether the start completed; without it (a hive with
	// no health cell) a stop never undoes anything.
	Readiness *health.Readiness `optional:"true"`
}

func newRegistry(p registryParams) (*Registry, error) {
	root, dir, err := p.Config.validate()
	if err != nil {
		return nil, err
	}
	r := &Registry{log: p.Log, root: root, dir: dir, readiness: p.Readiness, maps: map[string]*pinnedMap{}, lockFD: -1}
	// Cells that declare maps take *Registry, so this hook runs before
	// theirs (and its stop after theirs): the pin directory exists by the
	// time a map is opened, and every map is closed by the time a failed
	// start's pins are removed.
	lc := p.Lifecycle
	lc.Append(cell.Hook{OnStart: r.start, OnStop: r.stop})
	return r, nil
}

// CreatedPin records that this run created the pin at path (a map or a
// link under PinDir), so that a start that fails removes it again. A pin
// that replaced an existing one is not recorded: removing it would not
// bring back what it replaced.
func (r *Registry) CreatedPin(path string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.created = append(r.created, path)
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
	createdDir := true
	if err := os.Mkdir(r.dir, 0o700); errors.Is(err, fs.ErrExist) {
		createdDir = false
	} else if err != nil {
		return fmt.Errorf("--bpf-map-prefix: create pin directory %s: %w", r.dir, err)
	}
	if fi, err := os.Stat(r.dir); err != nil {
		return fmt.Errorf("--bpf-map-prefix: %w", err)
	} else if !fi.IsDir() {
		return fmt.Errorf("--bpf-map-prefix: %s exists and is not a directory", r.dir)
	}
	fd, err := lockDir(r.dir)
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.lockFD, r.createdDir = fd, createdDir
	r.started = true
	n := len(r.maps)
	r.mu.Unlock()
	r.log.Info("BPF map pin directory ready", "dir", r.dir, "maps", n)
	return nil
}

// lockDir takes the exclusive lock of the pin directory, which the kernel
// releases when the agent exits, however it exits.
func lockDir(dir string) (int, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("--bpf-map-prefix: open pin directory %s: %w", dir, err)
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		unix.Close(fd)
		if errors.Is(err, unix.EWOULDBLOCK) {
			return -1, fmt.Errorf("--bpf-map-prefix: another agent is running on pin directory %s (it holds the directory's lock); give each agent its own --bpf-map-prefix", dir)
		}
		return -1, fmt.Errorf("--bpf-map-prefix: lock pin directory %s: %w", dir, err)
	}
	return fd, nil
}

// stop releases the pin directory, after removing what this run pinned if
// the run never finished starting.
func (r *Registry) stop(cell.HookContext) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lockFD < 0 {
		return nil
	}
	var errs []error
	if r.readiness != nil && !r.readiness.StartCompleted() {
		errs = r.undoLocked()
	}
	if err := unix.Close(r.lockFD); err != nil {
		errs = append(errs, fmt.Errorf("unlock pin directory %s: %w", r.dir, err))
	}
	r.lockFD = -1
	return errors.Join(errs...)
}

// undoLocked removes the pins of a start that did not complete, newest
// first, and the pin directory if this run made it and it is now empty.
func (r *Registry) undoLocked() []error {
	var errs []error
	var removed []string
	for _, pin := range slices.Backward(r.created) {
		if err := os.Remove(pin); errors.Is(err, unix.ENOTEMPTY) {
			continue // a directory that holds what an earlier run pinned
		} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove pin %s of the failed start: %w", pin, err))
			continue
		}
		removed = append(removed, pin)
	}
	r.created = nil
	if r.createdDir {
		if err := os.Remove(r.dir); err == nil {
			removed = append(removed, r.dir)
		}
	}
	if len(removed) > 0 {
		r.log.Warn("The agent did not finish starting: removed what this run pinned", "pins", removed)
	}
	return errs
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
		reg:       r,
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
