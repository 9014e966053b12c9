// Package cgroup2 finds the cgroup2 filesystem and tells its directories
// apart: what the loader needs for --cgroup-root and the dev-cluster for
// its nodes' cgroups.
package cgroup2

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

// ErrNotMounted says that no cgroup2 filesystem is mounted.
var ErrNotMounted = errors.New("no cgroup2 filesystem is mounted: mount one (mount -t cgroup2 none /sys/fs/cgroup)")

// Mount is where the first cgroup2 filesystem of /proc/self/mountinfo is
// mounted.
func Mount() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	defer f.Close()
	return parseMount(f)
}

// parseMount returns the mount point of the first cgroup2 filesystem in
// mountinfo (proc(5)): "36 35 98:0 / /sys/fs/cgroup rw - cgroup2 none rw".
// The optional fields before "-" vary in number.
func parseMount(mountinfo io.Reader) (string, error) {
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
	return "", ErrNotMounted
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

// IsCgroup2 says whether dir is a directory of a cgroup2 filesystem.
func IsCgroup2(dir string) bool {
	var st unix.Statfs_t
	return unix.Statfs(dir, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC
}
