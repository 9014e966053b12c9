package ipam_test

import (
	"context"
	"errors"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/hive"

	"github.com/cellium/cellium/cells/api"
	"github.com/cellium/cellium/cells/daemon"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/ipam"
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
	dir := t.TempDir()
	socket := filepath.Join(dir, "agent.sock")
	h := celltest.New(daemon.Cell, api.Cell, ipam.Cell)
	hive.AddConfigOverride(h, func(c *daemon.Config) { c.StateDir, c.RunDir = filepath.Join(dir, "state"), filepath.Join(dir, "run") })
	hive.AddConfigOverride(h, func(c *api.Config) { c.APISocket = socket })
	hive.AddConfigOverride(h, func(c *ipam.Config) { c.PodCIDR = []string{"10.244.0.0/30", "fd00:10:244::/120"} })
	celltest.Start(t, h)
	c := client.New(socket)
	ctx := context.Background()

	got, err := c.ReserveIP(ctx, apiv1.IPAMReserve{Owner: "ops", Family: "ipv4"})
	if err != nil || got.IP != "10.244.0.2" || got.State != apiv1.AllocationReserved || got.Owner != "ops" {
		t.Fatalf("reserve the next ipv4 address = %+v, %v; want 10.244.0.2 reserved for ops", got, err)
	}
	if _, err := c.ReserveIP(ctx, apiv1.IPAMReserve{Owner: "ops", IP: "fd00:10:244::20"}); err != nil {
		t.Fatal(err)
	}
	_, err = c.ReserveIP(ctx, apiv1.IPAMReserve{Owner: "ops", Family: "ipv4"})
	wantAPIError(t, err, http.StatusServiceUnavailable, "ipv4 pool 10.244.0.0/30 is exhausted: all 2 addresses are allocated")
	_, err = c.ReserveIP(ctx, apiv1.IPAMReserve{Owner: "other", IP: "fd00:10:244::20"})
	wantAPIError(t, err, http.StatusConflict, `address fd00:10:244::20 is already allocated to "ops" (reserved)`)
	_, err = c.ReserveIP(ctx, apiv1.IPAMReserve{Owner: "ops", IP: "10.0.0.1/24"})
	wantAPIError(t, err, http.StatusBadRequest, `invalid ip "10.0.0.1/24"`)
	_, err = c.ReserveIP(ctx, apiv1.IPAMReserve{Owner: "ops", IP: "fd00:10:244::21", Family: "ipv6"})
	wantAPIError(t, err, http.StatusBadRequest, "give either ip or family, not both")
	err = c.Do(ctx, http.MethodPost, apiv1.PathIPAM, nil, map[string]string{"ownr": "typo"}, nil)
	wantAPIError(t, err, http.StatusBadRequest, `invalid body: json: unknown field "ownr"`)

	status, err := c.IPAM(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !status.Ready || len(status.Pools) != 2 || status.Pools[0].CIDR != "10.244.0.0/30" || status.Pools[0].Used != 2 ||
		status.Pools[1].Router != "fd00:10:244::1" || status.Pools[1].Used != 2 || len(status.Allocations) != 4 {
		t.Fatalf("GET /v1/ipam = %+v", status)
	}

	released, err := c.ReleaseIP(ctx, "10.244.0.2")
	if err != nil || released.Owner != "ops" {
		t.Fatalf("release 10.244.0.2 = %+v, %v", released, err)
	}
	_, err = c.ReleaseIP(ctx, "10.244.0.2")
	wantAPIError(t, err, http.StatusNotFound, "address 10.244.0.2 is not allocated")
	_, err = c.ReleaseIP(ctx, "10.244.0.1")
	wantAPIError(t, err, http.StatusConflict, "address 10.244.0.1 is the router address of its pool")
	_, err = c.ReleaseIP(ctx, "not-an-ip")
	wantAPIError(t, err, http.StatusBadRequest, `invalid address "not-an-ip" in the path`)
}

// Owners with control characters and zoned addresses are 400s, and
// change nothing.
func TestAPIRefusesControlCharactersAndZones(t *testing.T) {
	dir := t.TempDir()
	socket := filepath.Join(dir, "agent.sock")
	h := celltest.New(daemon.Cell, api.Cell, ipam.Cell)
	hive.AddConfigOverride(h, func(c *daemon.Config) { c.StateDir, c.RunDir = filepath.Join(dir, "state"), filepath.Join(dir, "run") })
	hive.AddConfigOverride(h, func(c *api.Config) { c.APISocket = socket })
	hive.AddConfigOverride(h, func(c *ipam.Config) { c.PodCIDR = []string{"10.244.0.0/29", "fd00:10:244::/120"} })
	celltest.Start(t, h)
	c := client.New(socket)
	ctx := context.Background()

	for _, owner := range []string{"ops\nWARN forged line", "ops\r", "tab\there", "bell\a", "nul\x00", "del\x7f", "c1\u0085"} {
		_, err := c.ReserveIP(ctx, apiv1.IPAMReserve{Owner: owner, Family: "ipv4"})
		wantAPIError(t, err, http.StatusBadRequest, "want printable characters, without control characters or newlines")
	}
	if _, err := c.ReserveIP(ctx, apiv1.IPAMReserve{Owner: "ops team (oncall)", IP: "fd00:10:244::20"}); err != nil {
		t.Fatalf("a printable owner with spaces: %v", err)
	}
	_, err := c.ReserveIP(ctx, apiv1.IPAMReserve{Owner: "ops", IP: "fd00:10:244::21%eth0"})
	wantAPIError(t, err, http.StatusBadRequest, `invalid ip "fd00:10:244::21%eth0": want an address without a zone`)
	_, err = c.ReleaseIP(ctx, "fd00:10:244::20%eth0")
	wantAPIError(t, err, http.StatusBadRequest, `invalid address "fd00:10:244::20%eth0" in the path: want an address without a zone`)

	status, err := c.IPAM(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var owners []string
	for _, a := range status.Allocations {
		owners = append(owners, a.IP+" "+a.Owner)
	}
	if want := []string{"10.244.0.1 router", "fd00:10:244::1 router", "fd00:10:244::20 ops team (oncall)"}; !slices.Equal(owners, want) {
		t.Fatalf("allocations = %q, want %q", owners, want)
	}
}
