package etcdtest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// StreamingVersion is the etcd that BuildStreaming builds: one with the
// progress notifications (3.5.13 and later) that kube-apiserver's watch
// cache needs to serve streaming lists (sendInitialEvents) and consistent
// reads, as production clusters' etcd has. Debian's etcd 3.4.23, which the
// tests use, has them not.
const StreamingVersion = "v3.6.8"

// StreamingCacheDir is where BuildStreaming builds: $XDG_CACHE_HOME (or
// ~/.cache, or without a home the temporary directory)
// /cellium/etcd-<version>, once per machine, outside the repository.
func StreamingCacheDir() string {
	base, err := os.UserCacheDir()
	if err != nil {
		base = os.TempDir()
	}
	return filepath.Join(base, "cellium", "etcd-"+StreamingVersion)
}

// StreamingBinary is the etcd BuildStreaming built, or an error saying
// how to build it.
func StreamingBinary() (string, error) {
	bin := filepath.Join(StreamingCacheDir(), "etcd")
	if _, err := os.Stat(bin); err != nil {
		return "", fmt.Errorf("no etcd %s at %s: build it with `make etcd`", StreamingVersion, bin)
	}
	return bin, nil
}

// BuildStreaming builds etcd StreamingVersion from its server module
// (go.etcd.io/etcd/server/v3's etcdmain) through the module proxy, in a
// module of its own in StreamingCacheDir, unless it is there already, and
// returns its path. The go command's output goes to log. Concurrent builds
// on one machine wait for each other.
func BuildStreaming(ctx context.Context, gocmd string, log io.Writer) (string, error) {
	dir := StreamingCacheDir()
	bin := filepath.Join(dir, "etcd")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("lock %s: %w", dir, err)
	}
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	goRun := func(args ...string) error {
		cmd := exec.CommandContext(ctx, gocmd, args...)
		cmd.Dir = dir
		// The module's own go.mod rules; the caller's GOFLAGS (say
		// -mod=vendor) are for another module.
		cmd.Env = append(os.Environ(), "GOFLAGS=", "GOWORK=off")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, io.MultiWriter(&out, log)
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("go %s in %s: %w: %s", strings.Join(args, " "), dir, err, out.Bytes())
		}
		return nil
	}
	fmt.Fprintf(log, "building etcd %s in %s (once per machine; a few minutes)\n", StreamingVersion, dir)
	files := map[string]string{
		"go.mod": "module etcdbuild\n\ngo 1.26\n\nrequire go.etcd.io/etcd/server/v3 " + StreamingVersion + "\n",
		// etcd's own main (go.etcd.io/etcd/v3) is a module of the
		// repository's root that also links etcdctl and etcdutl; the
		// server is etcdmain.Main.
		"main.go": "package main\n\nimport (\n\t\"os\"\n\n\t\"go.etcd.io/etcd/server/v3/etcdmain\"\n)\n\nfunc main() { etcdmain.Main(os.Args) }\n",
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			return "", err
		}
	}
	if err := goRun("mod", "tidy"); err != nil {
		return "", err
	}
	tmp := bin + ".tmp"
	if err := goRun("build", "-trimpath", "-ldflags=-s -w", "-o", tmp, "."); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, bin); err != nil {
		return "", err
	}
	return bin, nil
}
