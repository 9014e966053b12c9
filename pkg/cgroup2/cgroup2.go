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
	"path/filepath"
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

// MemoryCgroup is the directory of this process's memory cgroup: in the
// cgroup2 hierarchy when its cgroup there has the memory controller (v2
// true), else in cgroup v1's memory hierarchy.
func MemoryCgroup() (dir string, v2 bool, err error) {
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", false, err
	}
	var v1Path, v2Path string
	for line := range strings.Lines(string(self)) {
		fields := strings.SplitN(strings.TrimSpace(line), ":", 3)
		if len(fields) != 3 {
			continue
		}
		switch {
		case fields[0] == "0" && fields[1] == "":
			v2Path = fields[2]
		case strings.Contains(","+fields[1]+",", ",memory,"):
			v1Path = fields[2]
		}
	}
	if mount, err := Mount(); err == nil && v2Path != "" {
		dir := filepath.Join(mount, v2Path)
		if ctl, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers")); err == nil && strings.Contains(" "+strings.TrimSpace(string(ctl))+" ", " memory ") {
			return dir, true, nil
		}
	}
	if v1Path == "" {
		return "", false, fmt.Errorf("no memory controller in /proc/self/cgroup:\n%s", self)
	}
	mount, err := v1MemoryMount()
	if err != nil {
		return "", false, err
	}
	return filepath.Join(mount, v1Path), false, nil
}

// v1MemoryMount is where cgroup v1's memory hierarchy is mounted.
func v1MemoryMount() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		fields, super := strings.Fields(pre), strings.Fields(post)
		if ok && len(fields) > 4 && len(super) > 2 && super[0] == "cgroup" && strings.Contains(","+super[2]+",", ",memory,") {
			return unescapeMountinfo(fields[4]), nil
		}
	}
	return "", fmt.Errorf("no cgroup v1 memory hierarchy in /proc/self/mountinfo")
}

// TempMemoryCgroup makes an empty memory cgroup below this process's own
// (see MemoryCgroup; parent is that one, v2 says which hierarchy), named
// prefix and a random suffix, for a benchmark to charge memory to. The
// caller removes it (os.Remove(dir)) once no process is left in it.
func TempMemoryCgroup(prefix string) (dir, parent string, v2 bool, err error) {
	parent, v2, err = MemoryCgroup()
	if err != nil {
		return "", "", false, err
	}
	dir, err = os.MkdirTemp(parent, prefix)
	if err != nil {
		return "", "", false, err
	}
	return dir, parent, v2, nil
}

// ReadUint is the number a file of the cgroup dir holds, such as
// memory.current or memory.kmem.usage_in_bytes.
func ReadUint(dir, file string) (uint64, error) {
	raw, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(raw)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", filepath.Join(dir, file), err)
	}
	return n, nil
}

// MemoryStat is the value of key in the memory.stat of the cgroup dir
// (kernel, inactive_file, v1's total_inactive_file, ...).
func MemoryStat(dir, key string) (uint64, error) {
	path := filepath.Join(dir, "memory.stat")
	stat, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(stat)) {
		if k, value, ok := strings.Cut(strings.TrimSpace(line), " "); ok && k == key {
			n, err := strconv.ParseUint(value, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s %s: %w", path, key, err)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("no %s in %s", key, path)
}
