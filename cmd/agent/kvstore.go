package main

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/cellium/cellium/pkg/client"
	"github.com/cellium/cellium/pkg/cliout"
)

func newKVStoreCmd(stdout io.Writer) *cobra.Command {
	kv := &cobra.Command{Use: "kvstore", Short: "Read the cluster's kvstore through the running agent (read-only)"}
	var recursive bool
	get := newClientCmd("get KEY", "Show a key (relative to --kvstore-prefix), or with --recursive every key under it",
		cobra.RangeArgs(0, 1), func(ctx context.Context, c *client.Client, out *cliout.Output, args []string) error {
			key := ""
			if len(args) == 1 {
				key = args[0]
			}
			if key == "" && !recursive {
				return fmt.Errorf("give a KEY, such as state/identities/v1/id/256, or --recursive")
			}
			keys, err := c.KVStoreKeys(ctx, key, recursive)
			if err != nil {
				return err
			}
			return out.Print(stdout, keys, func(w io.Writer) error {
				rows := make([][]string, 0, len(keys))
				for _, k := range keys {
					lease := ""
					if k.Lease != 0 {
						lease = fmt.Sprintf("%x", k.Lease)
					}
					rows = append(rows, []string{k.Key, k.Value, lease})
				}
				return cliout.WriteTable(w, []string{"KEY", "VALUE", "LEASE"}, rows)
			})
		})
	get.Flags().BoolVar(&recursive, "recursive", false, "Every key under KEY (a prefix)")
	kv.AddCommand(get, newClientCmd("status", "Show the kvstore connection: state, endpoints, leases, last error",
		cobra.NoArgs, func(ctx context.Context, c *client.Client, out *cliout.Output, _ []string) error {
			st, err := c.KVStore(ctx)
			if err != nil {
				return err
			}
			return out.Print(stdout, st, func(w io.Writer) error {
				_, err := fmt.Fprintln(w, "KVStore:", kvstoreLine(st))
				return err
			})
		}))
	return kv
}
