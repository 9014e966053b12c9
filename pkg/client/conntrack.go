package client

import (
	"context"
	"fmt"
	"net/http"
	"net/url"

	"github.com/cellium/cellium/pkg/apiv1"
)

// ConntrackQuery narrows a conntrack listing; the zero value lists every
// entry.
type ConntrackQuery struct {
	// Family is 4 or 6; 0 for both.
	Family int
	// EndpointID keeps the entries of one endpoint; 0 for all.
	EndpointID uint16
	// Limit is the most entries to return; 0 for all.
	Limit int
	// After continues a listing cut short by Limit: its Next.
	After string
}

func (q ConntrackQuery) values() url.Values {
	v := url.Values{}
	if q.Family != 0 {
		v.Set("family", fmt.Sprint(q.Family))
	}
	if q.EndpointID != 0 {
		v.Set("endpoint", fmt.Sprint(q.EndpointID))
	}
	if q.Limit != 0 {
		v.Set("limit", fmt.Sprint(q.Limit))
	}
	if q.After != "" {
		v.Set("after", q.After)
	}
	return v
}

// Conntrack lists the connections the datapath tracks.
func (c *Client) Conntrack(ctx context.Context, q ConntrackQuery) (apiv1.ConntrackEntries, error) {
	return get[apiv1.ConntrackEntries](ctx, c, apiv1.PathConntrack, q.values())
}

// ConntrackFlush deletes every conntrack entry and says how many there
// were.
func (c *Client) ConntrackFlush(ctx context.Context) (apiv1.ConntrackFlush, error) {
	var out apiv1.ConntrackFlush
	err := c.Do(ctx, http.MethodPost, apiv1.PathConntrackFlush, nil, nil, &out)
	return out, err
}

// ConntrackGC is the conntrack garbage collector's status.
func (c *Client) ConntrackGC(ctx context.Context) (apiv1.ConntrackGC, error) {
	return get[apiv1.ConntrackGC](ctx, c, apiv1.PathConntrackGC, nil)
}

// ConntrackGCRun runs a garbage collection pass now and returns it once it
// is done. Before the agent's first pass, which waits for the endpoints to
// be restored, it waits for that one.
func (c *Client) ConntrackGCRun(ctx context.Context) (apiv1.ConntrackGCPass, error) {
	var out apiv1.ConntrackGCPass
	err := c.Do(ctx, http.MethodPost, apiv1.PathConntrackGC, nil, nil, &out)
	return out, err
}
