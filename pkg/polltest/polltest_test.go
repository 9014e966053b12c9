package polltest

import (
	"testing"
	"time"
)

func TestUntilReturnsOnceTrue(t *testing.T) {
	n := 0
	Until(t, "three calls", time.Minute, time.Millisecond, func() (bool, string) {
		n++
		return n == 3, "fewer"
	})
	if n != 3 {
		t.Fatalf("called %d times, want 3", n)
	}
}

// failRecorder records Fatalf instead of ending the test.
type failRecorder struct {
	testing.TB
	msg string
}

func (f *failRecorder) Helper() {}
func (f *failRecorder) Fatalf(format string, args ...any) {
	f.msg = format
	panic(f)
}

func TestUntilFailsWithTheLastAnswer(t *testing.T) {
	rec := &failRecorder{TB: t}
	func() {
		defer func() {
			if r := recover(); r != rec {
				t.Fatalf("Until did not fail the test: %v", r)
			}
		}()
		Until(rec, "never", 20*time.Millisecond, time.Millisecond, func() (bool, string) { return false, "still no" })
	}()
	if rec.msg != "%s: not within %s; last: %s" {
		t.Fatalf("failure message %q", rec.msg)
	}
}
