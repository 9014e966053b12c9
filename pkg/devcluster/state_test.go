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
	web := Pod{Name: "web", Namespace: DefaultNamespace, Node: "node-1"}
	prodWeb := Pod{Name: "web", Namespace: "prod", Node: "node-2"}
	web.NetNS, prodWeb.NetNS = podNetNS("dev", web), podNetNS("dev", prodWeb)
	good.Pods = []Pod{web, prodWeb}
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
	// Two pods of one name in two namespaces, each named by its Ref.
	if p, err := c.Pod("prod/web"); err != nil || p.Node != "node-2" || p.NetNS != "/var/run/netns/cellium-dev.pod.prod.web" {
		t.Fatalf("Pod(prod/web) = %+v, %v", p, err)
	}
	if p, err := c.Pod("web"); err != nil || p.Node != "node-1" || p.NetNS != "/var/run/netns/cellium-dev.pod.web" || p.Ref() != "web" {
		t.Fatalf("Pod(web) = %+v, %v", p, err)
	}
	if _, err := c.Pod("test/web"); err == nil || !strings.Contains(err.Error(), `no pod "test/web"`) {
		t.Fatalf("Pod(test/web) = %v, want no such pod", err)
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
		{name: "pod namespace", change: func(s *state) { s.Pods[1].NetNS = podNetNS("dev", Pod{Name: "web", Namespace: DefaultNamespace}) }, want: `invalid pod "prod/web"`},
		{name: "bad namespace", change: func(s *state) { s.Pods[1].Namespace = "../x" }, want: `invalid pod "../x/web"`},
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
	cni := filepath.Join(t.TempDir(), "cellium-cni")
	if err := os.WriteFile(cni, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	bins := Options{AgentBinary: bin, CNIBinary: cni, EtcdBinary: bin}
	withMode := func(mode, kubeAPIServer string) Options {
		o := bins
		o.IdentityMode, o.KubeAPIServerBinary = mode, kubeAPIServer
		return o
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
		{withMode("etcd", ""), `invalid identity allocation mode "etcd": want kvstore or crd`},
		{withMode("crd", filepath.Dir(bin)), "kube-apiserver binary " + filepath.Dir(bin) + " is not an executable file"},
	} {
		if err := tc.o.complete(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Options %+v: %v, want %q", tc.o, err, tc.want)
		}
	}
}

// TestDecodeYAML: a manifest's documents become objects; one that is no
// object is an error naming the file and the document.
func TestDecodeYAML(t *testing.T) {
	objs, err := decodeYAML("web.yaml", []byte("apiVersion: v1\nkind: Service\nmetadata: {name: web}\n---\n# nothing\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: x}\n"))
	if err != nil || len(objs) != 2 || objs[0].GetKind() != "Service" || objs[1].GetName() != "x" {
		t.Fatalf("decodeYAML = %v, %v; want a Service and a Namespace", objs, err)
	}
	for doc, want := range map[string]string{
		"apiVersion: v1\nkind: Service\n---\nkind: Pod\n": "web.yaml document 1: not a Kubernetes object",
		"a: [1\n": "web.yaml document 1: ",
	} {
		if _, err := decodeYAML("web.yaml", []byte(doc)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("decodeYAML(%q) = %v, want %q", doc, err, want)
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

func TestCheckPod(t *testing.T) {
	ok := PodSpec{Name: "a", Namespace: "x", Labels: map[string]string{"pod": "a"},
		Ports: []ContainerPort{{Name: "serve-80-tcp", Port: 80, Protocol: "TCP"}, {Port: 81, Protocol: "SCTP"}}}
	if err := checkPod(ok); err != nil {
		t.Fatalf("checkPod(%+v) = %v", ok, err)
	}
	for _, tc := range []struct {
		change func(*PodSpec)
		want   string
	}{
		{func(s *PodSpec) { s.Name = "A" }, `invalid pod name "A"`},
		{func(s *PodSpec) { s.Namespace = "x.y" }, `invalid namespace "x.y"`},
		{func(s *PodSpec) { s.Labels = map[string]string{"a b": "c"} }, `invalid label key "a b"`},
		{func(s *PodSpec) { s.Ports = []ContainerPort{{Port: 80, Protocol: "ICMP"}} }, `invalid protocol "ICMP" of port 80`},
		{func(s *PodSpec) { s.Ports = []ContainerPort{{Port: 0, Protocol: "TCP"}} }, `want a port from 1 to 65535`},
		{func(s *PodSpec) {
			s.Ports = []ContainerPort{{Name: "a-very-long-port-name", Port: 80, Protocol: "TCP"}}
		}, `invalid port name "a-very-long-port-name"`},
		{func(s *PodSpec) {
			s.Ports = []ContainerPort{{Name: "http", Port: 80, Protocol: "TCP"}, {Name: "http", Port: 81, Protocol: "TCP"}}
		}, `invalid port name "http": given twice`},
	} {
		spec := ok
		tc.change(&spec)
		if err := checkPod(spec); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("checkPod(%+v) = %v, want %q", spec, err, tc.want)
		}
	}
}

// A pod's manifest has its namespace, labels and named container ports,
// which NetworkPolicies' named ports resolve on.
func TestPodObject(t *testing.T) {
	p := Pod{Name: "a", Namespace: "x", Node: "node-1", Labels: map[string]string{"pod": "a"},
		Ports: []ContainerPort{{Name: "serve-80-udp", Port: 80, Protocol: "UDP"}, {Port: 81, Protocol: "TCP"}}}
	got, err := json.Marshal(podObject(p))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"apiVersion":"v1","kind":"Pod","metadata":{"labels":{"pod":"a"},"name":"a","namespace":"x"},` +
		`"spec":{"containers":[{"image":"none","name":"main","ports":[{"containerPort":80,"name":"serve-80-udp","protocol":"UDP"},{"containerPort":81,"protocol":"TCP"}]}],"nodeName":"node-1"}}`
	if string(got) != want {
		t.Errorf("podObject = %s\nwant        %s", got, want)
	}
	if m := podManifest(p); m != "pod.x.a.yaml" {
		t.Errorf("podManifest = %s", m)
	}
	if m := podManifest(Pod{Name: "a", Namespace: DefaultNamespace}); m != "pod.a.yaml" {
		t.Errorf("podManifest in default = %s", m)
	}
}
