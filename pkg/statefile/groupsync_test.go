package statefile_test

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/cellium/cellium/pkg/statefile"
)

// TestDirSyncerGroupCommit: writers make entries in a directory at once
// and each calls Sync; a model of the disk makes durable, with each sync,
// the entries there were when it began (what a real sync guarantees). A
// crash right after any Sync returned loses nothing acknowledged: the sync
// that served each writer began after its entry was made. The writers that
// came while the first sync ran are served together by one more sync.
func TestDirSyncerGroupCommit(t *testing.T) {
	const writers = 20
	dir := t.TempDir()
	var (
		mu sync.Mutex
		// made are the entries each sync (from 1) made durable.
		made  = map[uint64]map[string]bool{}
		syncs uint64
	)
	firstStarted, release := make(chan struct{}), make(chan struct{})
	allQueued := make(chan struct{})
	diskSync := func(d string) error {
		entries, err := os.ReadDir(d)
		if err != nil {
			return err
		}
		mu.Lock()
		syncs++
		n := syncs
		made[n] = map[string]bool{}
		for _, e := range entries {
			made[n][e.Name()] = true
		}
		mu.Unlock()
		if n == 1 {
			close(firstStarted)
			<-release // the others arrive while this sync runs
		}
		return nil
	}
	queuedOnce := sync.OnceFunc(func() { close(allQueued) })
	s := statefile.NewDirSyncerWith(dir, diskSync, func(n int) {
		if n == writers-1 {
			queuedOnce()
		}
	})

	lost := make(chan string, writers)
	write := func(i int) {
		name := fmt.Sprintf("ep%d", i)
		if err := os.Mkdir(filepath.Join(dir, name), 0o700); err != nil {
			t.Error(err)
			return
		}
		n, err := statefile.SyncN(s)
		if err != nil {
			t.Error(err)
			return
		}
		// Acknowledged: a crash now must find it.
		mu.Lock()
		if !made[n][name] {
			lost <- fmt.Sprintf("%s (by sync %d)", name, n)
		}
		mu.Unlock()
	}
	var wg sync.WaitGroup
	wg.Go(func() { write(0) })
	<-firstStarted
	for i := 1; i < writers; i++ {
		wg.Go(func() { write(i) })
	}
	<-allQueued
	close(release)
	wg.Wait()
	close(lost)
	for name := range lost {
		t.Errorf("%s was acknowledged before a sync that began after it was made had finished: a crash then loses it", name)
	}
	if syncs != 2 {
		t.Errorf("%d writers took %d syncs, want 2 (one for the first, one for those that came during it)", writers, syncs)
	}
}

// TestDirSyncerError: every caller a failed sync served gets its error, and
// the next caller a new sync.
func TestDirSyncerError(t *testing.T) {
	fail := true
	s := statefile.NewDirSyncerWith(t.TempDir(), func(string) error {
		if fail {
			return os.ErrPermission
		}
		return nil
	}, nil)
	if err := s.Sync(); err != os.ErrPermission {
		t.Fatalf("Sync with a failing disk = %v, want %v", err, os.ErrPermission)
	}
	fail = false
	if err := s.Sync(); err != nil {
		t.Fatalf("Sync after the disk recovered = %v", err)
	}
}
