package k8sapi

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// newRequests is cellium_k8s_crd_requests_total{verb, resource, code}.
func newRequests() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "cellium", Subsystem: "k8s", Name: "crd_requests_total",
		Help: "Requests to the Kubernetes API for Cellium's custom resources and their CRDs, by verb, resource and HTTP status code (0: no answer)",
	}, []string{"verb", "resource", "code"})
}

// counting counts each request of a client by verb, resource and answer.
type counting struct {
	next     http.RoundTripper
	requests *prometheus.CounterVec
}

func (c counting) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := c.next.RoundTrip(r)
	code := 0
	if resp != nil {
		code = resp.StatusCode
	}
	verb, resource := verbOf(r)
	c.requests.WithLabelValues(verb, resource, strconv.Itoa(code)).Inc()
	return resp, err
}

// verbOf is the Kubernetes verb and resource of a request to
// /apis/<group>/<version>/[namespaces/<ns>/]<resource>[/<name>].
func verbOf(r *http.Request) (verb, resource string) {
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	if len(parts) >= 3 && parts[0] == "apis" {
		parts = parts[3:]
	}
	if len(parts) >= 2 && parts[0] == "namespaces" {
		parts = parts[2:]
	}
	named := len(parts) > 1
	if len(parts) > 0 {
		resource = parts[0]
	}
	switch r.Method {
	case http.MethodGet:
		switch {
		case r.URL.Query().Get("watch") == "true" || r.URL.Query().Get("watch") == "1":
			verb = "watch"
		case named:
			verb = "get"
		default:
			verb = "list"
		}
	case http.MethodPost:
		verb = "create"
	case http.MethodPut:
		verb = "update"
	case http.MethodPatch:
		verb = "patch"
	case http.MethodDelete:
		verb = "delete"
	default:
		verb = strings.ToLower(r.Method)
	}
	return verb, resource
}

// Requests counts this client's requests: a collector for the agent's
// metrics (cellium_k8s_crd_requests_total{verb,resource,code}).
func (c *Client) Requests() *prometheus.CounterVec { return c.requests }

// RequestCount is how many requests with verb on resource the client has
// made (any answer).
func (c *Client) RequestCount(verb, resource string) int {
	n := 0
	ch := make(chan prometheus.Metric, 64)
	go func() { c.requests.Collect(ch); close(ch) }()
	for m := range ch {
		labels := map[string]string{}
		var pb dto.Metric
		if m.Write(&pb) != nil {
			continue
		}
		for _, l := range pb.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["verb"] == verb && labels["resource"] == resource {
			n += int(pb.GetCounter().GetValue())
		}
	}
	return n
}
