package client

import (
	"context"
	"net/url"

	"github.com/cellium/cellium/pkg/apiv1"
)

// ClusterHealth is the last probes of every node; with probe, of a round
// the agent runs now.
func (c *Client) ClusterHealth(ctx context.Context, probe bool) (apiv1.ClusterHealth, error) {
	var q url.Values
	if probe {
		q = url.Values{"probe": {"true"}}
	}
	return get[apiv1.ClusterHealth](ctx, c, apiv1.PathClusterHealth, q)
}
