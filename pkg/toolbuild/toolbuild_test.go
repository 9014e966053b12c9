package toolbuild

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestCacheDir(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", "/var/cache/test")
	if got, want := CacheDir("etcd-v1"), "/var/cache/test/cellium/etcd-v1"; got != want {
		t.Fatalf("CacheDir = %q, want %q", got, want)
	}
}

// TestLockExcludesAnotherBuild: while a Dir is held, its lock file cannot
// be locked by another open (another build); after Close it can.
func TestLockExcludesAnotherBuild(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tool")
	d, err := Lock(context.Background(), path, "go", &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	other, err := os.Open(filepath.Join(path, ".lock"))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := syscall.Flock(int(other.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); !errors.Is(err, syscall.EWOULDBLOCK) {
		t.Fatalf("lock while the Dir holds it: %v, want EWOULDBLOCK", err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(other.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatalf("lock after Close: %v", err)
	}
}

// TestGoIgnoresTheCallersModuleSettings: the build module's go.mod rules,
// not the caller's GOFLAGS; a failing command's error holds its output.
func TestGoIgnoresTheCallersModuleSettings(t *testing.T) {
	gocmd, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on the PATH")
	}
	t.Setenv("GOFLAGS", "-mod=vendor")
	var log bytes.Buffer
	d, err := Lock(context.Background(), t.TempDir(), gocmd, &log)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.WriteFile("go.mod", "module toolbuildtest\n\ngo 1.26\n"); err != nil {
		t.Fatal(err)
	}
	out, err := d.Go("env", "GOFLAGS")
	if err != nil {
		t.Fatal(err)
	}
	if got := string(out); strings.Contains(got, "-mod=vendor") {
		t.Fatalf("GOFLAGS in the build module = %q, want the caller's -mod=vendor gone", got)
	}
	_, err = d.Go("build", "./nosuchpackage")
	if err == nil || !strings.Contains(err.Error(), "nosuchpackage") || !strings.Contains(log.String(), "nosuchpackage") {
		t.Fatalf("failed build: error %v, log %q: want both to name the package", err, log.String())
	}
	if d.Has("etcd") {
		t.Fatal("Has found a binary nothing built")
	}
}
