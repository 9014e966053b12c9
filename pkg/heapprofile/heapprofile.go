// Package heapprofile turns Go's heap profiler off from package
// initialization on, and back on for a process that serves its profiles.
//
// Any Go binary that links runtime.MemProfile (net/http/pprof does) samples
// one allocation per 512 KiB allocated and records its stack for ever: a
// bucket for each sampled stack, in a hash table of 1.4 MB that the runtime
// maps at the first record and makes resident a page per bucket. The agent
// serves its heap profile only with --pprof (cells/metrics), so without the
// flag those records are memory no one reads (~30 buckets at idle).
// Importing this package stops them: its initializer runs before the
// packages that allocate at init (its only import is the runtime, which
// initializes first, and the linker initializes each package once its
// imports are, in import path order), and Sample turns them on again at
// the rate Go had chosen (512 KiB, or GODEBUG=memprofilerate=N).
//
// Go still records one allocation per processor: each processor's first
// after the rate changes. So the table is mapped anyway
// (runtime.MemStats.BuckHashSys), with a page or two of it resident.
package heapprofile

import "runtime"

// rate is the sampling rate the runtime chose before init turned it off.
var rate = runtime.MemProfileRate

func init() { runtime.MemProfileRate = 0 }

// Sample turns the heap profiler on from now, at the rate Go chose for the
// process. Allocations made while it was off are not in the profile.
func Sample() { runtime.MemProfileRate = rate }

// Rate is the rate Sample sets: Go's default or GODEBUG=memprofilerate.
func Rate() int { return rate }
