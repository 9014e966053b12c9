package main

import (
	"io"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/cellium/cellium/pkg/apiv1"
	"github.com/cellium/cellium/pkg/client"
	"github.com/cellium/cellium/pkg/cliout"
)

func newNodeCmd(stdout io.Writer) *cobra.Command {
	cmd := &cobra.Command{Use: "node", Short: "Show the nodes of the cluster the running agent knows"}
	table := func(w io.Writer, nodes []apiv1.Node) error {
		rows := make([][]string, 0, len(nodes))
		for _, n := range nodes {
			addrs := make([]string, len(n.Addresses))
			for i, a := range n.Addresses {
				addrs[i] = a.IP
			}
			rows = append(rows, []string{n.Name, strconv.FormatBool(n.Local), n.Source, strings.Join(addrs, ","),
				strings.Join(n.PodCIDRs, ","), strings.Join(n.HealthIPs, ","), strings.Join(n.Problems, "; ")})
		}
		return cliout.WriteTable(w, []string{"NAME", "LOCAL", "SOURCE", "ADDRESSES", "POD CIDRS", "HEALTH IPS", "PROBLEMS"}, rows)
	}
	cmd.AddCommand(listGetCmds[apiv1.Node]{list: (*client.Client).Nodes, get: (*client.Client).Node, table: table}.
		commands(stdout, "List the nodes: addresses, pod CIDRs, where their description comes from", "get NAME", "Show one node")...)
	return cmd
}
