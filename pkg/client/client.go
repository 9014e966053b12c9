// Package client is a typed client of the agent's REST API (pkg/apiv1),
// spoken over the agent's unix socket. The agent's client commands and the
// CNI plugin use it.
//
// Errors say what went wrong in the caller's terms: an agent that does not
// answer is an [*UnreachableError] naming the socket; an error answer from
// the agent is an [*APIError] carrying its status and message.
//
//	c := client.New("/var/run/cellium/agent.sock")
//	h, err := c.Health(ctx)
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"

	"github.com/cellium/cellium/pkg/apiv1"
	"github.com/cellium/cellium/pkg/unixhttp"
)

// Client talks to one agent.
type Client struct {
	socket string
	http   *http.Client
}

// New returns a client of the agent serving on socket. A request lasts as
// long as its context allows: an agent busy restoring state may take a
// while to answer, and only the caller knows how long it can wait. Reaching
// the socket is bounded on its own, so a dead agent fails fast.
func New(socket string) *Client {
	transport := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			d := net.Dialer{Timeout: unixhttp.DialTimeout}
			return d.DialContext(ctx, "unix", socket)
		},
	}
	return &Client{socket: socket, http: &http.Client{Transport: transport}}
}

// UnreachableError is returned when nothing answers on the socket; the CNI
// plugin's client (pkg/unixhttp) returns the same.
type UnreachableError = unixhttp.UnreachableError

// APIError is an error answer from the agent.
type APIError = unixhttp.APIError

// Do sends a request with in (if not nil) as its JSON body and decodes the
// answer into out (if not nil).
func (c *Client) Do(ctx context.Context, method, path string, query url.Values, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("encode request: %w", err)
		}
		body = bytes.NewReader(b)
	}
	u := url.URL{Scheme: "http", Host: "agent", Path: path, RawQuery: query.Encode()}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return unixhttp.NoAnswer(c.socket, method, path, ctx.Err())
		}
		return &UnreachableError{Socket: c.socket, Err: unwrapURLError(err)}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("read answer to %s %s: %w", method, path, err)
	}
	return unixhttp.DecodeAnswer(method, path, resp.StatusCode, http.StatusText(resp.StatusCode), raw, out)
}

func unwrapURLError(err error) error {
	if ue, ok := errors.AsType[*url.Error](err); ok {
		return ue.Err
	}
	return err
}

func get[T any](ctx context.Context, c *Client, path string, query url.Values) (T, error) {
	var out T
	err := c.Do(ctx, http.MethodGet, path, query, nil, &out)
	return out, err
}

// Healthz is whether the agent has started and is ready.
func (c *Client) Healthz(ctx context.Context) (apiv1.Healthz, error) {
	return get[apiv1.Healthz](ctx, c, apiv1.PathHealthz, nil)
}

// Health is the agent's health tree.
func (c *Client) Health(ctx context.Context) (apiv1.Health, error) {
	return get[apiv1.Health](ctx, c, apiv1.PathHealth, nil)
}

// Config is the agent's effective configuration.
func (c *Client) Config(ctx context.Context) (apiv1.Config, error) {
	return get[apiv1.Config](ctx, c, apiv1.PathConfig, nil)
}

// Hive is the running agent's object listing.
func (c *Client) Hive(ctx context.Context) (apiv1.Hive, error) {
	return get[apiv1.Hive](ctx, c, apiv1.PathHive, nil)
}

// Tables lists the agent's StateDB tables.
func (c *Client) Tables(ctx context.Context) ([]apiv1.TableInfo, error) {
	return get[[]apiv1.TableInfo](ctx, c, apiv1.PathStateDB, nil)
}

// TableQuery selects the rows of a table; the zero value selects all.
type TableQuery struct {
	Index, Key string
}

func (q TableQuery) values(format string) url.Values {
	v := url.Values{"format": {format}}
	if q.Index != "" || q.Key != "" {
		v.Set("index", q.Index)
		v.Set("key", q.Key)
	}
	return v
}

// TableRows is a table's rows as the agent renders them for humans.
func (c *Client) TableRows(ctx context.Context, table string, q TableQuery) (apiv1.TableRows, error) {
	return get[apiv1.TableRows](ctx, c, apiv1.PathStateDB+"/"+url.PathEscape(table), q.values(apiv1.FormatTable))
}

// TableObjects is a table's objects as JSON.
func (c *Client) TableObjects(ctx context.Context, table string, q TableQuery) (apiv1.TableObjects, error) {
	return get[apiv1.TableObjects](ctx, c, apiv1.PathStateDB+"/"+url.PathEscape(table), q.values(apiv1.FormatJSON))
}

// Maps lists the BPF maps the agent owns.
func (c *Client) Maps(ctx context.Context) ([]apiv1.Map, error) {
	return get[[]apiv1.Map](ctx, c, apiv1.PathMaps, nil)
}

// Map describes one BPF map (its entries counted).
func (c *Client) Map(ctx context.Context, name string) (apiv1.Map, error) {
	return get[apiv1.Map](ctx, c, apiv1.PathMaps+"/"+url.PathEscape(name), nil)
}

// MapEntries dumps a BPF map's entries, decoded; limit 0 means all.
func (c *Client) MapEntries(ctx context.Context, name string, limit int) (apiv1.MapDump, error) {
	var q url.Values
	if limit > 0 {
		q = url.Values{"limit": {fmt.Sprint(limit)}}
	}
	return get[apiv1.MapDump](ctx, c, apiv1.PathMaps+"/"+url.PathEscape(name)+"/entries", q)
}
