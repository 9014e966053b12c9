package client

import (
	"context"
	"net/url"

	"github.com/cellium/cellium/pkg/apiv1"
)

// KVStore is the kvstore connection's status.
func (c *Client) KVStore(ctx context.Context) (apiv1.KVStore, error) {
	return get[apiv1.KVStore](ctx, c, apiv1.PathKVStore, nil)
}

// KVStoreKeys reads key (relative to --kvstore-prefix), or with recursive
// every key under it.
func (c *Client) KVStoreKeys(ctx context.Context, key string, recursive bool) ([]apiv1.KVStoreKey, error) {
	q := url.Values{"key": {key}}
	if recursive {
		q.Set("recursive", "true")
	}
	return get[[]apiv1.KVStoreKey](ctx, c, apiv1.PathKVStoreKeys, q)
}
