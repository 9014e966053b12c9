package main

import (
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// TestImage builds the image as `make image` does, then runs it as a
// DaemonSet would: `agent version` and `agent hive` work, and the
// install-cni step copies cellium-cni into a mounted directory. It runs the
// image with podman when podman can run containers here; else it unpacks
// the image's layers into a root filesystem and runs the entrypoint in it
// with chroot, in mount and PID namespaces of its own with a /proc, as a
// container runtime would give it, and says so.
func TestImage(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: it runs the image's entrypoint in a chroot or a container")
	}
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("needs make")
	}
	repo, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	archive := filepath.Join(dir, "agent.oci.tar")
	image := fmt.Sprintf("localhost/cellium/agent-test:%d", os.Getpid())
	commit := strings.TrimSpace(run(t, repo, "git", "rev-parse", "HEAD"))

	out := run(t, repo, "make", "image", "IMAGE="+image, "IMAGE_ARCHIVE="+archive, "COMMIT="+commit)
	t.Logf("make image:\n%s", lastLines(out, 3))

	rootfs := filepath.Join(dir, "rootfs")
	cfg := unpackImage(t, archive, image, rootfs)
	if strings.Join(cfg.Config.Entrypoint, " ") != "/usr/local/bin/agent" {
		t.Errorf("entrypoint %v, want /usr/local/bin/agent", cfg.Config.Entrypoint)
	}
	for _, bin := range []string{"agent", "cellium-cni"} {
		checkStaticStripped(t, filepath.Join(rootfs, "usr", "local", "bin", bin))
	}
	if _, err := os.Stat(filepath.Join(rootfs, "bin", "sh")); !os.IsNotExist(err) {
		t.Errorf("the image has a shell: %v", err)
	}

	cniDir := filepath.Join(dir, "cni-bin")
	if err := os.Mkdir(cniDir, 0o755); err != nil {
		t.Fatal(err)
	}
	runImage := podmanRunner(t, archive, image)
	if runImage == nil {
		runImage = chrootRunner(t, rootfs)
	}

	version := runImage(t, "", "version")
	for _, want := range []string{"commit " + commit, "built 20"} {
		if !strings.Contains(version, want) {
			t.Errorf("agent version in the image lacks %q:\n%s", want, version)
		}
	}
	if hive := runImage(t, "", "hive"); !strings.Contains(hive, "Ⓜ️ daemon (") || !strings.Contains(hive, "Start hooks:") {
		t.Errorf("agent hive in the image:\n%.400s", hive)
	}
	// The DaemonSet's init container.
	runImage(t, cniDir, "install-cni", "--cni-bin-dir", "/host/opt/cni/bin")
	installed, err := os.ReadFile(filepath.Join(cniDir, "cellium-cni"))
	if err != nil {
		t.Fatalf("install-cni left no plugin in the mounted directory: %v", err)
	}
	want, err := os.ReadFile(filepath.Join(rootfs, "usr", "local", "bin", "cellium-cni"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(installed, want) {
		t.Errorf("installed plugin (%d bytes) differs from the image's (%d bytes)", len(installed), len(want))
	}
	if fi, _ := os.Stat(filepath.Join(cniDir, "cellium-cni")); fi.Mode().Perm() != 0o755 {
		t.Errorf("installed plugin mode %v, want 0755", fi.Mode())
	}
}

func run(t *testing.T, dir, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, lastLines(string(out), 30))
	}
	return string(out)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// imageRunner runs the image's entrypoint with args, with mount (if not
// empty) at /host/opt/cni/bin, and returns its output.
type imageRunner func(t *testing.T, mount string, args ...string) string

