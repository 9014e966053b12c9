package loader

import (
	"fmt"

	"github.com/cellium/cellium/pkg/cgroup2"
	"golang.org/x/sys/unix"
)

// cgroupID checks that dir is a cgroup2 directory and returns its ID, which
// is what the kernel reports for the cgroup of a link: the inode number of
// the directory.
func cgroupID(dir string) (uint64, error) {
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		return 0, fmt.Errorf("--cgroup-root %s: %w", dir, err)
	}
	if !cgroup2.IsCgroup2(dir) {
		return 0, fmt.Errorf("--cgroup-root %s is not a cgroup2 directory (filesystem type %#x): set it to the cgroup2 mount point or a directory below it", dir, fs.Type)
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return 0, fmt.Errorf("--cgroup-root %s: %w", dir, err)
	}
	return st.Ino, nil
}
