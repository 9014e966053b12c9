// Package kinderr makes errors that carry a kind, a sentinel error callers
// test with errors.Is to pick their answer (an HTTP status, a CNI code),
// and a message of their own that says what exactly was wrong.
//
//	var ErrNotFound = errors.New("endpoint not found")
//	...
//	return kinderr.Errorf(ErrNotFound, "no endpoint for container %s", id)
//	...
//	if errors.Is(err, ErrNotFound) { /* 404 with err.Error() */ }
package kinderr

import "fmt"

type kindError struct {
	kind error
	msg  string
}

func (e *kindError) Error() string { return e.msg }
func (e *kindError) Unwrap() error { return e.kind }

// Errorf is an error of kind with the formatted message.
func Errorf(kind error, format string, args ...any) error {
	return &kindError{kind: kind, msg: fmt.Sprintf(format, args...)}
}
