package devcluster_test

import "testing"

// TestMasqueradeNative: TestMasquerade's source addresses in native
// routing, where pod packets to another node are routed as they are, not
// encapsulated: a pod reaches the outside with its node's address (both
// families), and the other node's pod and both nodes with its own.
func TestMasqueradeNative(t *testing.T) {
	newMasqCluster(t, "native").checkSources(t)
}
