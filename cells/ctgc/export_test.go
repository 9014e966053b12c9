package ctgc

import (
	"time"
)

// SetChunkSize makes gc's walks read size entries per system call, so that
// a test walks a map of a few thousand entries in many chunks.
func SetChunkSize(gc *GC, size int) {
	gc.mu.Lock()
	defer gc.mu.Unlock()
	gc.chunk = size
}

// SetProgressEvery sets how often a long walk logs its progress; 0 logs
// after every chunk.
func SetProgressEvery(gc *GC, every time.Duration) {
	gc.mu.Lock()
	defer gc.mu.Unlock()
	gc.progressEvery = every
}
