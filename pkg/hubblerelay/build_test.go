package hubblerelay

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The build module repeats Cilium's replace directives, with the forks
// the module proxy does not serve swapped for their upstream versions.
func TestModuleReplaces(t *testing.T) {
	gomod := filepath.Join(t.TempDir(), "go.mod")
	os.WriteFile(gomod, []byte(`module github.com/cilium/cilium

go 1.24.0

require (
	k8s.io/apimachinery v0.33.3
)

// A fork.
replace sigs.k8s.io/controller-tools => github.com/cilium/controller-tools v0.16.5-1

replace k8s.io/apimachinery => github.com/cilium/apimachinery v0.33.3-1
`), 0o644)
	got, err := moduleReplaces(gomod)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"sigs.k8s.io/controller-tools => github.com/cilium/controller-tools v0.16.5-1",
		"k8s.io/apimachinery => k8s.io/apimachinery v0.33.3",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("replaces %q, want %q", got, want)
	}

	os.WriteFile(gomod, []byte("module example.com/other\n"), 0o644)
	if _, err := moduleReplaces(gomod); err == nil || !strings.Contains(err.Error(), "no replace directive") {
		t.Fatalf("go.mod without replace: %v, want an error saying so", err)
	}
}

// Binaries says how to build what is missing, and takes the paths from
// the environment when set.
func TestBinaries(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	t.Setenv("HUBBLE_RELAY_BIN", "")
	t.Setenv("HUBBLE_BIN", "")
	if _, _, err := Binaries(); err == nil || !strings.Contains(err.Error(), "make hubble-relay") {
		t.Fatalf("Binaries without binaries: %v, want how to build them", err)
	}
	dir := t.TempDir()
	relay, cli := filepath.Join(dir, "relay"), filepath.Join(dir, "cli")
	for _, f := range []string{relay, cli} {
		os.WriteFile(f, nil, 0o755)
	}
	t.Setenv("HUBBLE_RELAY_BIN", relay)
	t.Setenv("HUBBLE_BIN", cli)
	if r, c, err := Binaries(); err != nil || r != relay || c != cli {
		t.Fatalf("Binaries = %s, %s, %v; want %s, %s", r, c, err, relay, cli)
	}
}
