package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// An ADD with TraceEnv set writes the times of its phases on stderr, in
// order and within the exec, and its result on stdout as without it; the
// agent's "Created endpoint" line says when the request was accepted and
// what it waited before the creation. The breakdown of BenchmarkAddParallel
// is made of these.
func TestAddTrace(t *testing.T) {
	n := newNode(t)
	n.start()
	conf := n.pluginConf("1.0.0")
	plugin := filepath.Join(binDir, "cellium-cni")
	env := func(p *pod) map[string]string {
		return map[string]string{"CNI_COMMAND": "ADD", "CNI_CONTAINERID": p.id, "CNI_NETNS": p.ns.Path(), "CNI_IFNAME": "eth0"}
	}

	p := n.newPod("traced")
	run, err := runPluginTimed(plugin, env(p), conf)
	if err != nil {
		t.Fatal(err)
	}
	tr := run.trace
	order := []time.Time{run.start, tr["main"], tr["sent"], tr["answered"], tr["printed"], run.exited}
	for i := 1; i < len(order); i++ {
		if order[i].Before(order[i-1]) || order[i].IsZero() {
			t.Fatalf("exec %v, trace %v, reaped %v: want main, sent, answered, printed in that order within the exec", run.start, tr, run.exited)
		}
	}
	var line map[string]any
	for _, l := range n.agent.lines("Created endpoint") {
		if l["container"] == p.id {
			line = l
		}
	}
	req, _ := line["request"].(map[string]any)
	accepted, err := time.Parse(time.RFC3339Nano, fmt.Sprint(req["accepted"]))
	if err != nil || accepted.Before(tr["main"]) || accepted.After(tr["answered"]) {
		t.Fatalf("the agent's line says the request was accepted at %v (%v): want it between the plugin's main %v and its answer %v",
			req["accepted"], err, tr["main"], tr["answered"])
	}
	queued, handler := msOf(req["queued"]), msOf(req["handler"])
	if _, ok := req["queued"].(float64); !ok || queued < 0 || handler < 0 || accepted.Add(time.Duration((queued+handler)*float64(time.Millisecond))).After(tr["answered"]) {
		t.Fatalf("request %v: want what it waited (queued, handler) before the answer", req)
	}

	// Without it, nothing on stderr, and the same result.
	q := n.newPod("untraced")
	cmd := pluginCmd(plugin, env(q), conf)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("ADD: %v: %s", err, stderr.String())
	}
	var result struct {
		IPs []struct{ Address string }
	}
	if stderr.Len() != 0 || json.Unmarshal(stdout.Bytes(), &result) != nil || len(result.IPs) == 0 {
		t.Fatalf("ADD without %s wrote stdout %q, stderr %q: want the result and nothing else", TraceEnv, stdout.String(), stderr.String())
	}
}

// TestPluginLinksNoHTTPStack: the plugin, which runs once per pod and often
// a hundred at once, links neither net/http nor the TLS and certificate
// code it brings: it spoke to the agent through net/http until it cost
// every exec twice its start and a third more CPU (pkg/unixhttp;
// docs/performance.md, "CNI ADD"). Nor does it link the CNI library,
// whose packages were 18 of its 102 and a fifth of its size.
func TestPluginLinksNoHTTPStack(t *testing.T) {
	list := exec.Command("go", "list", "-deps", ".")
	// As the image builds it (make image).
	list.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := list.Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	client := false
	for pkg := range strings.Lines(string(out)) {
		pkg = strings.TrimSpace(pkg)
		client = client || pkg == "github.com/cellium/cellium/pkg/unixhttp"
		switch {
		case pkg == "net/http", pkg == "crypto/tls", pkg == "crypto/x509":
			t.Errorf("the plugin links %s", pkg)
		// Nor the CNI library (cni.go), with its regular expressions,
		// result conversions and reflection-driven argument parser.
		case strings.HasPrefix(pkg, "github.com/containernetworking/"), pkg == "regexp", pkg == "log":
			t.Errorf("the plugin links %s", pkg)
		}
	}
	if !client {
		t.Fatalf("go list -deps of the plugin lacks pkg/unixhttp:\n%s", out)
	}
}
