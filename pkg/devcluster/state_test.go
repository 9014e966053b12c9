package devcluster

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// cluster.json that is damaged, or names paths that are not the cluster's,
// is refused with an error naming the file, so Down never removes what
// the cluster did not make.
func TestLoadBadState(t *testing.T) {
	dir := t.TempDir()
	if _, err := Load(dir, nil); !errors.Is(err, ErrNoCluster) {
		t.Fatalf("Load of an empty directory = %v, want ErrNoCluster", err)
	}
	good := plan(Options{Name: "dev", Dir: dir, Nodes: 2, BPFRoot: "/sys/fs/bpf"}, "/sys/fs/cgroup")
	good.Pods = []Pod{{Name: "web", Node: "node-1", NetNS: podNetNS("dev", "web")}}
	if err := good.save(); err != nil {
		t.Fatal(err)
	}
	c, err := Load(dir, nil)
	if err != nil {
		t.Fatalf("Load of a good state: %v", err)
	}
	if got := c.Nodes(); len(got) != 2 || got[1].IPv4.String() != "10.90.0.12" {
		t.Fatalf("Load: nodes %+v", got)
	}

	for _, tc := range []struct {
		name   string
		change func(s *state)
		raw    string
		want   string
	}{
		{name: "not JSON", raw: "{", want: "unexpected EOF"},
		{name: "unknown field", raw: `{"version":1,"bogus":1}`, want: `unknown field "bogus"`},
		{name: "version", change: func(s *state) { s.Version = 9 }, want: "version 9, want 1"},
		{name: "name", change: func(s *state) { s.Name = "../x" }, want: `invalid cluster name "../x"`},
		{name: "moved", change: func(s *state) { s.Dir = "/elsewhere" }, want: "describes a cluster in /elsewhere"},
		{name: "node netns", change: func(s *state) { s.Nodes[0].NetNS = "/var/run/netns/other" }, want: "node node-1: its namespace"},
		{name: "node name", change: func(s *state) { s.Nodes[0].Name = "node-01" }, want: `invalid node name "node-01"`},
		{name: "cgroup", change: func(s *state) { s.Cgroup = "/sys/fs/cgroup/other" }, want: "is not the cluster's"},
		{name: "pod", change: func(s *state) { s.Pods[0].NetNS = "/var/run/netns/x" }, want: `invalid pod "web"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := []byte(tc.raw)
			if tc.change != nil {
				s := *good
				s.Nodes = append([]Node(nil), good.Nodes...)
				s.Pods = append([]Pod(nil), good.Pods...)
				tc.change(&s)
				data, _ = json.Marshal(&s)
			}
			if err := os.WriteFile(filepath.Join(dir, stateFile), data, 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := Load(dir, nil)
			if err == nil || !strings.Contains(err.Error(), "state file "+filepath.Join(dir, stateFile)) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Load = %v, want an error naming the file and %q", err, tc.want)
			}
		})
	}
}

func TestOptions(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "agent")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		o    Options
		want string
	}{
		{Options{Name: "Dev"}, `invalid cluster name "Dev"`},
		{Options{Name: "a-very-long-cluster-name-x"}, `invalid cluster name "a-very-long-cluster-name-x"`},
		{Options{Nodes: -1}, "invalid number of nodes -1: want 1 to 200"},
		{Options{Nodes: 201}, "invalid number of nodes 201"},
		{Options{AgentBinary: bin}, "CNI plugin " + filepath.Join(filepath.Dir(bin), "cellium-cni") + ": "},
		{Options{AgentBinary: bin, CNIBinary: bin}, "must be named cellium-cni"},
		{Options{AgentBinary: filepath.Dir(bin)}, "is not an executable file"},
	} {
		if err := tc.o.complete(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Options %+v: %v, want %q", tc.o, err, tc.want)
		}
	}
}

func TestManifestNames(t *testing.T) {
	for name, want := range map[string]string{
		"web.yaml":     "",
		"web.json":     "",
		"../web.yaml":  "want a file name",
		".web.yaml":    "want a file name",
		"web.txt":      "only .yaml, .yml and .json",
		"node.x.yaml":  "the cluster's own",
		"pod.web.yaml": "the cluster's own",
		"web.yaml.tmp": "only .yaml",
	} {
		err := checkManifestName(name)
		if (want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), want)) {
			t.Errorf("checkManifestName(%q) = %v, want %q", name, err, want)
		}
	}
}
