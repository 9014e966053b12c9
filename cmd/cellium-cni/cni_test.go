package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	libversion "github.com/containernetworking/cni/pkg/version"

	"github.com/cellium/cellium/pkg/apiv1"
	"github.com/cellium/cellium/pkg/nettest"
)

// TestDispatch: the plugin's own CNI protocol (cni.go) refuses what the
// CNI library's skel refused, with its codes, before any command runs,
// and hands the command what the runtime passed. A CNI_NETNS that is the
// plugin's own network namespace is refused before an ADD (the library
// checked after it had run), unless CNI_NETNS_OVERRIDE says to go on; a
// DEL runs, to clean up (it makes nothing in CNI_NETNS).
func TestDispatch(t *testing.T) {
	pod := nettest.NewNS(t).Path()
	conf := `{"cniVersion":"1.0.0","name":"cellium","type":"cellium-cni"}`
	env := func(cmd string, kv ...string) map[string]string {
		m := map[string]string{"CNI_COMMAND": cmd, "CNI_CONTAINERID": "c1", "CNI_NETNS": pod, "CNI_IFNAME": "eth0", "CNI_PATH": "/opt/cni/bin"}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	for _, tc := range []struct {
		name  string
		env   map[string]string
		stdin string
		code  uint // 0: the command runs
		want  string
	}{
		{"ADD", env("ADD"), conf, 0, ""},
		{"missing variables", env("ADD", "CNI_NETNS", "", "CNI_PATH", ""), conf, 4, "required env variables [CNI_NETNS,CNI_PATH] missing"},
		{"DEL needs no netns", env("DEL", "CNI_NETNS", ""), conf, 0, ""},
		{"bad container ID", env("ADD", "CNI_CONTAINERID", "-c1"), conf, 4, "invalid characters in containerID"},
		{"interface with a slash", env("ADD", "CNI_IFNAME", "eth/0"), conf, 4, "interface name contains / or : or whitespace"},
		{"interface too long", env("ADD", "CNI_IFNAME", "eth0123456789abc"), conf, 4, "interface name is too long"},
		{"unknown command", env("FOO"), conf, 4, "unknown CNI_COMMAND: FOO"},
		{"stdin not JSON", env("ADD"), "{", 6, "error unmarshall network config"},
		{"no network name", env("ADD"), `{"cniVersion":"1.0.0","type":"cellium-cni"}`, 7, "missing network name"},
		{"bad network name", env("ADD"), `{"cniVersion":"1.0.0","name":"a b","type":"cellium-cni"}`, 7, "invalid characters found in network name"},
		{"old version", env("ADD"), `{"cniVersion":"0.4.0","name":"cellium","type":"cellium-cni"}`, 1, "incompatible CNI versions"},
		{"no version", env("ADD"), `{"name":"cellium","type":"cellium-cni"}`, 1, `config is "0.1.0"`},
		{"GC before 1.1.0", env("GC"), conf, 1, "config version does not allow GC"},
		{"STATUS before 1.1.0", env("STATUS"), conf, 1, "config version does not allow STATUS"},
		{"CHECK before 0.4.0", env("CHECK"), `{"cniVersion":"0.3.1","name":"cellium","type":"cellium-cni"}`, 1, "config version does not allow CHECK"},
		{"CHECK after the plugin's", env("CHECK"), `{"cniVersion":"2.0.0","name":"cellium","type":"cellium-cni"}`, 1, "plugin version does not allow CHECK"},
		{"CHECK of an unknown version", env("CHECK"), `{"cniVersion":"1.0.5","name":"cellium","type":"cellium-cni"}`, 1, "incompatible CNI versions"},
		{"CHECK of a version that does not parse", env("CHECK"), `{"cniVersion":"1.x.0","name":"cellium","type":"cellium-cni"}`, 6, `failed to convert minor version part "x"`},
		{"GC of a version that does not parse", env("GC"), `{"cniVersion":"one","name":"cellium","type":"cellium-cni"}`, 6, `failed to convert major version part "one"`},
		{"STATUS of a version with four parts", env("STATUS"), `{"cniVersion":"1.1.0.0","name":"cellium","type":"cellium-cni"}`, 6, `invalid version "1.1.0.0": too many parts`},
		{"ADD of a version that does not parse", env("ADD"), `{"cniVersion":"one","name":"cellium","type":"cellium-cni"}`, 1, "incompatible CNI versions"},
		{"STATUS", env("STATUS"), `{"cniVersion":"1.1.0","name":"cellium","type":"cellium-cni"}`, 0, ""},
		{"the plugin's own netns", env("ADD", "CNI_NETNS", "/proc/self/ns/net"), conf, 8, "plugin's netns and netns from CNI_NETNS should not be the same"},
		{"DEL in the plugin's own netns", env("DEL", "CNI_NETNS", "/proc/self/ns/net"), conf, 0, ""},
		{"overridden", env("ADD", "CNI_NETNS", "/proc/self/ns/net", "CNI_NETNS_OVERRIDE", "true"), conf, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ran *cmdArgs
			run := func(a *cmdArgs) error { ran = a; return nil }
			var stdout, stderr bytes.Buffer
			err := dispatch(handlers{Add: run, Del: run, Check: run, Status: run, GC: run}, "about",
				func(k string) string { return tc.env[k] }, strings.NewReader(tc.stdin), &stdout, &stderr)
			if tc.code == 0 {
				if err != nil {
					t.Fatalf("refused: %+v", err)
				}
				if ran == nil || ran.ContainerID != "c1" || ran.Netns != tc.env["CNI_NETNS"] || ran.IfName != "eth0" || string(ran.StdinData) != tc.stdin {
					t.Fatalf("the command got %+v", ran)
				}
				return
			}
			if err == nil || err.Code != tc.code || !strings.Contains(err.Msg+" "+err.Details, tc.want) {
				t.Fatalf("error %+v, want code %d containing %q", err, tc.code, tc.want)
			}
			if ran != nil {
				t.Fatalf("the command ran on refused input: %+v", ran)
			}
		})
	}

	var stdout bytes.Buffer
	if err := dispatch(handlers{}, "about", func(k string) string { return map[string]string{"CNI_COMMAND": "VERSION"}[k] },
		strings.NewReader(""), &stdout, &bytes.Buffer{}); err != nil || stdout.String() != `{"cniVersion":"1.1.0","supportedVersions":["1.0.0","1.1.0"]}`+"\n" {
		t.Errorf("VERSION = %q, %v", stdout.String(), err)
	}
	var stderr bytes.Buffer
	if err := dispatch(handlers{}, "CNI plugin cellium-cni", func(string) string { return "" },
		strings.NewReader(""), &bytes.Buffer{}, &stderr); err != nil || !strings.Contains(stderr.String(), "CNI protocol versions supported: 1.0.0, 1.1.0") {
		t.Errorf("no command: %q, %v; want the versions on stderr", stderr.String(), err)
	}
}

