package client

import (
	"context"
	"net/url"

	"github.com/cellium/cellium/pkg/apiv1"
)

// Identities lists the security identities the agent knows.
func (c *Client) Identities(ctx context.Context) ([]apiv1.Identity, error) {
	return get[[]apiv1.Identity](ctx, c, apiv1.PathIdentities, nil)
}

// Identity is one identity, by number or reserved name.
func (c *Client) Identity(ctx context.Context, id string) (apiv1.Identity, error) {
	return get[apiv1.Identity](ctx, c, apiv1.PathIdentities+"/"+url.PathEscape(id), nil)
}

// IdentityBackend is where the agent's cluster identities live and how
// far it follows them.
func (c *Client) IdentityBackend(ctx context.Context) (apiv1.IdentityBackend, error) {
	return get[apiv1.IdentityBackend](ctx, c, apiv1.PathIdentityBackend, nil)
}
