package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/cellium/cellium/cells/endpointmanager"
)

// The agent's CNI configuration and the plugin's answers work with the CNI
// libraries runtimes link: the current one (v1.3, CNI 1.1), which takes
// 1.1.0 from the list's "cniVersions", and v1.1.2 (containerd 1.7), which
// knows "cniVersion" only and cannot parse a 1.1.0 result. A pod is added,
// checked and deleted through each, and each gets a result of its version.
func TestRuntimeLibraries(t *testing.T) {
	n := newNode(t)
	n.start()
	conflist := filepath.Join(n.dir, "net.d", endpointmanager.CNIConfFile)

	t.Run("current", func(t *testing.T) {
		list := n.conflist()
		if list.CNIVersion != "1.1.0" {
			t.Fatalf("the current library reads version %q from the configuration, want 1.1.0 from its cniVersions:\n%s", list.CNIVersion, list.Bytes)
		}
		p := n.newPod("current")
		ctx := context.Background()
		res, err := n.cni.AddNetworkList(ctx, list, p.runtimeConf())
		if err != nil {
			t.Fatalf("CNI ADD: %v", err)
		}
		if v4, _ := resultAddrs(t, res); res.Version() != "1.1.0" || !n.v4.Contains(v4) {
			t.Fatalf("CNI ADD result of version %s with %s, want 1.1.0 with an address in %s", res.Version(), v4, n.v4)
		}
		if err := n.cni.CheckNetworkList(ctx, list, p.runtimeConf()); err != nil {
			t.Errorf("CNI CHECK: %v", err)
		}
		if err := n.cni.DelNetworkList(ctx, list, p.runtimeConf()); err != nil {
			t.Errorf("CNI DEL: %v", err)
		}
	})

	t.Run("v1.1.2", func(t *testing.T) {
		prog := buildLibcni112(t)
		p := n.newPod("libcni112")
		var stdout, stderr bytes.Buffer
		cmd := exec.Command(prog, "-conf", conflist, "-bin", binDir, "-cache", t.TempDir(), "-id", p.id, "-netns", p.ns.Path())
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("libcni v1.1.2 program: %v\n%s", err, stderr.String())
		}
		var r struct {
			ListVersion, ListError, AddError, CheckError, DelError string
			Result                                                 struct {
				CNIVersion string `json:"cniVersion"`
				IPs        []struct {
					Address string `json:"address"`
				} `json:"ips"`
			}
		}
		if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
			t.Fatalf("libcni v1.1.2 program printed %q: %v", stdout.String(), err)
		}
		if r.ListError != "" {
			t.Fatalf("libcni v1.1.2 cannot read the agent's configuration: %s", r.ListError)
		}
		if r.AddError != "" {
			t.Fatalf("CNI ADD through libcni v1.1.2 (configuration version %s): %s", r.ListVersion, r.AddError)
		}
		if r.ListVersion != "1.0.0" {
			t.Errorf("libcni v1.1.2 reads the configuration as version %q, want 1.0.0", r.ListVersion)
		}
		if r.Result.CNIVersion != "1.0.0" || len(r.Result.IPs) == 0 || !n.v4.Contains(netip.MustParsePrefix(r.Result.IPs[0].Address).Addr()) {
			t.Fatalf("CNI ADD result through libcni v1.1.2 = %+v, want version 1.0.0 with an address in %s", r.Result, n.v4)
		}
		if r.CheckError != "" || r.DelError != "" {
			t.Errorf("through libcni v1.1.2: CHECK %q, DEL %q", r.CheckError, r.DelError)
		}
	})

	if eps := n.endpoints(); len(eps) != 0 {
		t.Errorf("endpoints after both DELs: %+v", eps)
	}
}

// buildLibcni112 builds testdata/libcni-v1.1.2, a runtime's side of CNI
// with the library at v1.1.2, a module of its own. Without that version
// in the module cache or from the module proxy, the test skips.
func buildLibcni112(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("testdata", "libcni-v1.1.2"))
	if err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly -buildvcs=false")
	download := exec.Command("go", "mod", "download", "github.com/containernetworking/cni")
	download.Dir, download.Env = dir, env
	if out, err := download.CombinedOutput(); err != nil {
		t.Skipf("the CNI library v1.1.2 cannot be had (module cache, module proxy): %v\n%s", err, out)
	}
	prog := filepath.Join(t.TempDir(), "libcni112")
	build := exec.Command("go", "build", "-o", prog, ".")
	build.Dir, build.Env = dir, env
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", dir, err, out)
	}
	return prog
}
