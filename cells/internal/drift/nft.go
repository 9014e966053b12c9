package drift

import (
	"context"
	"errors"
	"fmt"

	"github.com/cilium/hive/cell"
	"github.com/google/nftables"
	"github.com/vishvananda/netns"
)

// NFTables follows the nftables changes of one table in a network
// namespace (the nftables monitor) and calls Changed after each batch of
// changes that touched it, or may have: set element updates do not name
// their table. Run it as a job with Retry: a monitor that fails ends Run,
// and the next Run calls Changed first, since changes may have been lost.
type NFTables struct {
	// Netns is the path of the network namespace; "" for the agent's own.
	Netns  string
	Family nftables.TableFamily
	Table  string
	// Changed is called from Run's goroutine.
	Changed func()

	subscribed bool
}

// nftEventBuffer is how many batches of nftables events queue while
// Changed runs: pointers, 8 KB (the monitor's socket buffer cannot be set).
const nftEventBuffer = 1024

// Run monitors until ctx ends.
func (f *NFTables) Run(ctx context.Context, health cell.Health) error {
	var opts []nftables.ConnOption
	if f.Netns != "" {
		ns, err := netns.GetFromPath(f.Netns)
		if err != nil {
			return fmt.Errorf("open network namespace %s: %w", f.Netns, err)
		}
		defer ns.Close()
		opts = append(opts, nftables.WithNetNSFd(int(ns)))
	}
	c, err := nftables.New(opts...)
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	mon := nftables.NewMonitor(nftables.WithMonitorEventBuffer(nftEventBuffer))
	events, err := c.AddMonitor(mon)
	if err != nil {
		return fmt.Errorf("nftables monitor: %w", err)
	}
	defer func() {
		mon.Close()
		for range events {
		}
	}()
	if f.subscribed {
		f.Changed()
	}
	f.subscribed = true
	health.OK("Following nftables changes")
	for {
		var touched bool
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-events:
			if touched, err = f.ours(e, ok); err != nil {
				return err
			}
		}
	more:
		for range maxBatch {
			select {
			case e, ok := <-events:
				mine, err := f.ours(e, ok)
				if err != nil {
					return err
				}
				touched = touched || mine
			default:
				break more
			}
		}
		if touched {
			f.Changed()
		}
	}
}

// ours says whether an event may concern the table; an error ends the
// monitor.
func (f *NFTables) ours(e *nftables.MonitorEvent, open bool) (bool, error) {
	if !open {
		return false, errors.New("nftables monitor ended")
	}
	if e.Type == nftables.MonitorEventTypeOOB {
		return false, fmt.Errorf("nftables monitor: %w", e.Error)
	}
	var t *nftables.Table
	switch d := e.Data.(type) {
	case *nftables.Table:
		t = d
	case *nftables.Chain:
		t = d.Table
	case *nftables.Rule:
		t = d.Table
	case *nftables.Set:
		t = d.Table
	default:
		return true, nil
	}
	return t == nil || (t.Name == f.Table && t.Family == f.Family), nil
}
