package client

import (
	"context"
	"net/url"

	"github.com/cellium/cellium/pkg/apiv1"
)

// IPCache lists the ipcache.
func (c *Client) IPCache(ctx context.Context) ([]apiv1.IPCacheEntry, error) {
	return get[[]apiv1.IPCacheEntry](ctx, c, apiv1.PathIPCache, nil)
}

// IPCacheLookup is the longest ipcache prefix that holds ip.
func (c *Client) IPCacheLookup(ctx context.Context, ip string) (apiv1.IPCacheEntry, error) {
	return get[apiv1.IPCacheEntry](ctx, c, apiv1.PathIPCache+"/"+url.PathEscape(ip), nil)
}
