package kubeapitest

import (
	"net/http"
	"sync"

	"k8s.io/client-go/rest"
)

// Protobuf is the Kubernetes protobuf media type; a watch's response is
// Protobuf+";stream=watch".
const Protobuf = "application/vnd.kubernetes.protobuf"

// Exchange is one request of a client and its response, as the wire
// carried them: the media types of both bodies.
type Exchange struct {
	Method, Path, Query string
	RequestType         string // the request's Content-Type
	ResponseType        string // the response's Content-Type
	Status              int
}

// Wire records the exchanges of the clients made from the configurations
// it was attached to.
type Wire struct {
	mu  sync.Mutex
	all []Exchange
}

// RecordWire attaches a new Wire to cfg: the clients made from cfg from now
// on report their exchanges to it.
func RecordWire(cfg *rest.Config) *Wire {
	w := &Wire{}
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return wireTripper{next: rt, w: w} })
	return w
}

// Exchanges are the exchanges so far (those that got a response).
func (w *Wire) Exchanges() []Exchange {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]Exchange(nil), w.all...)
}

type wireTripper struct {
	next http.RoundTripper
	w    *Wire
}

func (t wireTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	t.w.mu.Lock()
	t.w.all = append(t.w.all, Exchange{
		Method: req.Method, Path: req.URL.Path, Query: req.URL.RawQuery,
		RequestType: req.Header.Get("Content-Type"), ResponseType: resp.Header.Get("Content-Type"), Status: resp.StatusCode,
	})
	t.w.mu.Unlock()
	return resp, nil
}
