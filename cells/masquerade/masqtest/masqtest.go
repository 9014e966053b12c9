// Package masqtest helps tests of the masquerade cell and of clusters that
// run it see what happens to nftables.
package masqtest

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/google/nftables"
)

// WatchNFT records the nftables changes in the network namespace of the
// file descriptor ns from now; the function it returns stops and lists
// them, one line each. A failure of the monitor while it watches is a
// line too (changes may have been missed, so a test that expects none
// fails); the monitor's own report of its closing is not: the library
// sends one out-of-band event for some errors of a closed socket.
func WatchNFT(t testing.TB, ns int) func() []string {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(ns))
	if err != nil {
		t.Fatal(err)
	}
	mon := nftables.NewMonitor()
	events, err := c.AddMonitor(mon)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	var closing atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		for e := range events {
			if e.Type == nftables.MonitorEventTypeOOB {
				if !closing.Load() {
					got = append(got, fmt.Sprintf("the nftables monitor failed, changes may be missing: %v", e.Error))
				}
				continue
			}
			got = append(got, fmt.Sprintf("%d %+v", e.Type, e.Data))
		}
	}()
	return func() []string {
		closing.Store(true)
		mon.Close()
		<-done
		return got
	}
}
