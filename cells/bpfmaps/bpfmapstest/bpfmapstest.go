// Package bpfmapstest gives tests a BPF filesystem of their own, so that
// they never touch the host's /sys/fs/bpf, nor each other's pins.
package bpfmapstest

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// Root returns a --bpf-root for the test: a path that does not exist yet,
// so that the bpf-maps cell mounts a fresh bpffs there at start. The mount
// is detached when the test ends, which drops every pin in it. Root skips
// the test when it cannot mount a bpffs (not root, no bpffs in the kernel).
func Root(t testing.TB) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a BPF filesystem")
	}
	dir := t.TempDir()
	probe := filepath.Join(dir, "probe")
	if err := os.Mkdir(probe, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("bpffs", probe, "bpf", 0, ""); err != nil {
		t.Skipf("cannot mount a BPF filesystem: %v", err)
	}
	if err := unix.Unmount(probe, 0); err != nil {
		t.Fatalf("unmount probe bpffs: %v", err)
	}

	root := filepath.Join(dir, "bpffs")
	// Registered before the caller starts a hive, so it runs after the
	// hive's stop (cleanups run last in, first out).
	t.Cleanup(func() {
		err := unix.Unmount(root, unix.MNT_DETACH)
		if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			t.Errorf("unmount test bpffs %s: %v", root, err)
		}
	})
	return root
}
