package clusterhealth

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/internal/tables"
	"github.com/cellium/cellium/pkg/netnsrun"
)

// checkInterval is how often the health endpoint is checked for damage the
// endpoints table does not show (its veth removed by hand, say).
const checkInterval = 5 * time.Second

// healthEndpoint keeps this node's health endpoint in place and answering:
// a network namespace (bind-mounted in the state dir, so it outlives the
// agent), an endpoint in it made and restored like a pod's (reserved
// identity health), and /hello served on it.
type healthEndpoint struct {
	log       *slog.Logger
	db        *statedb.DB
	endpoints statedb.Table[*endpointmanager.Endpoint]
	mgr       *endpointmanager.Manager
	port      uint16
	netnsPath string
	node      string
}

func (h *healthEndpoint) run(ctx context.Context, health cell.Health) error {
	health.OK("Waiting for the endpoints to be restored")
	if tables.WaitInitialized(ctx, h.db, h.endpoints) != nil {
		return nil // stopping
	}
	var (
		serving      context.CancelFunc
		servedNetns  bool
		retry        = time.NewTimer(0)
		failedBefore bool
	)
	defer func() {
		if serving != nil {
			serving()
		}
	}()
	for {
		// Woken when the endpoint's row goes (a DELETE through the API),
		// else every checkInterval: damage the table does not show is
		// found by the check.
		_, _, changed, _ := h.endpoints.GetWatch(h.db.ReadTxn(), endpointmanager.EndpointContainerID.Query(HealthContainerID))
		ep, err := h.ensure(ctx)
		switch {
		case err != nil:
			if !failedBefore {
				h.log.Warn("The health endpoint is not in place; trying again", "error", err)
			}
			failedBefore = true
			health.Degraded("Health endpoint", err)
		case serving == nil || !servedNetns:
			if serving != nil {
				serving()
			}
			sctx, cancel := context.WithCancel(ctx)
			if err := h.serve(sctx); err != nil {
				cancel()
				health.Degraded("Serving /hello on the health endpoint", err)
				break
			}
			serving, servedNetns = cancel, true
			failedBefore = false
			health.OK(fmt.Sprintf("Health endpoint %d at %v", ep.ID, ep.IPs()))
		default:
			health.OK(fmt.Sprintf("Health endpoint %d at %v", ep.ID, ep.IPs()))
		}
		retry.Reset(checkInterval)
		select {
		case <-changed:
		case <-retry.C:
		case <-ctx.Done():
			return nil
		}
		if !netnsrun.Exists(h.netnsPath) {
			// A new namespace needs a new listener.
			servedNetns = false
		}
	}
}

// ensure makes the namespace and the endpoint exist and be intact: an
// endpoint that is not ready, whose namespace is not the one in the state
// dir, or whose interfaces the check finds damaged is deleted and made
// again.
func (h *healthEndpoint) ensure(ctx context.Context) (*endpointmanager.Endpoint, error) {
	created, err := ensureNetns(h.netnsPath)
	if err != nil {
		return nil, err
	}
	sel := endpointmanager.Selector{ContainerID: HealthContainerID}
	if ep, found := h.mgr.Lookup(sel); found {
		_, problems, err := h.mgr.Check(ctx, sel)
		if err == nil && len(problems) == 0 && !created && ep.Netns == h.netnsPath && ep.State == endpointmanager.Ready {
			return ep, nil
		}
		h.log.Warn("Making the health endpoint again", "id", ep.ID, "problems", problems, "new-netns", created, "error", err)
		if _, err := h.mgr.Delete(ctx, sel); err != nil && !errors.Is(err, endpointmanager.ErrNotFound) {
			return nil, fmt.Errorf("delete the damaged health endpoint: %w", err)
		}
	}
	ep, err := h.mgr.Create(ctx, endpointmanager.CreateRequest{ContainerID: HealthContainerID, Netns: h.netnsPath, IfName: "eth0", Health: true})
	if err != nil {
		return nil, fmt.Errorf("create the health endpoint: %w", err)
	}
	h.log.Info("Made the health endpoint", "id", ep.ID, "addresses", ep.IPs(), "netns", h.netnsPath)
	return ep, nil
}

// serve serves /hello in the health endpoint's namespace until ctx ends.
func (h *healthEndpoint) serve(ctx context.Context) error {
	ln, err := listenIn(h.netnsPath, h.port)
	if err != nil {
		return err
	}
	go serve(ctx, ln, "health endpoint of node "+h.node)
	return nil
}
