package client

import (
	"context"
	"net/url"

	"github.com/cellium/cellium/pkg/apiv1"
)

// Nodes are the nodes the agent knows.
func (c *Client) Nodes(ctx context.Context) ([]apiv1.Node, error) {
	return get[[]apiv1.Node](ctx, c, apiv1.PathNodes, nil)
}

// Node is one node, by name.
func (c *Client) Node(ctx context.Context, name string) (apiv1.Node, error) {
	return get[apiv1.Node](ctx, c, apiv1.PathNodes+"/"+url.PathEscape(name), nil)
}
