package polltest

import (
	"fmt"
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

// failRecorder records Fatal instead of ending the test.
type failRecorder struct {
	testing.TB
	msg string
}

func (f *failRecorder) Helper() {}
func (f *failRecorder) Fatal(args ...any) {
	f.msg = fmt.Sprint(args...)
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
		n := 0
		Until(rec, "never", 20*time.Millisecond, time.Millisecond, func() (bool, string) {
			n++
			return false, fmt.Sprintf("still no (%d)", n)
		})
	}()
	if want := "never: not within 20ms; last: still no ("; len(rec.msg) < len(want) || rec.msg[:len(want)] != want {
		t.Fatalf("failure message %q, want it to start %q", rec.msg, want)
	}
}

func TestWaitReturnsTheLastAnswer(t *testing.T) {
	n := 0
	err := Wait("never", 20*time.Millisecond, time.Millisecond, func() (bool, string) {
		n++
		return false, fmt.Sprintf("answer %d", n)
	})
	if want := fmt.Sprintf("never: not within 20ms; last: answer %d", n); err == nil || err.Error() != want {
		t.Fatalf("Wait = %v, want %q", err, want)
	}
	if err := Wait("at once", time.Minute, time.Hour, func() (bool, string) { return true, "" }); err != nil {
		t.Fatalf("Wait of a condition that holds = %v", err)
	}
}
