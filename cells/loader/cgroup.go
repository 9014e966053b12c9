package loader

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Cgroup2Mount is where the cgroup2 filesystem is mounted, from
// /proc/self/mountinfo: the default of --cgroup-root.
func Cgroup2Mount() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	defer f.Close()
	return cgroup2Mount(f)
}

// cgroup2Mount returns the mount point of the first cgroup2 filesystem in
// mountinfo (proc(5)): "36 35 98:0 / /sys/fs/cgroup rw - cgroup2 none rw".
// The optional fields before "-" vary in number.
func cgroup2Mount(mountinfo io.Reader) (string, error) {
	sc := bufio.NewScanner(mountinfo)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		for i := 6; i+1 < len(fields); i++ {
			if fields[i] != "-" {
				continue
			}
			if fields[i+1] == "cgroup2" && len(fields) > 4 {
				return unescapeMountinfo(fields[4]), nil
			}
			break
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("read mountinfo: %w", err)
	}
	return "", errors.New("no cgroup2 filesystem is mounted: mount one (mount -t cgroup2 none /sys/fs/cgroup) or set --cgroup-root to a cgroup2 directory")
}

// unescapeMountinfo undoes the octal escapes (\040 for a space) that
// mountinfo uses in paths.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// cgroupID checks that dir is a cgroup2 directory and returns its ID, which
// is what the kernel reports for the cgroup of a link: the inode number of
// the directory.
func cgroupID(dir string) (uint64, error) {
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		return 0, fmt.Errorf("--cgroup-root %s: %w", dir, err)
	}
	if fs.Type != unix.CGROUP2_SUPER_MAGIC {
		return 0, fmt.Errorf("--cgroup-root %s is not a cgroup2 directory (filesystem type %#x): set it to the cgroup2 mount point or a directory below it", dir, fs.Type)
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return 0, fmt.Errorf("--cgroup-root %s: %w", dir, err)
	}
	return st.Ino, nil
}
