// Package hubblerelay builds the upstream hubble-relay and hubble CLI from
// Cilium's Go module, once per machine, for the dev-cluster and its tests:
// the relay that joins every node's Hubble server through the Peer
// service, and the CLI that reads flows from it.
//
// The binaries are built through the module proxy, in a module of its own
// under the user's cache directory (CacheDir), by `make hubble-relay` or
// Build; Binaries finds them, or says how to get them, so that a test
// skips with that reason instead of building for minutes.
//
//	relay, cli, err := hubblerelay.Binaries()
//	if err != nil {
//		t.Skip(err)
//	}
package hubblerelay

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"

	"github.com/cellium/cellium/pkg/toolbuild"
)

// CiliumVersion is the release hubble-relay and hubble are built from:
// the one this module's go.mod requires for the Hubble API.
const CiliumVersion = "v1.18.4"

// CacheDir is where the binaries are built: $XDG_CACHE_HOME (or ~/.cache,
// or without a home the temporary directory)
// /cellium/hubble-relay-<version>, once per machine.
func CacheDir() string { return toolbuild.CacheDir("hubble-relay-" + CiliumVersion) }

// Binaries are the hubble-relay and hubble binaries tests use:
// $HUBBLE_RELAY_BIN and $HUBBLE_BIN, or those Build made; or an error
// saying how to get them.
func Binaries() (relay, cli string, err error) {
	relay, cli = os.Getenv("HUBBLE_RELAY_BIN"), os.Getenv("HUBBLE_BIN")
	if relay == "" {
		relay = filepath.Join(CacheDir(), "hubble-relay")
	}
	if cli == "" {
		cli = filepath.Join(CacheDir(), "hubble")
	}
	for _, bin := range []string{relay, cli} {
		if _, err := os.Stat(bin); err != nil {
			return "", "", fmt.Errorf("no %s: build hubble-relay and hubble with `make hubble-relay` (or set $HUBBLE_RELAY_BIN and $HUBBLE_BIN)", bin)
		}
	}
	return relay, cli, nil
}

// programs are the main packages built, by binary name.
var programs = map[string]string{
	"hubble-relay": "github.com/cilium/cilium/hubble-relay",
	"hubble":       "github.com/cilium/cilium/hubble",
}

// Build builds hubble-relay and hubble from github.com/cilium/cilium
// through the module proxy, in a module of its own in CacheDir, unless
// they are there already, and returns their paths. The go command's output
// goes to log. Concurrent builds on one machine wait for each other.
func Build(ctx context.Context, gocmd string, log io.Writer) (relay, cli string, err error) {
	dir := CacheDir()
	relay, cli = filepath.Join(dir, "hubble-relay"), filepath.Join(dir, "hubble")
	d, err := toolbuild.Lock(ctx, dir, gocmd, log)
	if err != nil {
		return "", "", err
	}
	defer d.Close()
	if d.Has("hubble-relay", "hubble") {
		return relay, cli, nil
	}
	fmt.Fprintf(log, "building hubble-relay and hubble %s in %s (once per machine; several minutes)\n", CiliumVersion, dir)
	if err := d.WriteFile("go.mod", "module hubblerelaybuild\n\ngo 1.26\n\nrequire github.com/cilium/cilium "+CiliumVersion+"\n"); err != nil {
		return "", "", err
	}
	out, err := d.Go("mod", "download", "-json", "github.com/cilium/cilium@"+CiliumVersion)
	if err != nil {
		return "", "", err
	}
	var mod struct{ GoMod string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.GoMod == "" {
		return "", "", fmt.Errorf("go mod download github.com/cilium/cilium@%s: no go.mod in %q", CiliumVersion, out)
	}
	replaces, err := moduleReplaces(mod.GoMod)
	if err != nil {
		return "", "", err
	}
	var gomod strings.Builder
	fmt.Fprintf(&gomod, "module hubblerelaybuild\n\ngo 1.26\n\nrequire github.com/cilium/cilium %s\n", CiliumVersion)
	if len(replaces) > 0 {
		gomod.WriteString("\nreplace (\n")
		for _, r := range replaces {
			fmt.Fprintf(&gomod, "\t%s\n", r)
		}
		gomod.WriteString(")\n")
	}
	if err := d.WriteFile("go.mod", gomod.String()); err != nil {
		return "", "", err
	}
	tools := "//go:build tools\n\npackage tools\n\nimport (\n"
	for _, name := range []string{"hubble", "hubble-relay"} {
		tools += "\t_ \"" + programs[name] + "\"\n"
	}
	tools += ")\n"
	if err := d.WriteFile("tools.go", tools); err != nil {
		return "", "", err
	}
	if _, err := d.Go("mod", "tidy"); err != nil {
		return "", "", err
	}
	for _, name := range []string{"hubble-relay", "hubble"} {
		if _, err := d.Build(name, programs[name]); err != nil {
			return "", "", err
		}
	}
	return relay, cli, nil
}

// forkReplacements are Cilium's replacements of modules by its own forks
// that the module proxy does not serve, and what this build takes
// instead: the upstream version the fork was made from. The fork of
// k8s.io/apimachinery adds `omitzero` support to conversions, which the
// relay and the CLI do not use.
var forkReplacements = map[string]string{
	"k8s.io/apimachinery": "k8s.io/apimachinery v0.33.3",
}

var replaceLine = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^\s*replace\s+(\S+)\s+=>\s+(\S+)\s+(\S+)\s*$`)
})

// moduleReplaces are the replace directives of the go.mod at path, as
// "old => new version" lines: a module's replace directives apply only
// when it is the main module, so the build module repeats them (those of
// forkReplacements changed).
func moduleReplaces(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		m := replaceLine().FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		if r, ok := forkReplacements[m[1]]; ok {
			out = append(out, m[1]+" => "+r)
			continue
		}
		out = append(out, m[1]+" => "+m[2]+" "+m[3])
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, errors.New(path + " has no replace directive: not github.com/cilium/cilium's go.mod?")
	}
	return out, nil
}