// TestLoadArgs: CNI_ARGS as the library read them: an unknown key is an
// error unless IgnoreUnknown is 1 or true (in any case: the library
// lowercased it), as a kubelet sends it.
func TestLoadArgs(t *testing.T) {
	for _, v := range []string{"1", "true", "True", "TRUE"} {
		if _, err := loadArgs("IgnoreUnknown=" + v + ";K8S_POD_INFRA_CONTAINER_ID=abc"); err != nil {
			t.Errorf("IgnoreUnknown=%s: %v", v, err)
		}
	}
	for _, v := range []string{"0", "false", "False", "FALSE"} {
		if _, err := loadArgs("IgnoreUnknown=" + v + ";K8S_POD_INFRA_CONTAINER_ID=abc"); err == nil || !strings.Contains(err.Error(), "unknown args") {
			t.Errorf("IgnoreUnknown=%s with an unknown key = %v, want unknown args", v, err)
		}
	}
	k, err := loadArgs("IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=0b1c-2d")
	if err != nil || k.K8S_POD_NAMESPACE != "default" || k.K8S_POD_NAME != "web-0" || k.K8S_POD_UID != "0b1c-2d" {
		t.Errorf("kubelet's CNI_ARGS = %+v, %v", k, err)
	}
	for args, want := range map[string]string{
		"K8S_POD_NAME=web-0;UNKNOWN=1": `ARGS: unknown args ["UNKNOWN=1"]`,
		"K8S_POD_NAME=a=b":             `ARGS: invalid pair "K8S_POD_NAME=a=b"`,
		"IgnoreUnknown=yes":            "boolean unmarshal error: invalid input yes",
		"IgnoreUnknown=YES":            "boolean unmarshal error: invalid input yes",
		";":                            `ARGS: invalid pair ""`,
	} {
		if _, err := loadArgs(args); err == nil || err.Error() != want && !strings.Contains(err.Error(), want) {
			t.Errorf("loadArgs(%q) = %v, want %q", args, err, want)
		}
	}
}

