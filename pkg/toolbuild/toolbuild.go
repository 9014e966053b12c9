// Package toolbuild builds programs of other modules that tests and
// benchmarks run (kube-apiserver, etcd with progress notifications,
// hubble-relay and the hubble CLI) through the Go module proxy, each in a
// module of its own under the user's cache directory, once per machine.
//
// A Dir is such a module's directory, locked against another build of the
// same program on the machine (another test binary, `make`):
//
//	d, err := toolbuild.Lock(ctx, toolbuild.CacheDir("etcd-v3.6.8"), gocmd, log)
//	if err != nil {
//		return err
//	}
//	defer d.Close()
//	if d.Has("etcd") {
//		return nil // built by an earlier run
//	}
//	... d.WriteFile("go.mod", ...); d.Go("mod", "tidy"); d.Build("etcd", ".")
package toolbuild

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

// CacheDir is where the program called name is built:
// $XDG_CACHE_HOME (or ~/.cache, or without a home the temporary
// directory)/cellium/name, outside the repository.
func CacheDir(name string) string {
	base, err := os.UserCacheDir()
	if err != nil {
		base = os.TempDir()
	}
	return filepath.Join(base, "cellium", name)
}

// Dir is a build module's directory, held locked until Close.
type Dir struct {
	Path  string
	ctx   context.Context
	gocmd string
	log   io.Writer
	lock  *os.File
}

// Lock makes path and takes its lock (a flock of path/.lock), waiting for
// another build holding it. The go commands of the Dir run gocmd and
// write their output to log.
func Lock(ctx context.Context, path, gocmd string, log io.Writer) (*Dir, error) {
	if err := os.MkdirAll(path, 0o755); err != nil {
		return nil, err
	}
	lock, err := os.OpenFile(filepath.Join(path, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		lock.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return &Dir{Path: path, ctx: ctx, gocmd: gocmd, log: log, lock: lock}, nil
}

// Close releases the lock.
func (d *Dir) Close() error { return d.lock.Close() }

// Has says whether every one of the binaries names is built in d.
func (d *Dir) Has(names ...string) bool {
	for _, name := range names {
		if _, err := os.Stat(filepath.Join(d.Path, name)); err != nil {
			return false
		}
	}
	return true
}

// WriteFile writes the file name of the build module.
func (d *Dir) WriteFile(name, text string) error {
	return os.WriteFile(filepath.Join(d.Path, name), []byte(text), 0o644)
}

// Go runs the go command with args in d and returns its standard output.
// The build module's own go.mod rules: the caller's GOFLAGS (say
// -mod=vendor) and go.work are for another module. Its error holds the
// command's output.
func (d *Dir) Go(args ...string) ([]byte, error) {
	cmd := exec.CommandContext(d.ctx, d.gocmd, args...)
	cmd.Dir = d.Path
	cmd.Env = append(os.Environ(), "GOFLAGS=", "GOWORK=off")
	var stdout, all bytes.Buffer
	cmd.Stdout, cmd.Stderr = io.MultiWriter(&stdout, &all), io.MultiWriter(&all, d.log)
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("go %s in %s: %w: %s", strings.Join(args, " "), d.Path, err, all.Bytes())
	}
	return stdout.Bytes(), nil
}

// Build builds the package pkg into the binary name of d, stripped,
// written under another name and renamed: a build that fails or is
// killed leaves no binary for Has to find.
func (d *Dir) Build(name, pkg string) (string, error) {
	bin := filepath.Join(d.Path, name)
	tmp := bin + ".tmp"
	if _, err := d.Go("build", "-trimpath", "-ldflags=-s -w", "-o", tmp, pkg); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, bin); err != nil {
		return "", err
	}
	return bin, nil
}
