package ctgc

import (
	"fmt"
	"time"
)

// The adaptive interval aims at passes that each delete at most a quarter of
// a map: entries expire at some rate, and a pass that finds a large share of
// a map expired came late, while the datapath was already short of room
// (an LRU map evicts live connections when it is full). A pass that finds
// almost nothing to delete came early, and spent a walk of the whole map for
// nothing.
const (
	// shrinkAbove: a pass that finds more than this share of a map expired
	// shortens the interval in proportion, so that the next one would
	// delete about this share at the same expiry rate.
	shrinkAbove = 0.25
	// growBelow: a pass that finds less than this share of every map expired
	// lengthens the interval by growFactor.
	growBelow  = 0.05
	growFactor = 2
	// startInterval is the wait after the first pass is decided from, as
	// if a pass had come after it.
	startInterval = 5 * time.Minute
)

// interval decides the wait between passes. With a fixed interval it is
// always that; otherwise each pass moves it within [min, max] by the share
// of a map it found expired.
type interval struct {
	fixed    time.Duration
	min, max time.Duration
	current  time.Duration
}

func newInterval(cfg Config) (*interval, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	iv := &interval{fixed: cfg.ConntrackGCInterval, min: cfg.ConntrackGCIntervalMin, max: cfg.ConntrackGCIntervalMax}
	iv.current = iv.clamp(startInterval)
	if iv.fixed > 0 {
		iv.current = iv.fixed
	}
	return iv, nil
}

// next records that a pass found share (0..1, the largest over the maps) of
// a map's capacity expired, and returns the wait until the next pass.
func (iv *interval) next(share float64) time.Duration {
	if iv.fixed > 0 {
		return iv.fixed
	}
	next := iv.current
	switch {
	case share > shrinkAbove:
		// share is at most 1, so this at most quarters the interval: a
		// single pass never swings it further than that.
		next = time.Duration(float64(next) * shrinkAbove / min(share, 1))
	case share < growBelow:
		next *= growFactor
	}
	iv.current = iv.clamp(next.Round(time.Second))
	return iv.current
}

func (iv *interval) clamp(d time.Duration) time.Duration {
	return min(max(d, iv.min), iv.max)
}

func (cfg Config) validate() error {
	if cfg.ConntrackGCIntervalMin < time.Second {
		return fmt.Errorf("invalid --conntrack-gc-interval-min %s: want at least 1s", cfg.ConntrackGCIntervalMin)
	}
	if cfg.ConntrackGCIntervalMax < cfg.ConntrackGCIntervalMin {
		return fmt.Errorf("invalid --conntrack-gc-interval-max %s: want at least --conntrack-gc-interval-min (%s)",
			cfg.ConntrackGCIntervalMax, cfg.ConntrackGCIntervalMin)
	}
	if cfg.ConntrackGCInterval != 0 && cfg.ConntrackGCInterval < time.Second {
		return fmt.Errorf("invalid --conntrack-gc-interval %s: want 0 (adaptive) or at least 1s", cfg.ConntrackGCInterval)
	}
	return nil
}
