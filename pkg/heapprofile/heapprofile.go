// Package heapprofile turns Go's heap profiler off from package
// initialization on, and back on for a process that serves its profiles.
//
// Any Go binary that links runtime.MemProfile (net/http/pprof does) samples
// one allocation per 512 KiB allocated and records its stack for ever: a
// bucket for each sampled stack, in a hash table the runtime maps (1.4 MB)
// at the first sample. The agent serves its heap profile only with --pprof
// (cells/metrics), so without the flag those samples are memory no one
// reads. Importing this package stops them: its initializer runs before the
// packages that allocate most at init (its only import is the runtime,
// which initializes first, and the linker initializes each package once
// its imports are, in import path order), and Sample turns them on again at
// the rate Go had chosen (512 KiB, or GODEBUG=memprofilerate=N).
//
// An allocation sampled before this initializer runs (one in 512 KiB of
// those made by the initializers before it, a few tens of KB) still maps
// the table, of which only the pages it writes become resident.
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
