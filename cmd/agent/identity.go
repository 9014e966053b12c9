package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/cellium/cellium/pkg/apiv1"
	"github.com/cellium/cellium/pkg/client"
	"github.com/cellium/cellium/pkg/cliout"
)

func newIdentityCmd(stdout io.Writer) *cobra.Command {
	cmd := &cobra.Command{Use: "identity", Short: "Show the security identities the running agent knows"}
	table := func(w io.Writer, ids []apiv1.Identity) error {
		rows := make([][]string, 0, len(ids))
		for _, id := range ids {
			rows = append(rows, []string{fmt.Sprint(id.ID), id.Kind, id.Source, fmt.Sprint(id.Refs), strings.Join(id.Labels, " ")})
		}
		return cliout.WriteTable(w, []string{"ID", "KIND", "SOURCE", "REFS", "LABELS"}, rows)
	}
	cmd.AddCommand(listGetCmds[apiv1.Identity]{list: (*client.Client).Identities, get: (*client.Client).Identity, table: table}.
		commands(stdout, "List identities: reserved, cluster-wide and node-local",
			"get ID", "Show one identity, by number or reserved name (host, world, ...)")...)
	return cmd
}
