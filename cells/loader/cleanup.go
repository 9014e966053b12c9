package loader

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/cells/bpfmaps"
	"github.com/cellium/cellium/cells/devices"
)

// linksCleanup contributes the removal of the loader's links to `agent
// cleanup`: it detaches every link pinned in the links directory and in
// the endpoint and device links directories below it, whether or not this agent's
// programs made it, and removes the directories; then it removes the
// endpoints' filters from the endpoints' host sides.
func linksCleanup(reg *bpfmaps.Registry) bpfmaps.CleanupOut {
	dir := linksDir(reg)
	return bpfmaps.CleanupOut{Cleanup: bpfmaps.Cleanup{
		Name: "loader",
		Remove: func() ([]string, error) {
			removed, err := removeLinks(dir)
			filters, ferr := removeFilters()
			return append(removed, filters...), errors.Join(err, ferr)
		},
	}}
}

// removeFilters removes the endpoints' filters (tc.go) from every veth of
// the agent's network namespace named as an endpoint's host side.
func removeFilters() ([]string, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list the interfaces: %w", err)
	}
	var removed []string
	var errs []error
	for _, l := range links {
		if l.Type() != "veth" || !strings.HasPrefix(l.Attrs().Name, devices.EndpointHostPrefix) {
			continue
		}
		for _, h := range endpointHooks {
			for _, bf := range ourFilters(l.Attrs().Index, h) {
				if err := netlink.FilterDel(bf); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ENODEV) {
					errs = append(errs, fmt.Errorf("delete tc filter %s of %s: %w", bf.Name, l.Attrs().Name, err))
					continue
				}
				removed = append(removed, fmt.Sprintf("removed tc filter %s of %s (ifindex %d)", bf.Name, l.Attrs().Name, l.Attrs().Index))
			}
		}
	}
	return removed, errors.Join(errs...)
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
