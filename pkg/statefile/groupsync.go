package statefile

import "sync"

// DirSyncer makes the entries of one directory durable for many writers
// at once (group commit): a writer that has created, renamed or removed an
// entry calls [DirSyncer.Sync], which returns once a sync of the directory
// that began after the call has finished. Callers that arrive while a sync
// runs wait for the next one, which serves them all, so that N concurrent
// writers cost about two syncs instead of N, and none is told its entry is
// durable by a sync that began before the entry was made.
//
// The zero value is not usable: make it with [NewDirSyncer]. It starts a
// goroutine only while callers wait.
type DirSyncer struct {
	dir  string
	sync func(dir string) error

	mu      sync.Mutex
	running bool
	// waiting are the callers the next sync serves.
	waiting []chan synced
	// syncs counts the syncs begun.
	syncs uint64
	// queued, for tests, is called with mu held after a caller is added
	// to waiting, with how many wait for the next sync.
	queued func(n int)
}

// NewDirSyncer returns a DirSyncer of dir.
func NewDirSyncer(dir string) *DirSyncer { return &DirSyncer{dir: dir, sync: SyncDir} }

// synced is the sync that served a caller: its number (from 1) and error.
type synced struct {
	n   uint64
	err error
}

// Sync returns once the directory's entries, as they were when it was
// called, are durable, with the error of the sync that made them so.
func (s *DirSyncer) Sync() error {
	_, err := s.sync1()
	return err
}

// sync1 is Sync, which also says which sync served the caller.
func (s *DirSyncer) sync1() (uint64, error) {
	done := make(chan synced, 1)
	s.mu.Lock()
	s.waiting = append(s.waiting, done)
	if s.queued != nil {
		s.queued(len(s.waiting))
	}
	if !s.running {
		s.running = true
		go s.run()
	}
	s.mu.Unlock()
	r := <-done
	return r.n, r.err
}

// run syncs the directory for the callers waiting when each sync begins,
// until none waits.
func (s *DirSyncer) run() {
	for {
		s.mu.Lock()
		batch := s.waiting
		s.waiting = nil
		if len(batch) == 0 {
			s.running = false
			s.mu.Unlock()
			return
		}
		s.syncs++
		n := s.syncs
		s.mu.Unlock()
		err := s.sync(s.dir)
		for _, done := range batch {
			done <- synced{n, err}
		}
	}
}
