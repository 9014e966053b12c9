package loader

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/cellium/cellium/cells/bpfmaps"
)

// linksCleanup contributes the removal of the loader's links to `agent
// cleanup`: it detaches every link pinned in the links directory and in
// the endpoint and device links directories below it, whether or not this agent's
// programs made it, and removes the directories.
func linksCleanup(reg *bpfmaps.Registry) bpfmaps.CleanupOut {
	dir := linksDir(reg)
	return bpfmaps.CleanupOut{Cleanup: bpfmaps.Cleanup{
		Name:   "loader",
		Remove: func() ([]string, error) { return removeLinks(dir) },
	}}
}

// removeLinks detaches and removes the links pinned in dir, and those in
// its endpoint and device links directories first.
func removeLinks(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		if (e.Name() == endpointLinksSubdir || e.Name() == deviceLinksSubdir) && e.IsDir() {
			lines, err := removeLinks(filepath.Join(dir, e.Name()))
			removed = append(removed, lines...)
			if err != nil {
				errs = append(errs, err)
			}
			continue
		}
		what, err := detachPinned(filepath.Join(dir, e.Name()))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, "detached and removed link "+what)
	}
	if err := os.Remove(dir); err != nil {
		errs = append(errs, err)
	} else {
		removed = append(removed, "removed link directory "+dir)
	}
	return removed, errors.Join(errs...)
}
