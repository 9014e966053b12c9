package client

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	"github.com/cellium/cellium/pkg/apiv1"
)

// Policies lists the NetworkPolicies as the agent understands them.
func (c *Client) Policies(ctx context.Context) (apiv1.PolicyList, error) {
	return get[apiv1.PolicyList](ctx, c, apiv1.PathPolicy, nil)
}

// Policy is one NetworkPolicy, by "namespace/name".
func (c *Client) Policy(ctx context.Context, name string) (apiv1.Policy, error) {
	ns, n, ok := strings.Cut(name, "/")
	if !ok || ns == "" || n == "" || strings.Contains(n, "/") {
		return apiv1.Policy{}, fmt.Errorf("policy %q: want NAMESPACE/NAME", name)
	}
	return get[apiv1.Policy](ctx, c, apiv1.PathPolicy+"/"+url.PathEscape(ns)+"/"+url.PathEscape(n), nil)
}

// PolicySelectors lists the selector cache.
func (c *Client) PolicySelectors(ctx context.Context) ([]apiv1.PolicySelector, error) {
	return get[[]apiv1.PolicySelector](ctx, c, apiv1.PathPolicySelectors, nil)
}

// PolicyTrace explains the verdict on a connection (see apiv1.PathPolicyTrace).
func (c *Client) PolicyTrace(ctx context.Context, from, to, port string) (apiv1.PolicyTrace, error) {
	return get[apiv1.PolicyTrace](ctx, c, apiv1.PathPolicyTrace, url.Values{"from": {from}, "to": {to}, "port": {port}})
}
