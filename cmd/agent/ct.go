package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/cellium/cellium/pkg/apiv1"
	"github.com/cellium/cellium/pkg/client"
	"github.com/cellium/cellium/pkg/cliout"
)

func newCTCmd(stdout io.Writer) *cobra.Command {
	ct := &cobra.Command{Use: "ct", Short: "Inspect and flush the running agent's conntrack maps"}

	var q client.ConntrackQuery
	var endpoint uint
	list := newClientCmd("list", "List the tracked connections: tuple, state, lifetime left, endpoint, counters", cobra.NoArgs,
		func(ctx context.Context, c *client.Client, out *cliout.Output, _ []string) error {
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
			return listConntrack(ctx, c, q, newCTPrinter(stdout, out.Format()))
		})
	list.Flags().IntVar(&q.Family, "family", 0, "Only IPv4 (4) or IPv6 (6) connections")
	list.Flags().UintVar(&endpoint, "endpoint", 0, "Only the connections of this endpoint ID")
	list.Flags().IntVar(&q.Limit, "limit", 0, "Print at most this many entries (0: all)")
	list.Flags().StringVar(&q.After, "after", "", "Start after this cursor (the one a listing cut short by --limit printed)")
	ct.AddCommand(list)

	ct.AddCommand(newClientCmd("flush", "Delete every conntrack entry; connections in flight are tracked anew from their next packet", cobra.NoArgs,
		func(ctx context.Context, c *client.Client, out *cliout.Output, _ []string) error {
			f, err := c.ConntrackFlush(ctx)
			if err != nil {
				return err
			}
			return out.Print(stdout, f, func(w io.Writer) error {
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
		func(ctx context.Context, c *client.Client, out *cliout.Output, _ []string) error {
			if run {
				p, err := c.ConntrackGCRun(ctx)
				if err != nil {
					return err
				}
				return out.Print(stdout, p, func(w io.Writer) error { return printGCPass(w, p) })
			}
			st, err := c.ConntrackGC(ctx)
			if err != nil {
				return err
			}
			return out.Print(stdout, st, func(w io.Writer) error {
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

// ctPageSize is how many entries `agent ct list` asks the agent for at a
// time: neither the agent nor the client ever holds more than a page of a
// conntrack table that may have millions of entries.
var ctPageSize = 4096

// listConntrack pages through the listing q asks for and prints each page
// as it arrives.
func listConntrack(ctx context.Context, c *client.Client, q client.ConntrackQuery, p *ctPrinter) error {
	printed := 0
	for {
		page := q
		page.Limit = ctPageSize
		if q.Limit > 0 {
			page.Limit = min(ctPageSize, q.Limit-printed)
		}
		entries, err := c.Conntrack(ctx, page)
		if err != nil {
			return err
		}
		if err := p.entries(entries.Entries); err != nil {
			return err
		}
		printed += len(entries.Entries)
		switch {
		case !entries.Truncated:
			return p.end("")
		case q.Limit > 0 && printed >= q.Limit:
			return p.end(entries.Next)
		}
		q.After = entries.Next
	}
}

// ctPrinter prints a listing page by page: a table whose columns are as
// wide as the first page needs (a wider cell later pushes its row), or the
// JSON of apiv1.ConntrackEntries, written as the entries come.
type ctPrinter struct {
	w      io.Writer
	json   bool
	n      int
	widths []int
}

func newCTPrinter(w io.Writer, format string) *ctPrinter {
	return &ctPrinter{w: w, json: format == "json"}
}

var ctHeader = []string{"PROTO", "SOURCE", "DESTINATION", "DIR", "STATE", "EXPIRES", "ENDPOINT", "TX PKTS/BYTES", "RX PKTS/BYTES"}

func (p *ctPrinter) entries(entries []apiv1.ConntrackEntry) error {
	if p.json {
		for _, e := range entries {
			b, err := json.MarshalIndent(e, "    ", "  ")
			if err != nil {
				return err
			}
			sep := ",\n    "
			if p.n == 0 {
				sep = "{\n  \"entries\": [\n    "
			}
			p.n++
			if _, err := fmt.Fprintf(p.w, "%s%s", sep, b); err != nil {
				return err
			}
		}
		return nil
	}
	rows := make([][]string, 0, len(entries))
	for _, e := range entries {
		rows = append(rows, conntrackRow(e))
	}
	if p.widths == nil {
		p.widths = make([]int, len(ctHeader))
		for _, row := range append([][]string{ctHeader}, rows...) {
			for i, cell := range row {
				p.widths[i] = max(p.widths[i], len(cell))
			}
		}
		if err := p.row(ctHeader); err != nil {
			return err
		}
	}
	for _, row := range rows {
		if err := p.row(row); err != nil {
			return err
		}
	}
	p.n += len(entries)
	return nil
}

func (p *ctPrinter) row(cells []string) error {
	var b strings.Builder
	for i, cell := range cells {
		b.WriteString(cell)
		if i < len(cells)-1 {
			b.WriteString(strings.Repeat(" ", max(p.widths[i]-len(cell), 0)+3))
		}
	}
	b.WriteByte('\n')
	_, err := io.WriteString(p.w, b.String())
	return err
}

// end closes the listing; next is the cursor to go on from when --limit
// cut it short.
func (p *ctPrinter) end(next string) error {
	if p.json {
		tail := "\n  ]"
		if p.n == 0 {
			tail = "{\n  \"entries\": []"
		}
		if next != "" {
			tail += fmt.Sprintf(",\n  \"truncated\": true,\n  \"next\": %q", next)
		}
		_, err := fmt.Fprintf(p.w, "%s\n}\n", tail)
		return err
	}
	if p.widths == nil {
		if err := p.entries(nil); err != nil {
			return err
		}
	}
	if next != "" {
		_, err := fmt.Fprintf(p.w, "(first %d entries; --after %s shows the next, --limit 0 all)\n", p.n, next)
		return err
	}
	return nil
}

// conntrackRow is an entry's table row. DIR tells the two entries of a
// connection between two local endpoints apart: "out" is the client's, "in"
// the server's.
func conntrackRow(e apiv1.ConntrackEntry) []string {
	endpoint := "-"
	if e.EndpointID != 0 {
		endpoint = fmt.Sprint(e.EndpointID)
	}
	src, dst := hostPort(e.Source, e.SrcPort), hostPort(e.Destination, e.DstPort)
	if e.Protocol == "ICMP" || e.Protocol == "ICMPv6" {
		// The source port is the echo identifier, the other is 0.
		src, dst = fmt.Sprintf("%s id %d", e.Source, e.SrcPort), e.Destination
	}
	return []string{
		e.Protocol, src, dst, e.Direction, e.State,
		lifetime(e.LifetimeSeconds), endpoint,
		fmt.Sprintf("%d/%d", e.PacketsTx, e.BytesTx), fmt.Sprintf("%d/%d", e.PacketsRx, e.BytesRx),
	}
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
	return cliout.WriteTable(w, []string{"MAP", "CAPACITY", "SCANNED", "EXPIRED", "ENDPOINT GONE"}, rows)
}
