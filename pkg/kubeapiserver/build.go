package kubeapiserver

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"

	"github.com/cellium/cellium/pkg/toolbuild"
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
	return toolbuild.CacheDir("kube-apiserver-" + KubernetesVersion), nil
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
	d, err := toolbuild.Lock(ctx, dir, gocmd, log)
	if err != nil {
		return "", err
	}
	defer d.Close()
	if d.Has("kube-apiserver") {
		return filepath.Join(dir, "kube-apiserver"), nil
	}
	fmt.Fprintf(log, "building kube-apiserver %s in %s (once per machine; several minutes)\n", KubernetesVersion, dir)
	// k8s.io/kubernetes replaces its staging modules with directories of
	// its own repository, which a module download does not have: this
	// module replaces them with their published versions instead.
	if err := d.WriteFile("go.mod", "module kubeapiserverbuild\n\ngo 1.26\n\nrequire k8s.io/kubernetes "+KubernetesVersion+"\n"); err != nil {
		return "", err
	}
	out, err := d.Go("mod", "download", "-json", "k8s.io/kubernetes@"+KubernetesVersion)
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
	if err := d.WriteFile("go.mod", gomod.String()); err != nil {
		return "", err
	}
	tools := "//go:build tools\n\npackage tools\n\nimport _ \"k8s.io/kubernetes/cmd/kube-apiserver\"\n"
	if err := d.WriteFile("tools.go", tools); err != nil {
		return "", err
	}
	if _, err := d.Go("mod", "tidy"); err != nil {
		return "", err
	}
	return d.Build("kube-apiserver", "k8s.io/kubernetes/cmd/kube-apiserver")
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
