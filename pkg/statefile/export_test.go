package statefile

// NewDirSyncerWith is a DirSyncer of dir that syncs with sync and calls
// queued with how many callers wait each time one is added.
func NewDirSyncerWith(dir string, sync func(string) error, queued func(n int)) *DirSyncer {
	s := NewDirSyncer(dir)
	s.sync, s.queued = sync, queued
	return s
}

// SyncN is s.Sync, which also says which of s's syncs (from 1) served the
// caller.
func SyncN(s *DirSyncer) (uint64, error) { return s.sync1() }
