package icmpprobe

import "time"

// SetReadWakeup sets how often blocked reads wake up on their own, for
// the test that Close does not depend on it.
func SetReadWakeup(d time.Duration) (restore func()) {
	old := readWakeup
	readWakeup = d
	return func() { readWakeup = old }
}

// AttachReplyFilter is attachReplyFilter for the test of the filter.
var AttachReplyFilter = attachReplyFilter
