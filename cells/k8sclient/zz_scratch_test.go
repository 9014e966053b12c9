package k8sclient

import (
	"context"
	"os"
	"runtime"
	"testing"
	"time"
)

func TestZZLoad50k(t *testing.T) {
	dir := os.Getenv("ZZDIR")
	if dir == "" {
		t.Skip()
	}
	h := embeddedHive(t, dir)
	start := time.Now()
	if err := h.Start(quiet, context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Logf("start %v", time.Since(start))
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	t.Logf("heap %d MB", ms.HeapAlloc>>20)
	h.Stop(quiet, context.Background())
}
