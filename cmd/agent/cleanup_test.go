package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/hive/hivetest"

	"github.com/cellium/cellium/cells/bpfmaps/bpfmapstest"
	"github.com/cellium/cellium/cells/lbmaps"
	"github.com/cellium/cellium/cells/loader/socklbtest"
)

// TestCleanup runs `agent cleanup` on what a stopped datapath left pinned:
// links that keep the programs attached, and maps; and on the CNI
// configuration the agent wrote.
func TestCleanup(t *testing.T) {
	requireRoot(t)
	env := socklbtest.New(t)
	root := bpfmapstest.Root(t)
	var maps *lbmaps.Maps
	h := env.Datapath(root, &maps)
	log := hivetest.Logger(t)
	if err := h.Start(log, context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := h.Stop(log, context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := attachedConnect4(t, env.Cgroup); n != 1 {
		t.Fatalf("%d connect4 programs attached after the datapath stopped, want its pinned one", n)
	}

	// A flag the agent would refuse stops cleanup too, before it removes
	// anything.
	_, errOut, code := agentCmd(t, "cleanup", "--bpf-root", root, "--lb-algorithm", "bogus", "--cni-conf-dir", t.TempDir())
	if code == 0 || !strings.Contains(errOut, `invalid --lb-algorithm "bogus"`) {
		t.Fatalf("cleanup with a bad flag = %d: %s", code, errOut)
	}
	pinDir := filepath.Join(root, "cellium")
	if _, err := os.Stat(pinDir); err != nil {
		t.Fatalf("cleanup with a bad flag removed the pins: %v", err)
	}

	// Never the host's /etc/cni/net.d.
	cniDir := t.TempDir()
	conflist := filepath.Join(cniDir, "05-cellium.conflist")
	if err := os.WriteFile(conflist, []byte(`{"cniVersion":"1.1.0"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := agentCmd(t, "cleanup", "--bpf-root", root, "--cni-conf-dir", cniDir)
	if code != 0 {
		t.Fatalf("agent cleanup = %d: %s", code, errOut)
	}
	if !strings.HasPrefix(out, "removed CNI configuration "+conflist+"\n") {
		t.Errorf("cleanup does not start with the CNI configuration:\n%s", out)
	}
	if _, err := os.Stat(conflist); !os.IsNotExist(err) {
		t.Errorf("CNI configuration after cleanup: %v", err)
	}
	if n := strings.Count(out, "detached and removed link "); n != 8 {
		t.Errorf("cleanup detached %d links, want the 8 programs':\n%s", n, out)
	}
	for name := range maps.EBPF() {
		if !strings.Contains(out, "removed map "+filepath.Join(pinDir, name)+"\n") {
			t.Errorf("cleanup does not report map %s:\n%s", name, out)
		}
	}
	if !strings.HasSuffix(out, "removed pin directory "+pinDir+"\n") {
		t.Errorf("cleanup does not end with the pin directory:\n%s", out)
	}
	if _, err := os.Stat(pinDir); !os.IsNotExist(err) {
		t.Fatalf("pin directory after cleanup: %v", err)
	}
	if n := attachedConnect4(t, env.Cgroup); n != 0 {
		t.Fatalf("%d connect4 programs attached after cleanup, want none", n)
	}

	out, _, code = agentCmd(t, "cleanup", "--bpf-root", root, "--cni-conf-dir", cniDir)
	if code != 0 || out != "Nothing to remove in "+pinDir+"\n" {
		t.Fatalf("second cleanup = %d: %q", code, out)
	}
}

func attachedConnect4(t *testing.T, cgroup string) int {
	t.Helper()
	cg, err := os.Open(cgroup)
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Close()
	res, err := link.QueryPrograms(link.QueryOptions{Target: int(cg.Fd()), Attach: ebpf.AttachCGroupInet4Connect})
	if err != nil {
		t.Fatal(err)
	}
	return len(res.Programs)
}
