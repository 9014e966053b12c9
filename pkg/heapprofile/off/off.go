// Package off turns Go's heap profiler off during package initialization
// (heapprofile.Off), for a binary that imports it: the agent's, which
// samples its heap only with --pprof.
//
// Go initializes a package once its imports are, the first in import path
// order among those ready. This one imports only pkg/heapprofile and the
// runtime, and most of the standard library waits for internal/...
// packages, which sort after github.com/..., so it runs among the first
// initializers (`GODEBUG=inittrace=1 agent version`). An allocation
// sampled before it stays in the profiler's table; TestOffEarly in
// cmd/agent fails when one is.
package off

import "github.com/cellium/cellium/pkg/heapprofile"

func init() { heapprofile.Off() }