// podmanRunner loads the archive into podman and returns a runner, or nil
// when podman cannot run a container here (no podman, or a runtime that
// this kernel's cgroups or limits defeat: the reason is logged).
func podmanRunner(t *testing.T, archive, image string) imageRunner {
	podman, err := exec.LookPath("podman")
	if err != nil {
		t.Log("no podman: running the image's entrypoint in a chroot of its unpacked layers")
		return nil
	}
	if out, err := exec.Command(podman, "load", "-i", archive).CombinedOutput(); err != nil {
		t.Fatalf("podman load -i %s: %v\n%s", archive, err, out)
	}
	t.Cleanup(func() { exec.Command(podman, "rmi", "-f", image).Run() })
	// podman's default limits may be above what this machine lets a
	// container have; these are enough for the commands here.
	limits := []string{"--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"}
	var runtimes [][]string
	runtimes = append(runtimes, nil)
	if _, err := exec.LookPath("runc"); err == nil {
		runtimes = append(runtimes, []string{"--runtime", "runc"})
	}
	var failures []string
	for _, rt := range runtimes {
		args := append(append(append([]string{}, rt...), "run", "--rm", "--network", "none"), limits...)
		probe := exec.Command(podman, append(args, image, "version")...)
		out, err := probe.CombinedOutput()
		if err != nil {
			failures = append(failures, fmt.Sprintf("podman %s: %v: %s", strings.Join(rt, " "), err, strings.TrimSpace(string(out))))
			continue
		}
		t.Logf("running the image with podman %s", strings.Join(rt, " "))
		return func(t *testing.T, mount string, cmdArgs ...string) string {
			t.Helper()
			a := args
			if mount != "" {
				a = append(a, "-v", mount+":/host/opt/cni/bin")
			}
			return run(t, "", podman, append(append(a, image), cmdArgs...)...)
		}
	}
	t.Logf("podman cannot run containers here (%s): running the image's entrypoint in a chroot of its unpacked layers instead",
		strings.Join(failures, "; "))
	return nil
}

// chrootRunner runs the entrypoint of the unpacked image at rootfs with
// chroot, in a mount namespace of its own for the bind mount.
func chrootRunner(t *testing.T, rootfs string) imageRunner {
	// A container runtime gives the container its own /proc; so does
	// this, in a PID namespace of the command's own.
	if err := os.MkdirAll(filepath.Join(rootfs, "proc"), 0o555); err != nil {
		t.Fatal(err)
	}
	return func(t *testing.T, mount string, args ...string) string {
		t.Helper()
		script := `exec chroot "$1" /usr/local/bin/agent "${@:3}"`
		if mount != "" {
			target := filepath.Join(rootfs, "host", "opt", "cni", "bin")
			if err := os.MkdirAll(target, 0o755); err != nil {
				t.Fatal(err)
			}
			script = `mount --bind "$2" "$1/host/opt/cni/bin" && ` + script
		}
		return run(t, "", "unshare", append([]string{"--mount", "--pid", "--fork", "--mount-proc=" + filepath.Join(rootfs, "proc"), "bash", "-c", script, "-", rootfs, mount}, args...)...)
	}
}

// unpackImage reads the OCI archive (readArchive) and unpacks its image's
// file system into rootfs with tar.
func unpackImage(t *testing.T, archive, image, rootfs string) *v1.ConfigFile {
	t.Helper()
	img := readArchive(t, archive, image)
	if err := os.MkdirAll(rootfs, 0o755); err != nil {
		t.Fatal(err)
	}
	untar := exec.Command("tar", "-x", "-C", rootfs)
	untar.Stdin = mutate.Extract(img)
	if out, err := untar.CombinedOutput(); err != nil {
		t.Fatalf("unpacking the image into %s: %v\n%s", rootfs, err, out)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// checkStaticStripped fails unless path is an ELF executable with no
// interpreter (static) and no symbol table (stripped).
func checkStaticStripped(t *testing.T, path string) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("%s has an ELF interpreter: not static", path)
		}
	}
	if f.Section(".symtab") != nil {
		t.Errorf("%s has a symbol table: not stripped", path)
	}
}
