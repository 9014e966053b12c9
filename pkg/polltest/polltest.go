// Package polltest waits in tests for state that has no watch channel to
// wait on, such as what another process reports: it asks again and again
// until the answer is yes or the time is up, and then fails the test with
// the last answer, so a failure says what was seen instead.
//
// Until fails the test; Wait returns the failure as an error, for a wait
// whose failure is not the end of the test (a goroutine, which must not
// fail the test, or a check that reports with t.Error and goes on). A
// benchmark that measures how long the wait took reads the clock in ok
// or after the call.
package polltest

import (
	"fmt"
	"testing"
	"time"
)

// Until calls ok every interval until it says true, and fails the test
// after timeout with what ok said last.
func Until(t testing.TB, what string, timeout, interval time.Duration, ok func() (bool, string)) {
	t.Helper()
	if err := Wait(what, timeout, interval, ok); err != nil {
		t.Fatal(err)
	}
}

// Wait calls ok every interval until it says true, and returns nil; if
// ok has not said true after timeout, it returns an error naming what,
// the timeout and what ok said last.
func Wait(what string, timeout, interval time.Duration, ok func() (bool, string)) error {
	deadline := time.Now().Add(timeout)
	for {
		done, last := ok()
		if done {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not within %s; last: %s", what, timeout, last)
		}
		time.Sleep(interval)
	}
}
