package heapprofile

import (
	"flag"
	"os"
	"runtime"
	"strings"
	"testing"
)

// A binary that links the package samples nothing from its initialization
// on, and Sample restores Go's rate.
func TestOffUntilSample(t *testing.T) {
	if f := flag.Lookup("test.memprofile"); f != nil && f.Value.String() != "" {
		t.Skip("-test.memprofile sets the rate after package initialization")
	}
	if runtime.MemProfileRate != 0 {
		t.Fatalf("runtime.MemProfileRate is %d after package initialization, want 0", runtime.MemProfileRate)
	}
	if strings.Contains(os.Getenv("GODEBUG"), "memprofilerate") {
		t.Skip("GODEBUG sets the rate")
	}
	if rate != 512*1024 {
		t.Fatalf("rate recorded at initialization %d, want Go's default 524288", rate)
	}
	t.Cleanup(func() { runtime.MemProfileRate = 0 })
	Sample()
	if runtime.MemProfileRate != 512*1024 {
		t.Fatalf("runtime.MemProfileRate after Sample is %d, want 524288", runtime.MemProfileRate)
	}
}
