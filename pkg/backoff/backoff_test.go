package backoff

import (
	"testing"
	"time"
)

// TestJitteredSteps: the steps double from Min to Max, each wait in
// [step, 2*step), and Reset starts over.
func TestJitteredSteps(t *testing.T) {
	for _, tc := range []struct {
		name string
		draw func(n int64) int64
		want []time.Duration
	}{
		{"lowest draw", func(int64) int64 { return 0 }, []time.Duration{1, 2, 4, 8, 8}},
		{"highest draw", func(n int64) int64 { return n - 1 }, []time.Duration{2, 4, 8, 16, 16}},
	} {
		j := &Jittered{Min: time.Second, Max: 8 * time.Second, rand: tc.draw}
		for i, w := range tc.want {
			want := w * time.Second
			if tc.name == "highest draw" {
				want -= time.Nanosecond
			}
			if got := j.Wait(); got != want {
				t.Errorf("%s: wait %d = %s, want %s", tc.name, i+1, got, want)
			}
		}
		j.Reset()
		if got := j.Wait(); got < time.Second || got >= 2*time.Second {
			t.Errorf("%s: after Reset the wait is %s, want [1s, 2s)", tc.name, got)
		}
	}
}

// TestJitteredSpreads: agents that fail at the same moment do not retry at
// the same moment: 100 backoffs' first waits spread over [Min, 2*Min).
func TestJitteredSpreads(t *testing.T) {
	const n = 100
	seen := map[time.Duration]bool{}
	lo, hi := time.Hour, time.Duration(0)
	for range n {
		j := &Jittered{Min: time.Second, Max: time.Minute}
		w := j.Wait()
		if w < time.Second || w >= 2*time.Second {
			t.Fatalf("first wait %s, want [1s, 2s)", w)
		}
		seen[w] = true
		lo, hi = min(lo, w), max(hi, w)
	}
	// With draws uniform over 1e9 values, 100 coincide with negligible
	// chance, and their range is most of the second.
	if len(seen) < n-1 || hi-lo < 500*time.Millisecond {
		t.Errorf("100 first waits: %d distinct, from %s to %s; want them spread over [1s, 2s)", len(seen), lo, hi)
	}
}

// TestJitteredZero: the zero value waits 1s to 1m.
func TestJitteredZero(t *testing.T) {
	var j Jittered
	if w := j.Wait(); w < time.Second || w >= 2*time.Second {
		t.Errorf("zero value: first wait %s, want [1s, 2s)", w)
	}
	for range 10 {
		j.Wait()
	}
	if w := j.Wait(); w < time.Minute || w >= 2*time.Minute {
		t.Errorf("zero value: wait after 11 steps %s, want [1m, 2m)", w)
	}
}
