package ctgc

import (
	"strings"
	"testing"
	"time"
)

func TestIntervalAdapts(t *testing.T) {
	cfg := Config{ConntrackGCIntervalMin: 10 * time.Second, ConntrackGCIntervalMax: time.Hour}
	iv, err := newInterval(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		share float64
		want  time.Duration
	}{
		{0, 10 * time.Minute},                     // nothing deleted: twice the starting 5m
		{0.049, 20 * time.Minute},                 // little: grows again
		{0.05, 20 * time.Minute},                  // between the bounds: holds
		{0.25, 20 * time.Minute},                  // still holds at the shrink threshold
		{0.5, 10 * time.Minute},                   // half a map: the interval halves
		{1, 150 * time.Second},                    // a whole map: a quarter
		{2, 38 * time.Second},                     // more than a map counts as a whole map, rounded to a second
		{0.9, 11 * time.Second},                   // 38s * 0.25/0.9 = 10.6s, rounded
		{0.9, 10 * time.Second},                   // held at --conntrack-gc-interval-min
		{0, 20 * time.Second},                     // grows from the minimum
		{0, 40 * time.Second},                     //
		{0, 80 * time.Second},                     //
		{0.01, 160 * time.Second},                 //
		{0, 320 * time.Second},                    //
		{0, 640 * time.Second},                    //
		{0, 1280 * time.Second},                   //
		{0, 2560 * time.Second},                   //
		{0, time.Hour},                            // held at --conntrack-gc-interval-max
		{0, time.Hour},                            //
		{0.3, time.Duration(0.25 / 0.3 * 3600e9)}, // proportional: 50m
	} {
		if got := iv.next(step.share); got != step.want {
			t.Fatalf("after a pass deleting %.3f of a map: interval %s, want %s", step.share, got, step.want)
		}
	}
}

func TestIntervalStartsWithinBounds(t *testing.T) {
	iv, err := newInterval(Config{ConntrackGCIntervalMin: 10 * time.Minute, ConntrackGCIntervalMax: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	// The starting 5m is below the minimum: the first decision starts from
	// 10m and holds it.
	if got := iv.next(0.1); got != 10*time.Minute {
		t.Errorf("interval after a first pass that deleted 10%%: %s, want 10m", got)
	}
}

func TestIntervalFixed(t *testing.T) {
	iv, err := newInterval(Config{ConntrackGCInterval: 30 * time.Second, ConntrackGCIntervalMin: time.Minute, ConntrackGCIntervalMax: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	for _, share := range []float64{0, 1, 0.5, 0.01} {
		if got := iv.next(share); got != 30*time.Second {
			t.Errorf("fixed interval after a pass deleting %.2f: %s, want 30s, outside the bounds as set", share, got)
		}
	}
}

func TestIntervalFlags(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		flag string
	}{
		{Config{ConntrackGCIntervalMin: 0, ConntrackGCIntervalMax: time.Hour}, "--conntrack-gc-interval-min 0s"},
		{Config{ConntrackGCIntervalMin: time.Minute, ConntrackGCIntervalMax: time.Second}, "--conntrack-gc-interval-max 1s"},
		{Config{ConntrackGCInterval: time.Millisecond, ConntrackGCIntervalMin: time.Second, ConntrackGCIntervalMax: time.Hour}, "--conntrack-gc-interval 1ms"},
		{Config{ConntrackGCInterval: -time.Second, ConntrackGCIntervalMin: time.Second, ConntrackGCIntervalMax: time.Hour}, "--conntrack-gc-interval -1s"},
	} {
		_, err := newInterval(tc.cfg)
		if err == nil || !strings.Contains(err.Error(), "invalid "+tc.flag) {
			t.Errorf("%+v: error %v, want one naming %s", tc.cfg, err, tc.flag)
		}
	}
	if _, err := newInterval(defaultConfig); err != nil {
		t.Errorf("defaults: %v", err)
	}
}
