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

func newIPCacheCmd(stdout io.Writer) *cobra.Command {
	cmd := &cobra.Command{Use: "ipcache", Short: "Show which security identity each address has (the ipcache)"}
	table := func(w io.Writer, es []apiv1.IPCacheEntry) error {
		rows := make([][]string, 0, len(es))
		for _, e := range es {
			pod := ""
			if e.PodName != "" {
				pod = e.Namespace + "/" + e.PodName
			}
			rows = append(rows, []string{e.Prefix, fmt.Sprint(e.Identity), e.Source, e.HostIP, pod, strings.Join(e.Shadowed, ","), e.Status})
		}
		return writeTable(w, []string{"PREFIX", "IDENTITY", "SOURCE", "HOST IP", "POD", "SHADOWED", "STATUS"}, rows)
	}
	cmd.AddCommand(
		newClientCmd("list", "List every prefix with its identity and source", cobra.NoArgs,
			func(ctx context.Context, c *client.Client, out *outputFlag, _ []string) error {
				es, err := c.IPCache(ctx)
				if err != nil {
					return err
				}
				return out.print(stdout, es, func(w io.Writer) error { return table(w, es) })
			}),
		newClientCmd("get IP", "Show the longest prefix that holds IP", cobra.ExactArgs(1),
			func(ctx context.Context, c *client.Client, out *outputFlag, args []string) error {
				e, err := c.IPCacheLookup(ctx, args[0])
				if err != nil {
					return err
				}
				return out.print(stdout, e, func(w io.Writer) error { return table(w, []apiv1.IPCacheEntry{e}) })
			}),
	)
	return cmd
}
