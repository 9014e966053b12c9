package client

import (
	"context"
	"net/http"

	"github.com/cellium/cellium/pkg/apiv1"
)

// ContainerEndpointID is the {id} that names the endpoint of a container.
func ContainerEndpointID(containerID string) string {
	return apiv1.ContainerIDPrefix + containerID
}

// Endpoints lists the node's endpoints.
func (c *Client) Endpoints(ctx context.Context) ([]apiv1.Endpoint, error) {
	return get[[]apiv1.Endpoint](ctx, c, apiv1.PathEndpoints, nil)
}

// Endpoint is one endpoint; id is its number or [ContainerEndpointID].
func (c *Client) Endpoint(ctx context.Context, id string) (apiv1.Endpoint, error) {
	return get[apiv1.Endpoint](ctx, c, apiv1.EndpointPath(id), nil)
}

// CreateEndpoint creates the endpoint of a container: addresses, veth pair,
// routes. It waits while the agent restores its endpoints, as long as ctx
// allows.
func (c *Client) CreateEndpoint(ctx context.Context, containerID string, req apiv1.EndpointCreate) (apiv1.Endpoint, error) {
	var ep apiv1.Endpoint
	err := c.Do(ctx, http.MethodPut, apiv1.EndpointPath(ContainerEndpointID(containerID)), nil, req, &ep)
	return ep, err
}

// DeleteEndpoint deletes an endpoint and releases its addresses. An
// [*APIError] with status 404 means there was nothing to delete.
func (c *Client) DeleteEndpoint(ctx context.Context, id string) (apiv1.EndpointDeleted, error) {
	var out apiv1.EndpointDeleted
	err := c.Do(ctx, http.MethodDelete, apiv1.EndpointPath(id), nil, nil, &out)
	return out, err
}

// CheckEndpoint compares an endpoint's interfaces, addresses and routes
// with what the agent made.
func (c *Client) CheckEndpoint(ctx context.Context, id string) (apiv1.EndpointCheck, error) {
	return get[apiv1.EndpointCheck](ctx, c, apiv1.EndpointPath(id)+"/check", nil)
}
