package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/cellium/cellium/pkg/cliout"
	"github.com/cellium/cellium/pkg/version"
)

func newVersionCmd(stdout io.Writer) *cobra.Command {
	var out cliout.Output
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the agent's version",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			v := version.Get()
			return out.Print(stdout, v, func(w io.Writer) error {
				commit := v.Commit
				if v.Modified {
					commit += " (modified)"
				}
				built := v.BuildDate
				if built == "" {
					built = "unknown"
				}
				_, err := fmt.Fprintf(w, "agent %s\ncommit %s\nbuilt %s\n%s\n", v.Version, commit, built, v.GoVersion)
				return err
			})
		},
	}
	out.Register(cmd)
	return cmd
}
