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
		return cliout.WriteTable(w, []string{"PREFIX", "IDENTITY", "SOURCE", "HOST IP", "POD", "SHADOWED", "STATUS"}, rows)
	}
	cmd.AddCommand(listGetCmds[apiv1.IPCacheEntry]{list: (*client.Client).IPCache, get: (*client.Client).IPCacheLookup, table: table}.
		commands(stdout, "List every prefix with its identity and source", "get IP", "Show the longest prefix that holds IP")...)
	return cmd
}
