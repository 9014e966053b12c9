// Package masqtest helps tests of the masquerade cell and of clusters that
// run it see what happens to nftables.
package masqtest

import (
	"fmt"
	"testing"

	"github.com/google/nftables"
)

// WatchNFT records the nftables changes in the network namespace of the
// file descriptor ns from now; the function it returns stops and lists
// them, one line each.
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
	done := make(chan struct{})
	go func() {
		defer close(done)
		for e := range events {
			got = append(got, fmt.Sprintf("%d %+v", e.Type, e.Data))
		}
	}()
	return func() []string {
		mon.Close()
		<-done
		return got
	}
}
