package endpointmanager_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/pkg/apiv1"
	"github.com/cellium/cellium/pkg/client"
)

func wantAPIError(t *testing.T, err error, status int, msg string) {
	t.Helper()
	apiErr, ok := errors.AsType[*client.APIError](err)
	if !ok || apiErr.Status != status || !strings.Contains(apiErr.Message, msg) {
		t.Fatalf("got %v, want an API error %d containing %q", err, status, msg)
	}
}

func TestAPI(t *testing.T) {
	tn := newTestNet(t)
	n := tn.start(t, nodeOpts{})
	c, ctx := n.client, context.Background()
	p := newPod(t)
	create := apiv1.EndpointCreate{Netns: p.ns.Path(), Interface: "eth0", PodNamespace: "default", PodName: "web"}

	ep, err := c.CreateEndpoint(ctx, p.id, create)
	if err != nil {
		t.Fatal(err)
	}
	if ep.ID != 1 || ep.ContainerID != p.id || ep.IPv4 != nth(tn.v4, 1).String() || ep.IPv4Gateway != router(tn.v4).String() ||
		ep.IPv6Gateway != router(tn.v6).String() || ep.Interface != "eth0" || ep.State != apiv1.EndpointReady || ep.PodName != "web" {
		t.Fatalf("PUT answer = %+v", ep)
	}
	_, err = c.CreateEndpoint(ctx, p.id, create)
	wantAPIError(t, err, http.StatusConflict, "already has endpoint 1")

	for _, id := range []string{"1", client.ContainerEndpointID(p.id)} {
		got, err := c.Endpoint(ctx, id)
		if err != nil || got.ID != 1 || got.IPv6 != ep.IPv6 {
			t.Fatalf("GET %s = %+v, %v", id, got, err)
		}
	}
	list, err := c.Endpoints(ctx)
	if err != nil || len(list) != 1 || list[0].ContainerID != p.id {
		t.Fatalf("GET /v1/endpoints = %+v, %v", list, err)
	}
	check, err := c.CheckEndpoint(ctx, "1")
	if err != nil || len(check.Problems) != 0 {
		t.Fatalf("check = %+v, %v; want no problems", check, err)
	}

	_, err = c.Endpoint(ctx, "2")
	wantAPIError(t, err, http.StatusNotFound, "no endpoint 2")
	_, err = c.Endpoint(ctx, "web")
	wantAPIError(t, err, http.StatusBadRequest, `invalid endpoint "web": want an endpoint ID (1 to 65535) or container-id:<container ID>`)
	_, err = c.Endpoint(ctx, "container-id:-x")
	wantAPIError(t, err, http.StatusBadRequest, `invalid container ID "-x"`)
	err = c.Do(ctx, http.MethodPut, apiv1.PathEndpoints+"/7", nil, create, nil)
	wantAPIError(t, err, http.StatusBadRequest, "takes container-id:<container ID>")
	other := create
	other.ContainerID = "someone-else"
	_, err = c.CreateEndpoint(ctx, "another", other)
	wantAPIError(t, err, http.StatusBadRequest, `containerID "someone-else" in the body is not the "another" of the path`)
	err = c.Do(ctx, http.MethodPut, apiv1.PathEndpoints+"/container-id:another", nil, map[string]string{"netns": "/x", "ifname": "eth0"}, nil)
	wantAPIError(t, err, http.StatusBadRequest, `invalid body: json: unknown field "ifname"`)
	_, err = c.ReleaseIP(ctx, ep.IPv4)
	wantAPIError(t, err, http.StatusConflict, "is in use by the endpoint of container")

	deleted, err := c.DeleteEndpoint(ctx, client.ContainerEndpointID(p.id))
	if err != nil || deleted.Endpoint == nil || deleted.Endpoint.ID != 1 || len(deleted.ReleasedIPs) != 2 {
		t.Fatalf("DELETE = %+v, %v", deleted, err)
	}
	_, err = c.DeleteEndpoint(ctx, client.ContainerEndpointID(p.id))
	wantAPIError(t, err, http.StatusNotFound, "container "+p.id+" has no endpoint")
}

