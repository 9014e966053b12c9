// Package heapprofile keeps Go's heap profiler off in a binary until it
// serves its profiles.
//
// Any Go binary that links runtime.MemProfile (net/http/pprof does) samples
// one allocation per 512 KiB allocated and records its stack for ever: a
// bucket for each sampled stack, in a hash table of 1.4 MB that the runtime
// maps at the first record and makes resident a page per bucket. The agent
// serves its heap profile only with --pprof (cells/metrics), so without the
// flag those records are memory no one reads. Its binary imports
// heapprofile/off, which calls Off during package initialization; the
// metrics cell calls Sample when --pprof is given.
//
// No other binary imports heapprofile/off, so `go test -memprofile`
// profiles the packages' tests as Go always has: Sample without Off
// changes nothing.
package heapprofile

import "runtime"

// rate is the sampling rate Go had chosen for the process when Off turned
// the profiler off (512 KiB, or GODEBUG=memprofilerate=N); 0 before Off.
var rate int

// Off turns the heap profiler off until Sample. Go still records one
// allocation per processor after it: each processor's next sample was
// drawn at the old rate.
func Off() {
	if runtime.MemProfileRate != 0 {
		rate = runtime.MemProfileRate
	}
	runtime.MemProfileRate = 0
}

// Sample turns the heap profiler back on at the rate Off found.
// Allocations made while it was off are not in the profile. Without Off it
// changes nothing.
func Sample() {
	if rate != 0 {
		runtime.MemProfileRate = rate
	}
}

// Rate is the rate Sample sets: Go's rate for the process.
func Rate() int {
	if rate != 0 {
		return rate
	}
	return runtime.MemProfileRate
}
