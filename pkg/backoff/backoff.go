// Package backoff is the jittered exponential backoff of the agent's retries
// against a server that every node shares (the Kubernetes API server, etcd): N
// agents that fail together (the server went away) must not retry together
// when it comes back.
//
// client-go's reflectors (every informer) jitter their own relists and
// rewatches already: 800ms doubling to 30s, each wait drawn from [d, 2d),
// reset after 2 minutes of health (tools/cache's defaultBackoff*); this is
// the same shape for the agent's own retry loops.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Jittered doubles from Min to Max; each Wait is drawn from [d, 2d) where
// d is the current step. The zero value waits 1s to 1m. It satisfies
// hive's job.RetryBackoff. Not safe for concurrent use.
type Jittered struct {
	Min, Max time.Duration
	current  time.Duration
	// rand draws from [0, n); tests set it.
	rand func(n int64) int64
}

// Wait is how long to wait before the next attempt.
func (j *Jittered) Wait() time.Duration {
	lo, hi := j.Min, j.Max
	if lo <= 0 {
		lo = time.Second
	}
	if hi < lo {
		hi = max(lo, time.Minute)
	}
	if j.current == 0 {
		j.current = lo
	} else {
		j.current = min(2*j.current, hi)
	}
	draw := j.rand
	if draw == nil {
		draw = rand.Int64N
	}
	return j.current + time.Duration(draw(int64(j.current)))
}

// Reset starts again at Min: after a success.
func (j *Jittered) Reset() { j.current = 0 }

// Sleep waits the next Wait, or until ctx ends.
func (j *Jittered) Sleep(ctx context.Context) {
	t := time.NewTimer(j.Wait())
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
