package loader

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/hive/cell"

	"github.com/cellium/cellium/bpf"
	"github.com/cellium/cellium/cells/bpfmaps"
	"github.com/cellium/cellium/cells/ctmaps"
	"github.com/cellium/cellium/cells/lbmaps"
	"github.com/cellium/cellium/pkg/cgroup2"
)

// linksDir is where the loader pins its links.
func linksDir(reg *bpfmaps.Registry) string { return filepath.Join(reg.PinDir(), "links") }

// loader is the start and stop hook that attaches the programs.
type loader struct {
	log    *slog.Logger
	cfg    Config
	maps   *lbmaps.Maps
	events *ctmaps.Events
	dir    string
	reg    *bpfmaps.Registry
	health cell.Health

	coll  *ebpf.Collection
	links []link.Link
}

var _ cell.HookDescriptiveInterface = (*loader)(nil)

func (l *loader) HookInfo() string { return "socket load-balancing programs" }

func registerLoader(cfg Config, lc cell.Lifecycle, log *slog.Logger, maps *lbmaps.Maps, events *ctmaps.Events, reg *bpfmaps.Registry, health cell.Health) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	lc.Append(&loader{log: log, cfg: cfg, maps: maps, events: events, dir: linksDir(reg), reg: reg, health: health})
	return nil
}

func (l *loader) Start(cell.HookContext) (err error) {
	root := l.cfg.CgroupRoot
	if root == "" {
		if root, err = cgroup2.Mount(); err != nil {
			return fmt.Errorf("--cgroup-root: %w, or set --cgroup-root to a cgroup2 directory", err)
		}
	}
	cgroup, err := cgroupID(root)
	if err != nil {
		return err
	}

	spec, err := l.spec()
	if err != nil {
		return err
	}
	l.coll, err = ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{MapReplacements: l.replacements()})
	if err != nil {
		// The error keeps only the end of the verifier's log.
		if ve, ok := errors.AsType[*ebpf.VerifierError](err); ok {
			l.log.Error("The verifier refused a socket load-balancing program", "log", fmt.Sprintf("%+v", ve))
		}
		return fmt.Errorf("load the socket load-balancing programs: %w", err)
	}
	defer func() {
		if err != nil {
			l.close()
		}
	}()

	if err := os.Mkdir(l.dir, 0o700); err == nil {
		l.reg.CreatedPin(l.dir)
	} else if !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("create the link pin directory: %w", err)
	}
	names := slices.Sorted(maps.Keys(l.coll.Programs))
	for _, name := range names {
		lnk, how, err := l.attach(name, l.coll.Programs[name], spec.Programs[name].AttachType, root, cgroup)
		if err != nil {
			return fmt.Errorf("attach %s to cgroup %s: %w", name, root, err)
		}
		if how == "attached" {
			// A start that fails after this detaches it again (the
			// registry removes the pin once every link is closed).
			l.reg.CreatedPin(filepath.Join(l.dir, name))
		}
		l.links = append(l.links, lnk)
		l.log.Info("Attached socket load-balancing program", "program", name, "cgroup", root, "link", how)
	}
	l.removeStale(names)
	l.health.OK(fmt.Sprintf("%d socket load-balancing programs attached to cgroup %s: %s",
		len(names), root, strings.Join(names, ", ")))
	return nil
}

// replacements are the agent's maps that the programs use instead of their
// own: the load-balancing maps, and the event ring buffer they report
// translations to.
func (l *loader) replacements() map[string]*ebpf.Map {
	m := l.maps.EBPF()
	maps.Copy(m, l.events.EBPF())
	return m
}

// spec is the compiled object fitted to the agent's maps: their sizes come
// from flags, and so does the Maglev table size the programs index with.
func (l *loader) spec() (*ebpf.CollectionSpec, error) {
	spec, err := bpf.LoadSockLB()
	if err != nil {
		return nil, err
	}
	for name, m := range l.replacements() {
		ms, ok := spec.Maps[name]
		if !ok {
			return nil, fmt.Errorf("the socket load-balancing programs have no map %s", name)
		}
		ms.MaxEntries = m.MaxEntries()
	}
	size := spec.Variables[bpf.SockLBVarMaglevTableSize]
	if size == nil {
		return nil, fmt.Errorf("the socket load-balancing programs have no variable %s", bpf.SockLBVarMaglevTableSize)
	}
	if err := size.Set(uint32(l.maps.Maglev4.TableSize())); err != nil {
		return nil, fmt.Errorf("set %s: %w", bpf.SockLBVarMaglevTableSize, err)
	}
	return spec, nil
}

