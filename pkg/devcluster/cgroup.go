package devcluster

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/cellium/cellium/pkg/cgroup2"
	"golang.org/x/sys/unix"
)

// removeCgroup kills what still runs in the cgroup dir (processes Exec left
// behind) and removes it. A cgroup that is not there is no error.
func removeCgroup(ctx context.Context, dir string) error {
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if !cgroup2.IsCgroup2(dir) {
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
