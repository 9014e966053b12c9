package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/cellium/cellium/pkg/apiv1"
	"github.com/cellium/cellium/pkg/client"
)

func newCTCmd(stdout io.Writer) *cobra.Command {
	ct := &cobra.Command{Use: "ct", Short: "Inspect and flush the running agent's conntrack maps"}

	var q client.ConntrackQuery
	var endpoint uint
	list := newClientCmd("list", "List the tracked connections: tuple, state, lifetime left, endpoint, counters", cobra.NoArgs,
		func(ctx context.Context, c *client.Client, out *outputFlag, _ []string) error {
			if q.Family != 0 && q.Family != 4 && q.Family != 6 {
				return fmt.Errorf("invalid --family %d: want 4 or 6 (0 for both)", q.Family)
			}
			if endpoint > 65535 {
				return fmt.Errorf("invalid --endpoint %d: want an endpoint ID up to 65535", endpoint)
			}
			if q.Limit < 0 {
				return fmt.Errorf("invalid --limit %d: want a number of entries, 0 for all", q.Limit)
			}
			q.EndpointID = uint16(endpoint)
			entries, err := c.Conntrack(ctx, q)
			if err != nil {
				return err
			}
			return out.print(stdout, entries, func(w io.Writer) error { return printConntrack(w, entries) })
		})
	list.Flags().IntVar(&q.Family, "family", 0, "Only IPv4 (4) or IPv6 (6) connections")
	list.Flags().UintVar(&endpoint, "endpoint", 0, "Only the connections of this endpoint ID")
	list.Flags().IntVar(&q.Limit, "limit", 0, "Print at most this many entries (0: all)")
	ct.AddCommand(list)

	ct.AddCommand(newClientCmd("flush", "Delete every conntrack entry; connections in flight are tracked anew from their next packet", cobra.NoArgs,
		func(ctx context.Context, c *client.Client, out *outputFlag, _ []string) error {
			f, err := c.ConntrackFlush(ctx)
			if err != nil {
				return err
			}
			return out.print(stdout, f, func(w io.Writer) error {
				parts := make([]string, len(f.Maps))
				for i, m := range f.Maps {
					parts[i] = fmt.Sprintf("%s %d", m.Map, m.Deleted)
				}
				_, err := fmt.Fprintf(w, "Deleted %d entries (%s)\n", f.Deleted, strings.Join(parts, ", "))
				return err
			})
		}))

	var run bool
	gc := newClientCmd("gc", "Show the conntrack garbage collector's last pass and interval (--run: run a pass now)", cobra.NoArgs,
		func(ctx context.Context, c *client.Client, out *outputFlag, _ []string) error {
			if run {
				p, err := c.ConntrackGCRun(ctx)
				if err != nil {
					return err
				}
				return out.print(stdout, p, func(w io.Writer) error { return printGCPass(w, p) })
			}
			st, err := c.ConntrackGC(ctx)
			if err != nil {
				return err
			}
			return out.print(stdout, st, func(w io.Writer) error {
				if st.Waiting != "" {
					fmt.Fprintf(w, "Waiting for:  %s\n", st.Waiting)
				}
				fmt.Fprintf(w, "Passes:       %d\nInterval:     %s (%s)\n", st.Passes, time.Duration(st.IntervalSeconds)*time.Second, st.IntervalMode)
				if st.Last == nil {
					return nil
				}
				fmt.Fprintln(w)
				return printGCPass(w, *st.Last)
			})
		})
	gc.Flags().BoolVar(&run, "run", false, "Run a pass now and show it")
	ct.AddCommand(gc)
	return ct
}

// printConntrack writes a row per entry. DIR tells the two entries of a
// connection between two local endpoints apart: "out" is the client's, "in"
// the server's.
func printConntrack(w io.Writer, entries apiv1.ConntrackEntries) error {
	rows := make([][]string, 0, len(entries.Entries))
	for _, e := range entries.Entries {
		endpoint := "-"
		if e.EndpointID != 0 {
			endpoint = fmt.Sprint(e.EndpointID)
		}
		src, dst := hostPort(e.Source, e.SrcPort), hostPort(e.Destination, e.DstPort)
		if e.Protocol == "ICMP" || e.Protocol == "ICMPv6" {
			// The source port is the echo identifier, the other is 0.
			src, dst = fmt.Sprintf("%s id %d", e.Source, e.SrcPort), e.Destination
		}
		rows = append(rows, []string{
			e.Protocol, src, dst, e.Direction, e.State,
			lifetime(e.LifetimeSeconds), endpoint,
			fmt.Sprintf("%d/%d", e.PacketsTx, e.BytesTx), fmt.Sprintf("%d/%d", e.PacketsRx, e.BytesRx),
		})
	}
	if err := writeTable(w, []string{"PROTO", "SOURCE", "DESTINATION", "DIR", "STATE", "EXPIRES", "ENDPOINT", "TX PKTS/BYTES", "RX PKTS/BYTES"}, rows); err != nil {
		return err
	}
	if entries.Truncated {
		_, err := fmt.Fprintf(w, "(first %d entries; --limit 0 shows all)\n", len(entries.Entries))
		return err
	}
	return nil
}

func hostPort(addr string, port uint16) string {
	if strings.Contains(addr, ":") {
		return fmt.Sprintf("[%s]:%d", addr, port)
	}
	return fmt.Sprintf("%s:%d", addr, port)
}

func lifetime(seconds int64) string {
	if seconds <= 0 {
		return "expired"
	}
	return (time.Duration(seconds) * time.Second).String()
}

// printGCPass writes a pass's figures, with a row per map.
func printGCPass(w io.Writer, p apiv1.ConntrackGCPass) error {
	fmt.Fprintf(w, "Pass %d at %s: scanned %d, deleted %d in %s; next in %s\n",
		p.Number, p.Start.Format(time.RFC3339), p.Scanned, p.Deleted,
		time.Duration(p.DurationSeconds*float64(time.Second)).Round(time.Microsecond),
		time.Duration(p.IntervalSeconds)*time.Second)
	if p.Error != "" {
		fmt.Fprintf(w, "Error: %s\n", p.Error)
	}
	rows := make([][]string, 0, len(p.Maps))
	for _, m := range p.Maps {
		rows = append(rows, []string{m.Map, fmt.Sprint(m.Capacity), fmt.Sprint(m.Scanned), fmt.Sprint(m.Expired), fmt.Sprint(m.EndpointGone)})
	}
	return writeTable(w, []string{"MAP", "CAPACITY", "SCANNED", "EXPIRED", "ENDPOINT GONE"}, rows)
}