// attach makes prog the program of the link pinned under name, attached to
// the cgroup, and returns the link and how it got there: "updated" (the
// pinned link now runs prog), "attached" (there was no pin) or "replaced"
// (the pin held no usable link).
func (l *loader) attach(name string, prog *ebpf.Program, at ebpf.AttachType, root string, cgroup uint64) (link.Link, string, error) {
	pin := filepath.Join(l.dir, name)
	old, err := link.LoadPinnedLink(pin, nil)
	switch {
	case err == nil:
		why := unusable(old, at, cgroup)
		if why == "" {
			if err := old.Update(prog); err != nil {
				why = err.Error()
			} else {
				return old, "updated", nil
			}
		}
		l.log.Warn("Replacing a pinned link that cannot run the new program", "pin", pin, "reason", why)
	case !errors.Is(err, fs.ErrNotExist):
		l.log.Warn("Replacing a pin that is no usable link", "pin", pin, "error", err)
	}

	lnk, err := link.AttachCgroup(link.CgroupOptions{Path: root, Attach: at, Program: prog})
	if err == nil {
		err = pinReplacing(lnk, pin)
		if err != nil {
			lnk.Close()
		}
	}
	if old == nil {
		return lnk, "attached", err
	}
	// Detach the old link only now, so that there is always a program.
	if err == nil {
		if derr := old.Detach(); derr != nil {
			l.log.Warn("Detach replaced link", "pin", pin, "error", derr)
		}
	}
	old.Close()
	return lnk, "replaced", err
}

// unusable says why a pinned link cannot take the program of the given
// attach type on the cgroup, or "" if it can.
func unusable(lnk link.Link, at ebpf.AttachType, cgroup uint64) string {
	info, err := lnk.Info()
	if err != nil {
		return err.Error()
	}
	cg := info.Cgroup()
	if info.Type != link.CgroupType || cg == nil {
		return fmt.Sprintf("it is a %v link, not a cgroup link", info.Type)
	}
	if got := ebpf.AttachType(cg.AttachType); got != at {
		return fmt.Sprintf("it is attached as %s, not %s", got, at)
	}
	if cg.CgroupId == 0 {
		return "its cgroup is gone"
	}
	if cg.CgroupId != cgroup {
		return fmt.Sprintf("it is attached to cgroup %d, not to --cgroup-root (cgroup %d)", cg.CgroupId, cgroup)
	}
	return ""
}

// pinReplacing pins lnk at pin, replacing whatever is pinned there in one
// step: pinned under a temporary name first, then renamed over the old
// pin, which bpffs allows. (bpffs refuses names with a dot.)
func pinReplacing(lnk link.Link, pin string) error {
	tmp := pin + "_replacing"
	if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := lnk.Pin(tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, pin); err != nil {
		lnk.Unpin()
		return fmt.Errorf("pin: %w", err)
	}
	return nil
}

// removeStale detaches and removes the pinned links of programs that no
// longer exist, and leftovers of an interrupted pinReplacing. The endpoint
// links' directory is the endpoint reconciler's, the device links' the
// NodePort job's.
func (l *loader) removeStale(programs []string) {
	entries, err := os.ReadDir(l.dir)
	if err != nil {
		l.log.Warn("List pinned links", "dir", l.dir, "error", err)
		return
	}
	for _, e := range entries {
		if slices.Contains(programs, e.Name()) || e.Name() == endpointLinksSubdir || e.Name() == deviceLinksSubdir {
			continue
		}
		what, err := detachPinned(filepath.Join(l.dir, e.Name()))
		if err != nil {
			l.log.Warn("Remove stale pinned link", "error", err)
			continue
		}
		l.log.Info("Removed stale pinned link", "link", what)
	}
}

// pruneLinks detaches and removes every link pinned in dir that want does
// not name, telling detached about each; a directory that is not there
// holds nothing to prune. It carries on past errors and returns them all.
func pruneLinks(dir string, want map[string]bool, detached func(what string)) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if want[e.Name()] {
			continue
		}
		what, err := detachPinned(filepath.Join(dir, e.Name()))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		detached(what)
	}
	return errors.Join(errs...)
}

// detachPinned detaches the link pinned at pin, if it is one, removes the
// pin and describes what it removed.
func detachPinned(pin string) (string, error) {
	what := pin
	if lnk, err := link.LoadPinnedLink(pin, nil); err == nil {
		if info, err := lnk.Info(); err == nil {
			what = fmt.Sprintf("%s (%s)", pin, describeLink(info))
		}
		// Detach even if another process holds the link open.
		err := lnk.Detach()
		lnk.Close()
		if err != nil && !errors.Is(err, ebpf.ErrNotSupported) {
			return "", fmt.Errorf("detach %s: %w", pin, err)
		}
	}
	if err := os.Remove(pin); err != nil {
		return "", err
	}
	return what, nil
}

// Stop closes the agent's handles; the pinned links keep the programs
// attached.
func (l *loader) Stop(cell.HookContext) error {
	l.close()
	return nil
}

func (l *loader) close() {
	for _, lnk := range l.links {
		lnk.Close()
	}
	l.links = nil
	if l.coll != nil {
		l.coll.Close()
		l.coll = nil
	}
}
