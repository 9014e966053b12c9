package client

import (
	"context"
	"net/url"

	"github.com/cellium/cellium/pkg/apiv1"
)

// Services lists the services the agent load-balances, sorted by namespace
// and name; a namespace other than "" narrows the list to it.
func (c *Client) Services(ctx context.Context, namespace string) ([]apiv1.Service, error) {
	var q url.Values
	if namespace != "" {
		q = url.Values{"namespace": {namespace}}
	}
	return get[[]apiv1.Service](ctx, c, apiv1.PathServices, q)
}

// Service is one service; an [*APIError] with status 404 when the agent
// has no such service.
func (c *Client) Service(ctx context.Context, namespace, name string) (apiv1.Service, error) {
	return get[apiv1.Service](ctx, c, apiv1.PathServices+"/"+url.PathEscape(namespace)+"/"+url.PathEscape(name), nil)
}
