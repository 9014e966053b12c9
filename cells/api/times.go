package api

import (
	"context"
	"net"
	"time"
)

// RequestTimes are when the server accepted a request's connection and
// when the request's handler began: what the request waited before it was
// handled (the accept, reading and parsing the request, a goroutine to run
// it). On a connection kept alive for several requests, Accepted is the
// connection's.
type RequestTimes struct {
	Accepted, Handled time.Time
}

type acceptedKey struct{}

type handledKey struct{}

// connAccepted is the server's ConnContext: it notes when the connection
// was accepted.
func connAccepted(ctx context.Context, _ net.Conn) context.Context {
	return context.WithValue(ctx, acceptedKey{}, time.Now())
}

// withHandled notes in ctx that the request's handler began at t.
func withHandled(ctx context.Context, t time.Time) context.Context {
	return context.WithValue(ctx, handledKey{}, t)
}

// TimesOf are the times of the API request whose context ctx is; false for
// a context that is not a request's.
func TimesOf(ctx context.Context) (RequestTimes, bool) {
	accepted, ok1 := ctx.Value(acceptedKey{}).(time.Time)
	handled, ok2 := ctx.Value(handledKey{}).(time.Time)
	return RequestTimes{Accepted: accepted, Handled: handled}, ok1 && ok2
}
