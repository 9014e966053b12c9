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
	"slices"
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
	// created are the bodies of the PUTs (ADDs), each answered with an
	// endpoint of 10.0.0.2.
	created []apiv1.EndpointCreate
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
	case r.Method == http.MethodPut && isEndpoint:
		var in apiv1.EndpointCreate
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			json.NewEncoder(w).Encode(apiv1.Error{Message: err.Error()})
			return
		}
		a.created = append(a.created, in)
		json.NewEncoder(w).Encode(apiv1.Endpoint{ID: 1, ContainerID: cid, Netns: in.Netns, Interface: in.Interface,
			IPv4: "10.0.0.2", IPv4Gateway: "10.0.0.1", HostInterface: "lxc0"})
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

// An ADD sends the agent the pod's namespace, name and UID from CNI_ARGS
// (K8S_POD_UID, as containerd and CRI-O send it), and no UID when the
// runtime sent none.
func TestAddSendsPodUID(t *testing.T) {
	a := newStandInAgent(t)
	for _, args := range []string{
		"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=pod-a;K8S_POD_UID=6f1c-uid",
		"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0",
	} {
		if err := cmdAdd(&cmdArgs{ContainerID: "pod-a", IfName: "eth0", Netns: "/var/run/netns/x", Args: args, StdinData: a.conf("")}); err != nil {
			t.Fatalf("ADD with CNI_ARGS %q: %v", args, err)
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	want := []apiv1.EndpointCreate{
		{Netns: "/var/run/netns/x", Interface: "eth0", PodNamespace: "default", PodName: "web-0", PodUID: "6f1c-uid"},
		{Netns: "/var/run/netns/x", Interface: "eth0", PodNamespace: "default", PodName: "web-0"},
	}
	if !slices.Equal(a.created, want) {
		t.Fatalf("the agent was sent %+v, want %+v", a.created, want)
	}
}
