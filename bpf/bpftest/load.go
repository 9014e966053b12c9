package bpftest

import (
	"errors"
	"testing"

	"github.com/cilium/ebpf"
)

// Load loads spec's maps and programs, failing the test with the whole
// verifier log when the verifier refuses a program, and closes them when
// the test ends.
func Load(t testing.TB, spec *ebpf.CollectionSpec) *ebpf.Collection {
	t.Helper()
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		if ve, ok := errors.AsType[*ebpf.VerifierError](err); ok {
			t.Fatalf("load: %+v", ve)
		}
		t.Fatalf("load: %v", err)
	}
	t.Cleanup(func() { coll.Close() })
	return coll
}