// TestResultReadsAsLibraryResult: the ADD's result, which the plugin
// writes itself, is what the CNI library (with which runtimes read it)
// reads as the endpoint's interfaces, addresses and default routes.
func TestResultReadsAsLibraryResult(t *testing.T) {
	ep := apiv1.Endpoint{Interface: "eth0", MAC: "02:11:22:33:44:55", Netns: "/var/run/netns/p", HostInterface: "lxc1", HostMAC: "02:aa:bb:cc:dd:ee",
		IPv4: "10.1.0.5", IPv4Gateway: "10.1.0.1", IPv6: "fd00::5", IPv6Gateway: "fd00::1"}
	r, err := resultOf(ep, "1.1.0")
	if err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	lib, err := current.NewResult(data)
	if err != nil {
		t.Fatalf("the library reads %s: %v", data, err)
	}
	got := lib.(*current.Result)
	if got.CNIVersion != "1.1.0" || len(got.Interfaces) != 2 || got.Interfaces[0].Name != "lxc1" || got.Interfaces[0].Mac != ep.HostMAC ||
		got.Interfaces[1].Name != "eth0" || got.Interfaces[1].Mac != ep.MAC || got.Interfaces[1].Sandbox != ep.Netns {
		t.Fatalf("interfaces of %s: %+v", data, got.Interfaces)
	}
	var ips, routes []string
	for _, ip := range got.IPs {
		if ip.Interface == nil || *ip.Interface != 1 {
			t.Errorf("address %s is not on the pod's interface (1)", ip.Address.String())
		}
		ips = append(ips, ip.Address.String()+" via "+ip.Gateway.String())
	}
	for _, rt := range got.Routes {
		routes = append(routes, rt.Dst.String()+" via "+rt.GW.String())
	}
	if strings.Join(ips, ",") != "10.1.0.5/32 via 10.1.0.1,fd00::5/128 via fd00::1" || strings.Join(routes, ",") != "0.0.0.0/0 via 10.1.0.1,::/0 via fd00::1" {
		t.Errorf("result %s: addresses %v, routes %v", data, ips, routes)
	}
}

// TestPrevResultAsLibrary: a CHECK's prevResult is accepted or refused as
// the CNI library's version.ParsePrevResult did: one without a cniVersion
// has the configuration's, and a 1.x configuration takes 1.x results only.
func TestPrevResultAsLibrary(t *testing.T) {
	for _, tc := range []struct{ conf, prev, want string }{
		{"1.0.0", `{"ips":[{"address":"10.1.0.5/32"}]}`, "10.1.0.5/32"},
		{"1.1.0", `{"ips":[{"address":"10.1.0.5/32"}]}`, "10.1.0.5/32"},
		{"1.0.0", `{"cniVersion":"1.1.0","ips":[{"address":"10.1.0.5/32"}]}`, "10.1.0.5/32"},
		{"1.1.0", `{"cniVersion":"1.0.0","ips":[{"address":"fd00::5/128"}]}`, "fd00::5/128"},
		{"1.0.0", `{"cniVersion":"0.4.0","ips":[{"address":"10.1.0.5/32"}]}`, ""},
		{"1.0.0", `{"cniVersion":"0.3.1","ips":[{"address":"10.1.0.5/32"}]}`, ""},
		{"1.0.0", `{"cniVersion":"2.0.0","ips":[{"address":"10.1.0.5/32"}]}`, ""},
	} {
		stdin := `{"cniVersion":"` + tc.conf + `","name":"cellium","type":"cellium-cni","prevResult":` + tc.prev + `}`
		var lib types.PluginConf
		if err := json.Unmarshal([]byte(stdin), &lib); err != nil {
			t.Fatal(err)
		}
		libErr := libversion.ParsePrevResult(&lib)
		_, addrs, err := parseConf([]byte(stdin))
		if (err == nil) != (libErr == nil) {
			t.Errorf("%s: plugin %v, library %v", stdin, err, libErr)
			continue
		}
		if err != nil {
			if e, ok := err.(*pluginError); !ok || e.Code != errDecodingFailure {
				t.Errorf("%s: %v, want code %d", stdin, err, errDecodingFailure)
			}
			continue
		}
		if len(addrs) != 1 || addrs[0].String() != tc.want {
			t.Errorf("%s: addresses %v, want %s", stdin, addrs, tc.want)
		}
	}
}
