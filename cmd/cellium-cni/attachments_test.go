package main

// The plugin's DEL and GC against a stand-in for the agent on a unix
// socket: it holds endpoints, answers DELETE as the agent does (by
// container, only for the interface named by ?interface= when given) and
// records what it was sent. It lists every endpoint it holds, whatever
// ?cni= says, as an agent that does not leave out its own would.

import (
	"encoding/json"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/cellium/cellium/pkg/apiv1"
)

type standInAgent struct {
	socket string
	mu     sync.Mutex
	eps    []apiv1.Endpoint
	// fail are containers whose DELETE fails (500).
	fail map[string]bool
	// deleted are the request URIs of the DELETEs that removed an
	// endpoint; requests are all the DELETEs.
	deleted, requests []string
}

func newStandInAgent(t *testing.T, eps ...apiv1.Endpoint) *standInAgent {
	t.Helper()
	a := &standInAgent{socket: filepath.Join(t.TempDir(), "agent.sock"), eps: eps, fail: map[string]bool{}}
	ln, err := net.Listen("unix", a.socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(a.serve)}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return a
}

func (a *standInAgent) serve(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	notFound := func(msg string) {
		w.WriteHeader(http.StatusNotFound)
		json.NewEncoder(w).Encode(apiv1.Error{Message: msg})
	}
	cid, isEndpoint := strings.CutPrefix(r.URL.Path, apiv1.PathEndpoints+"/"+apiv1.ContainerIDPrefix)
	switch {
	case r.Method == http.MethodGet && r.URL.Path == apiv1.PathEndpoints:
		json.NewEncoder(w).Encode(a.eps)
	case r.Method == http.MethodDelete && isEndpoint:
		a.requests = append(a.requests, r.URL.RequestURI())
		if a.fail[cid] {
			w.WriteHeader(http.StatusInternalServerError)
			json.NewEncoder(w).Encode(apiv1.Error{Message: "remove the veth pair of " + cid + ": injected failure"})
			return
		}
		for i, ep := range a.eps {
			if ep.ContainerID != cid {
				continue
			}
			if ifName := r.URL.Query().Get(apiv1.QueryInterface); ifName != "" && ifName != ep.Interface {
				notFound("container " + cid + " has no endpoint with interface " + ifName)
				return
			}
			a.eps = append(a.eps[:i], a.eps[i+1:]...)
			a.deleted = append(a.deleted, r.URL.RequestURI())
			json.NewEncoder(w).Encode(apiv1.EndpointDeleted{Endpoint: &ep})
			return
		}
		notFound("container " + cid + " has no endpoint")
	default:
		notFound("no route")
	}
}

// containers are the container IDs of the endpoints it still holds.
func (a *standInAgent) containers() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for _, ep := range a.eps {
		out = append(out, ep.ContainerID)
	}
	return out
}

func (a *standInAgent) conf(extra string) []byte {
	return []byte(`{"cniVersion":"1.1.0","name":"cellium","type":"cellium-cni","socket":"` + a.socket + `"` + extra + `}`)
}

// A DEL names an attachment, (CNI_CONTAINERID, CNI_IFNAME): a DEL of
// (pod-a, net1) leaves the endpoint of (pod-a, eth0) alone and succeeds;
// a DEL of (pod-a, eth0) deletes it.
func TestDelOfAnotherInterfaceKeepsEndpoint(t *testing.T) {
	a := newStandInAgent(t, apiv1.Endpoint{ID: 2, ContainerID: "pod-a", Interface: "eth0"})
	del := func(ifName string) {
		t.Helper()
		if err := cmdDel(&cmdArgs{ContainerID: "pod-a", IfName: ifName, Netns: "/var/run/netns/x", StdinData: a.conf("")}); err != nil {
			t.Fatalf("DEL of (pod-a, %s): %v", ifName, err)
		}
	}
	del("net1")
	if got := a.containers(); len(got) != 1 {
		t.Fatalf("DEL of (pod-a, net1) deleted the endpoint of (pod-a, eth0): sent %v", a.requests)
	}
	del("eth0")
	if got := a.containers(); len(got) != 0 || a.deleted[0] != "/v1/endpoints/container-id:pod-a?interface=eth0" {
		t.Fatalf("DEL of (pod-a, eth0): endpoints left %v, deleted %v", got, a.deleted)
	}
}

// GC leaves alone what no runtime attached: the node's health endpoint
// (container ID cellium-node-health), which every agent with
// --cluster-health-port has, also when the agent lists it.
func TestGCKeepsHealthEndpoint(t *testing.T) {
	a := newStandInAgent(t,
		apiv1.Endpoint{ID: 1, ContainerID: "cellium-node-health", Interface: "eth0", Health: true},
		apiv1.Endpoint{ID: 2, ContainerID: "pod-a", Interface: "eth0"},
		apiv1.Endpoint{ID: 3, ContainerID: "pod-gone", Interface: "eth0"})
	if err := cmdGC(&cmdArgs{StdinData: a.conf(`,"cni.dev/valid-attachments":[{"containerID":"pod-a","ifname":"eth0"}]`)}); err != nil {
		t.Fatalf("GC: %v", err)
	}
	if got := strings.Join(a.containers(), " "); got != "cellium-node-health pod-a" {
		t.Fatalf("after GC with pod-a/eth0 valid the agent has %q, want the health endpoint and pod-a's (sent %v)", got, a.requests)
	}
}

// A failed deletion does not stop GC: the other stale endpoints go, and
// the error names every failure.
func TestGCGoesOnPastAFailedDelete(t *testing.T) {
	a := newStandInAgent(t,
		apiv1.Endpoint{ID: 1, ContainerID: "gone-1", Interface: "eth0"},
		apiv1.Endpoint{ID: 2, ContainerID: "gone-2", Interface: "eth0"},
		apiv1.Endpoint{ID: 3, ContainerID: "gone-3", Interface: "eth0"},
		apiv1.Endpoint{ID: 4, ContainerID: "kept", Interface: "eth0"})
	a.fail["gone-1"], a.fail["gone-3"] = true, true
	err := cmdGC(&cmdArgs{StdinData: a.conf(`,"cni.dev/valid-attachments":[{"containerID":"kept","ifname":"eth0"}]`)})
	if got := strings.Join(a.containers(), " "); got != "gone-1 gone-3 kept" {
		t.Errorf("after GC the agent has %q, want the two that failed and kept (sent %v)", got, a.requests)
	}
	perr, ok := err.(*pluginError)
	if !ok || perr.Code != errAgentRefused || !strings.Contains(perr.Msg, "2 stale endpoint(s)") ||
		!strings.Contains(perr.Details, "gone-1") || !strings.Contains(perr.Details, "gone-3") {
		t.Fatalf("GC error = %#v, want code %d naming gone-1 and gone-3", err, errAgentRefused)
	}
}