// The agent writes the CNI configuration that points the plugin at its
// socket, readable by the runtime, once it is ready.
func TestCNIConfig(t *testing.T) {
	tn := newTestNet(t)
	tn.start(t, nodeOpts{})
	path := filepath.Join(tn.dir, "net.d", "05-cellium.conflist")
	var data []byte
	celltest.Eventually(t, "the CNI configuration", func() (bool, string) {
		var err error
		data, err = os.ReadFile(path)
		return err == nil, fmt.Sprint(err)
	})
	var conf struct {
		CNIVersion  string   `json:"cniVersion"`
		CNIVersions []string `json:"cniVersions"`
		Name        string   `json:"name"`
		Plugins     []struct {
			Type   string `json:"type"`
			Socket string `json:"socket"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(data, &conf); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if conf.CNIVersion != "1.0.0" || !slices.Equal(conf.CNIVersions, []string{"1.0.0", "1.1.0"}) || conf.Name != "cellium" || len(conf.Plugins) != 1 ||
		conf.Plugins[0].Type != "cellium-cni" || conf.Plugins[0].Socket != filepath.Join(tn.dir, "agent.sock") {
		t.Fatalf("CNI configuration = %s", data)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o644 {
		t.Fatalf("CNI configuration mode = %v, want 0644", fi.Mode())
	}
}

// A DELETE with ?interface= names an attachment (a CNI DEL's container and
// CNI_IFNAME): the container's endpoint with another interface stays and
// the answer is 404, which the plugin takes as done; with its own
// interface, or without the parameter (callers before it), the endpoint is
// deleted.
func TestDeleteNamesTheAttachment(t *testing.T) {
	tn := newTestNet(t)
	n := tn.start(t, nodeOpts{})
	c, ctx := n.client, context.Background()
	path := apiv1.EndpointPath(apiv1.ContainerIDPrefix)
	del := func(id, ifName string) (apiv1.EndpointDeleted, error) {
		var out apiv1.EndpointDeleted
		q := url.Values{}
		if ifName != "" {
			q.Set(apiv1.QueryInterface, ifName)
		}
		err := c.Do(ctx, http.MethodDelete, path+id, q, nil, &out)
		return out, err
	}
	a, b := newPod(t), newPod(t)
	epA, epB := n.create(t, a), n.create(t, b)

	_, err := del(a.id, "net1")
	wantAPIError(t, err, http.StatusNotFound, "container "+a.id+" has no endpoint with interface net1 (its endpoint's interface is eth0)")
	if _, found := n.mgr.Lookup(endpointmanager.Selector{ContainerID: a.id}); !found {
		t.Fatal("a DELETE of interface net1 deleted the container's endpoint with eth0")
	}
	if _, err := netlink.LinkByName(epA.HostIfName); err != nil {
		t.Fatalf("a DELETE of interface net1 removed the endpoint's veth pair: %v", err)
	}
	_, err = del(a.id, "bad/name")
	wantAPIError(t, err, http.StatusBadRequest, `invalid interface name "bad/name"`)
	err = c.Do(ctx, http.MethodDelete, apiv1.EndpointPath("1"), url.Values{apiv1.QueryInterface: {"eth0"}}, nil, nil)
	wantAPIError(t, err, http.StatusBadRequest, "interface= goes with container-id:<container ID>")

	if d, err := del(a.id, "eth0"); err != nil || d.Endpoint == nil || d.Endpoint.ID != epA.ID {
		t.Fatalf("DELETE of (%s, eth0) = %+v, %v", a.id, d, err)
	}
	if d, err := del(b.id, ""); err != nil || d.Endpoint == nil || d.Endpoint.ID != epB.ID {
		t.Fatalf("DELETE of %s without an interface = %+v, %v", b.id, d, err)
	}
}

// GET /v1/endpoints?cni=true leaves out the node's health endpoint, which
// no runtime attached: a CNI GC must not delete it.
func TestListCNIEndpoints(t *testing.T) {
	tn := newTestNet(t)
	n := tn.start(t, nodeOpts{})
	c, ctx := n.client, context.Background()
	healthPod, p := newPod(t), newPod(t)
	if _, err := n.mgr.Create(ctx, endpointmanager.CreateRequest{ContainerID: "cellium-node-health", Netns: healthPod.ns.Path(), IfName: "eth0", Health: true}); err != nil {
		t.Fatal(err)
	}
	n.create(t, p)
	list := func(cni string) ([]string, error) {
		var eps []apiv1.Endpoint
		err := c.Do(ctx, http.MethodGet, apiv1.PathEndpoints, url.Values{apiv1.QueryCNI: {cni}}, nil, &eps)
		var out []string
		for _, ep := range eps {
			out = append(out, ep.ContainerID)
		}
		return out, err
	}
	if got, err := list("true"); err != nil || !slices.Equal(got, []string{p.id}) {
		t.Errorf("GET ?cni=true = %v, %v; want only %s", got, err, p.id)
	}
	if got, err := list("false"); err != nil || !slices.Equal(got, []string{"cellium-node-health", p.id}) {
		t.Errorf("GET ?cni=false = %v, %v; want both", got, err)
	}
	_, err := list("yes")
	wantAPIError(t, err, http.StatusBadRequest, `invalid cni="yes": want true or false`)
}
