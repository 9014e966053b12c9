package k8sclient

import (
	"context"
	"time"

	"github.com/cilium/hive/cell"
)

const (
	// quietPeriod is how long the directory must be still before a pass:
	// an editor's save or a ConfigMap update is a burst of events.
	quietPeriod = 100 * time.Millisecond
	// maxDelay bounds the wait under a steady stream of events.
	maxDelay = time.Second
	// resyncInterval is how often the directory is read without an event:
	// inotify does not see a change behind a symlink that points out of the
	// directory, drops events when its queue overflows, and cannot watch a
	// directory that does not exist yet.
	resyncInterval = time.Minute
)

// watch runs a pass after every burst of changes in the directory, and
// every resyncInterval. Any event counts: renames, symlink swaps and writes
// all end in the same level-triggered pass.
func (s *manifestSync) watch(ctx context.Context, _ cell.Health) error {
	resync := time.NewTicker(resyncInterval)
	defer resync.Stop()
	debounce := time.NewTimer(time.Hour)
	debounce.Stop()
	var pending bool
	var first time.Time
	changed := func() {
		now := time.Now()
		if !pending {
			pending, first = true, now
		}
		debounce.Reset(min(quietPeriod, first.Add(maxDelay).Sub(now)))
	}
	pass := func() {
		pending = false
		if err := s.sync(); err != nil {
			s.log.Warn("Cannot read the manifests directory; objects are unchanged", "dir", s.dir, "error", err)
		}
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case _, ok := <-s.watcher.Events:
			if !ok {
				return nil
			}
			changed()
		case err, ok := <-s.watcher.Errors:
			if !ok {
				return nil
			}
			s.log.Debug("Manifests directory watch error; reading the directory again", "error", err)
			changed()
		case <-debounce.C:
			pass()
		case <-resync.C:
			pass()
		}
	}
}
