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

func newIPAMCmd(stdout io.Writer) *cobra.Command {
	ipam := &cobra.Command{Use: "ipam", Short: "Inspect and reserve the running agent's pod addresses"}
	ipam.AddCommand(newClientCmd("list", "List the pod pools and every allocated address (-o json: the allocations)", cobra.NoArgs,
		func(ctx context.Context, c *client.Client, out *cliout.Output, _ []string) error {
			st, err := c.IPAM(ctx)
			if err != nil {
				return err
			}
			return out.Print(stdout, st.Allocations, func(w io.Writer) error {
				ready := "ready"
				if !st.Ready {
					ready = fmt.Sprintf("not ready, waiting for %v", st.Pending)
				}
				fmt.Fprintf(w, "Mode:  %s (%s)\n", st.Mode, ready)
				for _, p := range st.Pools {
					fmt.Fprintf(w, "Pool:  %s  router %s  %d/%d used\n", p.CIDR, p.Router, p.Used, p.Size)
				}
				fmt.Fprintln(w)
				rows := [][]string{}
				for _, a := range st.Allocations {
					rows = append(rows, []string{a.IP, a.Owner, a.State, since(a.Since)})
				}
				return cliout.WriteTable(w, []string{"IP", "OWNER", "STATE", "AGE"}, rows)
			})
		}))

	var req apiv1.IPAMReserve
	reserve := newClientCmd("reserve", "Reserve an address (--ip) or the next free one of --family for --owner, until released", cobra.NoArgs,
		func(ctx context.Context, c *client.Client, out *cliout.Output, _ []string) error {
			a, err := c.ReserveIP(ctx, req)
			if err != nil {
				return err
			}
			return out.Print(stdout, a, func(w io.Writer) error { return printAllocation(w, a) })
		})
	reserve.Flags().StringVar(&req.Owner, "owner", "", "Who the address is for")
	reserve.Flags().StringVar(&req.IP, "ip", "", "The address to reserve")
	reserve.Flags().StringVar(&req.Family, "family", "", "Reserve the next free address of this family: ipv4 or ipv6")
	ipam.AddCommand(reserve)

	ipam.AddCommand(newClientCmd("release IP", "Release a reserved address, or one left unclaimed by a restart", cobra.ExactArgs(1),
		func(ctx context.Context, c *client.Client, out *cliout.Output, args []string) error {
			a, err := c.ReleaseIP(ctx, args[0])
			if err != nil {
				return err
			}
			return out.Print(stdout, a, func(w io.Writer) error { return printAllocation(w, a) })
		}))
	return ipam
}

func printAllocation(w io.Writer, a apiv1.IPAMAllocation) error {
	return cliout.WriteTable(w, []string{"IP", "OWNER", "STATE", "SINCE"},
		[][]string{{a.IP, a.Owner, a.State, a.Since.Format(time.RFC3339)}})
}
