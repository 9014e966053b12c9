package bpfmaps

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/cilium/hive/cell"
)

// Cleanup removes what one cell leaves pinned besides its maps, such as the
// links that keep its programs attached, for `agent cleanup`. A cell
// contributes one by returning a CleanupOut from a constructor; the
// constructor does no I/O, Remove does it all.
type Cleanup struct {
	// Name says whose objects these are: the module ID.
	Name string
	// Remove undoes the cell's pins and returns one line per object it
	// removed. It is idempotent: with nothing left, it returns nothing.
	Remove func() (removed []string, err error)
}

// CleanupOut contributes a Cleanup to the Cleaner.
type CleanupOut struct {
	cell.Out
	Cleanup Cleanup `group:"bpf-cleanups"`
}

// Cleaner removes everything the agent pinned: what cells contributed as
// Cleanups, then the declared maps, then whatever else is left in the pin
// directory (pins of an older agent), then the directory. It needs no
// started hive: build the graph (hive.Populate) and call Remove.
type Cleaner struct {
	reg      *Registry
	cleanups []Cleanup
}

type cleanerParams struct {
	cell.In
	Registry *Registry
	Cleanups []Cleanup `group:"bpf-cleanups"`
}

func newCleaner(p cleanerParams) *Cleaner {
	cleanups := slices.Clone(p.Cleanups)
	slices.SortFunc(cleanups, func(a, b Cleanup) int { return cmp.Compare(a.Name, b.Name) })
	return &Cleaner{reg: p.Registry, cleanups: cleanups}
}

// PinDir is the directory that Remove empties and removes.
func (c *Cleaner) PinDir() string { return c.reg.dir }

// Remove removes everything the agent pinned and returns one line per
// object removed; nothing when there was nothing to remove, which includes
// a --bpf-root that is no BPF filesystem (whose files are nobody's pins).
// It carries on past errors and returns them all. Cells' Cleanups run
// first: they detach what needs more than an unpin.
func (c *Cleaner) Remove() ([]string, error) {
	if ok, _ := isBPFFS(c.reg.root); !ok {
		return nil, nil
	}
	var removed []string
	var errs []error
	for _, cl := range c.cleanups {
		lines, err := cl.Remove()
		removed = append(removed, lines...)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", cl.Name, err))
		}
	}

	for _, name := range c.reg.names() {
		pin := filepath.Join(c.reg.dir, name)
		err := os.Remove(pin)
		switch {
		case err == nil:
			removed = append(removed, "removed map "+pin)
		case !errors.Is(err, fs.ErrNotExist):
			errs = append(errs, fmt.Errorf("remove map pin: %w", err))
		}
	}

	leftovers, err := os.ReadDir(c.reg.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return removed, errors.Join(errs...)
	}
	if err != nil {
		errs = append(errs, fmt.Errorf("list the pin directory: %w", err))
	}
	for _, e := range leftovers {
		path := filepath.Join(c.reg.dir, e.Name())
		if err := os.RemoveAll(path); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", path, err))
			continue
		}
		removed = append(removed, "removed "+path+", which no cell of this agent declares")
	}
	if err := os.Remove(c.reg.dir); err != nil {
		errs = append(errs, fmt.Errorf("remove the pin directory: %w", err))
	} else {
		removed = append(removed, "removed pin directory "+c.reg.dir)
	}
	return removed, errors.Join(errs...)
}
