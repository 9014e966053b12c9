// Package polltest waits in tests for state that has no watch channel to
// wait on, such as what another process reports: it asks again and again
// until the answer is yes or the time is up, and then fails the test with
// the last answer, so a failure says what was seen instead.
package polltest

import (
	"testing"
	"time"
)

// Until calls ok every interval until it says true, and fails the test
// after timeout with what ok said last.
func Until(t testing.TB, what string, timeout, interval time.Duration, ok func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		done, last := ok()
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s; last: %s", what, timeout, last)
		}
		time.Sleep(interval)
	}
}
