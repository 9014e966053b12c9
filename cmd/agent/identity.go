package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/cellium/cellium/pkg/apiv1"
	"github.com/cellium/cellium/pkg/client"
)

func newIdentityCmd(stdout io.Writer) *cobra.Command {
	cmd := &cobra.Command{Use: "identity", Short: "Show the security identities the running agent knows"}
	table := func(w io.Writer, ids []apiv1.Identity) error {
		rows := make([][]string, 0, len(ids))
		for _, id := range ids {
			rows = append(rows, []string{fmt.Sprint(id.ID), id.Kind, fmt.Sprint(id.Refs), strings.Join(id.Labels, " ")})
		}
		return writeTable(w, []string{"ID", "KIND", "REFS", "LABELS"}, rows)
	}
	cmd.AddCommand(
		newClientCmd("list", "List identities: reserved, cluster-wide and node-local", cobra.NoArgs,
			func(ctx context.Context, c *client.Client, out *outputFlag, _ []string) error {
				ids, err := c.Identities(ctx)
				if err != nil {
					return err
				}
				return out.print(stdout, ids, func(w io.Writer) error { return table(w, ids) })
			}),
		newClientCmd("get ID", "Show one identity, by number or reserved name (host, world, ...)", cobra.ExactArgs(1),
			func(ctx context.Context, c *client.Client, out *outputFlag, args []string) error {
				id, err := c.Identity(ctx, args[0])
				if err != nil {
					return err
				}
				return out.print(stdout, id, func(w io.Writer) error { return table(w, []apiv1.Identity{id}) })
			}),
	)
	return cmd
}
