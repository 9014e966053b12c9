package heapprofile

import (
	"runtime"
	"testing"
)

// Sample without Off changes nothing (a test binary's -memprofile keeps
// its rate); Off turns the profiler off and Sample back on at the rate Off
// found.
func TestOffUntilSample(t *testing.T) {
	t.Cleanup(func(r, saved int) func() {
		return func() { runtime.MemProfileRate, rate = r, saved }
	}(runtime.MemProfileRate, rate))
	rate = 0
	runtime.MemProfileRate = 4096

	Sample()
	if runtime.MemProfileRate != 4096 || Rate() != 4096 {
		t.Fatalf("Sample without Off: runtime.MemProfileRate %d, Rate %d, want both 4096", runtime.MemProfileRate, Rate())
	}
	Off()
	if runtime.MemProfileRate != 0 {
		t.Fatalf("runtime.MemProfileRate after Off is %d, want 0", runtime.MemProfileRate)
	}
	if Rate() != 4096 {
		t.Fatalf("Rate after Off is %d, want the rate Off found, 4096", Rate())
	}
	Off() // a second Off keeps the rate the first found
	Sample()
	if runtime.MemProfileRate != 4096 {
		t.Fatalf("runtime.MemProfileRate after Sample is %d, want 4096", runtime.MemProfileRate)
	}
}
