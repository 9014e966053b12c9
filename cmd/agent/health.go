package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/cellium/cellium/pkg/apiv1"
	"github.com/cellium/cellium/pkg/client"
	"github.com/cellium/cellium/pkg/cliout"
)

func newHealthCmd(stdout io.Writer) *cobra.Command {
	cmd := &cobra.Command{Use: "health", Short: "Show how the running agent reaches the other nodes"}
	var probe bool
	status := newClientCmd("status", "Cluster health: each node's address (ICMP, HTTP) and health endpoint (HTTP), as the last probes found them", cobra.NoArgs,
		func(ctx context.Context, c *client.Client, out *cliout.Output, _ []string) error {
			h, err := c.ClusterHealth(ctx, probe)
			if err != nil {
				return err
			}
			return out.Print(stdout, h, func(w io.Writer) error {
				fmt.Fprintln(w, h.Summary)
				rows := make([][]string, 0, len(h.Nodes))
				for _, n := range h.Nodes {
					name := n.Node
					if n.Local {
						name += " (local)"
					}
					rows = append(rows, []string{name, probeCell(n.HostICMP), probeCell(n.HostHTTP), probeCell(n.EndpointHTTP),
						n.LastProbe.Format(time.RFC3339)})
				}
				return cliout.WriteTable(w, []string{"NODE", "HOST ICMP", "HOST HTTP", "ENDPOINT HTTP", "LAST PROBE"}, rows)
			})
		})
	status.Flags().BoolVar(&probe, "probe", false, "Probe every node now instead of showing the last round")
	cmd.AddCommand(status)
	return cmd
}

func probeCell(p apiv1.HealthProbe) string {
	switch {
	case p.Addr == "":
		return "-"
	case p.OK:
		return fmt.Sprintf("%s ok %s", p.Addr, time.Duration(p.LatencySeconds*float64(time.Second)).Round(10*time.Microsecond))
	}
	return fmt.Sprintf("%s FAILED: %s", p.Addr, p.Error)
}
