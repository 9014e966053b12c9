package kubeapiserver

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
)

// KubernetesVersion is the release kube-apiserver is built from: the
// newest the module proxy serves whole (see shared/notes/LIBRARIES.md).
const KubernetesVersion = "v1.36.3"

// stagingVersion is the version of the k8s.io staging modules of that
// release (k8s.io/api, k8s.io/apiserver, ...).
const stagingVersion = "v0.36.3"

// CacheDir is where the binary is built: $XDG_CACHE_HOME (or ~/.cache,
// or without a home the temporary directory)
// /cellium/kube-apiserver-<version>, once per machine.
func CacheDir() (string, error) {
	base, err := os.UserCacheDir()
	if err != nil {
		base = os.TempDir()
	}
	return filepath.Join(base, "cellium", "kube-apiserver-"+KubernetesVersion), nil
}

// Binary is the kube-apiserver to run: $KUBE_APISERVER_BIN, or the one
// Build made; or an error saying how to get one.
func Binary() (string, error) {
	if bin := os.Getenv("KUBE_APISERVER_BIN"); bin != "" {
		return bin, nil
	}
	dir, err := CacheDir()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "kube-apiserver")
	if _, err := os.Stat(bin); err != nil {
		return "", fmt.Errorf("no kube-apiserver at %s: build it with `make kube-apiserver` (or set $KUBE_APISERVER_BIN)", bin)
	}
	return bin, nil
}

// Build builds kube-apiserver from k8s.io/kubernetes through the module
// proxy, in a module of its own in CacheDir, unless it is there already,
// and returns its path. The go command's output goes to log. Concurrent
// builds on one machine wait for each other.
func Build(ctx context.Context, gocmd string, log io.Writer) (string, error) {
	dir, err := CacheDir()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "kube-apiserver")
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

	goRun := func(args ...string) ([]byte, error) {
		cmd := exec.CommandContext(ctx, gocmd, args...)
		cmd.Dir = dir
		// The module's own go.mod rules; the caller's GOFLAGS (say
		// -mod=vendor) are for another module.
		cmd.Env = append(os.Environ(), "GOFLAGS=", "GOWORK=off")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, io.MultiWriter(&out, log)
		err := cmd.Run()
		if err != nil {
			return out.Bytes(), fmt.Errorf("go %s in %s: %w", strings.Join(args, " "), dir, err)
		}
		return out.Bytes(), nil
	}
	fmt.Fprintf(log, "building kube-apiserver %s in %s (once per machine; several minutes)\n", KubernetesVersion, dir)
	// k8s.io/kubernetes replaces its staging modules with directories of
	// its own repository, which a module download does not have: this
	// module replaces them with their published versions instead.
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module kubeapiserverbuild\n\ngo 1.26\n\nrequire k8s.io/kubernetes "+KubernetesVersion+"\n"), 0o644); err != nil {
		return "", err
	}
	out, err := goRun("mod", "download", "-json", "k8s.io/kubernetes@"+KubernetesVersion)
	if err != nil {
		return "", err
	}
	var mod struct{ GoMod string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.GoMod == "" {
		return "", fmt.Errorf("go mod download k8s.io/kubernetes@%s: no go.mod in %q", KubernetesVersion, out)
	}
	staging, err := stagingModules(mod.GoMod)
	if err != nil {
		return "", err
	}
	var gomod strings.Builder
	fmt.Fprintf(&gomod, "module kubeapiserverbuild\n\ngo 1.26\n\nrequire k8s.io/kubernetes %s\n\nreplace (\n", KubernetesVersion)
	for _, m := range staging {
		fmt.Fprintf(&gomod, "\t%s => %s %s\n", m, m, stagingVersion)
	}
	gomod.WriteString(")\n")
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(gomod.String()), 0o644); err != nil {
		return "", err
	}
	tools := "//go:build tools\n\npackage tools\n\nimport _ \"k8s.io/kubernetes/cmd/kube-apiserver\"\n"
	if err := os.WriteFile(filepath.Join(dir, "tools.go"), []byte(tools), 0o644); err != nil {
		return "", err
	}
	if _, err := goRun("mod", "tidy"); err != nil {
		return "", err
	}
	tmp := bin + ".tmp"
	if _, err := goRun("build", "-trimpath", "-ldflags=-s -w", "-o", tmp, "k8s.io/kubernetes/cmd/kube-apiserver"); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, bin); err != nil {
		return "", err
	}
	return bin, nil
}

var stagingReplace = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^\s*(k8s\.io/[a-z0-9-]+)\s+=>\s+\./staging/`)
})

// stagingModules lists the modules that the go.mod at path replaces with
// its staging directories.
func stagingModules(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var mods []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m := stagingReplace().FindStringSubmatch(sc.Text()); m != nil {
			mods = append(mods, m[1])
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(mods) == 0 {
		return nil, fmt.Errorf("%s replaces no staging module: not k8s.io/kubernetes's go.mod?", path)
	}
	return mods, nil
}
