package kinderr

import (
	"errors"
	"testing"
)

func TestErrorf(t *testing.T) {
	kind := errors.New("not found")
	other := errors.New("invalid")
	err := Errorf(kind, "no endpoint %d", 7)
	if err.Error() != "no endpoint 7" {
		t.Errorf("message = %q, want the formatted one alone", err)
	}
	if !errors.Is(err, kind) || errors.Is(err, other) {
		t.Errorf("errors.Is matches the wrong kinds")
	}
}
