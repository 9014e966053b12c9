package devcluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// cgroup2Mount is the mount point of the first cgroup2 filesystem in
// /proc/self/mountinfo (proc(5)): "36 35 98:0 / /sys/fs/cgroup rw - cgroup2
// none rw", with a varying number of optional fields before "-".
func cgroup2Mount() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		for i := 6; i+1 < len(fields); i++ {
			if fields[i] == "-" {
				if fields[i+1] == "cgroup2" {
					return unescapeMountinfo(fields[4]), nil
				}
				break
			}
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("read /proc/self/mountinfo: %w", err)
	}
	return "", errors.New("no cgroup2 filesystem is mounted (the agents' socket load balancing attaches to cgroup2 directories): mount one, e.g. mount -t cgroup2 none /sys/fs/cgroup/unified")
}

// unescapeMountinfo undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountinfo(s string) string {
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

// isCgroup2 says whether dir is a directory of a cgroup2 filesystem.
func isCgroup2(dir string) bool {
	var st unix.Statfs_t
	return unix.Statfs(dir, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC
}

// removeCgroup kills what still runs in the cgroup dir (processes Exec left
// behind) and removes it. A cgroup that is not there is no error.
func removeCgroup(ctx context.Context, dir string) error {
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if !isCgroup2(dir) {
		return fmt.Errorf("%s is not a cgroup2 directory; left alone", dir)
	}
	// cgroup.kill exists from Linux 5.14. Opened without O_CREAT: only a
	// cgroup has the file.
	if f, err := os.OpenFile(filepath.Join(dir, "cgroup.kill"), os.O_WRONLY, 0); err == nil {
		f.WriteString("1")
		f.Close()
	} else {
		killProcs(dir)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		err := unix.Rmdir(dir)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("remove cgroup %s: %w", dir, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("remove cgroup %s: processes still in it (%s)", dir, strings.TrimSpace(readFile(filepath.Join(dir, "cgroup.procs"))))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// killProcs sends SIGKILL to every process in the cgroup.
func killProcs(dir string) {
	for _, line := range strings.Fields(readFile(filepath.Join(dir, "cgroup.procs"))) {
		if pid, err := strconv.Atoi(line); err == nil {
			unix.Kill(pid, unix.SIGKILL)
		}
	}
}

func readFile(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}
