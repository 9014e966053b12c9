package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/cilium/hive/cell"
)

// Route is one endpoint a cell contributes to the API.
type Route struct {
	// Method is the HTTP method: GET, PUT, POST, DELETE.
	Method string
	// Path is a net/http ServeMux path pattern, e.g. "/v1/statedb/{table}".
	Path string
	// Handler answers with one JSON value. A route has a Handler or a
	// Stream, not both.
	Handler HandlerFunc
	// Stream answers with a stream of JSON values (see [StreamFunc]).
	Stream StreamFunc
}

// HandlerFunc handles a request: it returns the value to send back as JSON,
// or an error (see [Errorf]).
type HandlerFunc func(r *http.Request) (any, error)

// Routes is what a constructor returns to contribute routes to the API.
type Routes struct {
	cell.Out

	Routes []Route `group:"api-routes,flatten"`
}

// NewRoutes wraps routes for returning from a constructor.
func NewRoutes(routes ...Route) Routes { return Routes{Routes: routes} }

// StatusError is an error with the HTTP status to answer it with.
type StatusError struct {
	Status  int
	Message string
}

func (e *StatusError) Error() string { return e.Message }

// Errorf makes an error that the server answers with the given status.
func Errorf(status int, format string, args ...any) error {
	return &StatusError{Status: status, Message: fmt.Sprintf(format, args...)}
}

// BadRequest is a 400: the request was malformed and changed nothing.
func BadRequest(format string, args ...any) error {
	return Errorf(http.StatusBadRequest, format, args...)
}

// NotFound is a 404: the request named something that does not exist.
func NotFound(format string, args ...any) error {
	return Errorf(http.StatusNotFound, format, args...)
}

// statusOf is the HTTP status to answer err with.
func statusOf(err error) int {
	if se, ok := errors.AsType[*StatusError](err); ok {
		return se.Status
	}
	return http.StatusInternalServerError
}

// MaxBody bounds a request body: the API takes small JSON objects.
const MaxBody = 64 << 10

// DecodeJSON decodes the request's body, one JSON object, into v, strictly:
// an unknown field, a second value after the object or a body over MaxBody
// is a BadRequest error saying so, so that a misspelt field never passes
// silently.
func DecodeJSON(r *http.Request, v any) error {
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxBody+1))
	if err != nil {
		return BadRequest("read body: %v", err)
	}
	if len(body) > MaxBody {
		return BadRequest("body larger than %d bytes", MaxBody)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return BadRequest("invalid body: %v", err)
	}
	if dec.More() {
		return BadRequest("invalid body: more than one JSON value")
	}
	return nil
}

// QueryParams returns the request's query parameters, or a BadRequest error
// naming a parameter that is not among allowed or that is given twice.
func QueryParams(r *http.Request, allowed ...string) (url.Values, error) {
	q := r.URL.Query()
	for name, values := range q {
		if !slices.Contains(allowed, name) {
			if len(allowed) == 0 {
				return nil, BadRequest("unknown query parameter %q: %s takes none", name, r.URL.Path)
			}
			return nil, BadRequest("unknown query parameter %q: %s takes %s", name, r.URL.Path, strings.Join(allowed, ", "))
		}
		if len(values) > 1 {
			return nil, BadRequest("query parameter %q given %d times", name, len(values))
		}
	}
	return q, nil
}
