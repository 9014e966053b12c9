package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/cellium/cellium/pkg/apiv1"
)

// IPAM is the pod address pools and every allocation.
func (c *Client) IPAM(ctx context.Context) (apiv1.IPAM, error) {
	return get[apiv1.IPAM](ctx, c, apiv1.PathIPAM, nil)
}

// ReserveIP reserves an address (req.IP) or the next free one of
// req.Family for req.Owner, until ReleaseIP.
func (c *Client) ReserveIP(ctx context.Context, req apiv1.IPAMReserve) (apiv1.IPAMAllocation, error) {
	var out apiv1.IPAMAllocation
	err := c.Do(ctx, http.MethodPost, apiv1.PathIPAM, nil, req, &out)
	return out, err
}

// ReleaseIP releases a reserved address, or an unclaimed one, and returns
// what it was.
func (c *Client) ReleaseIP(ctx context.Context, ip string) (apiv1.IPAMAllocation, error) {
	var out apiv1.IPAMAllocation
	err := c.Do(ctx, http.MethodDelete, apiv1.PathIPAM+"/"+url.PathEscape(ip), nil, nil, &out)
	return out, err
}
