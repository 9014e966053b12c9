// Command cellium-dev is the developer's tooling, kept out of the agent so
// that the daemon links none of it (docs/performance.md, "Memory at idle"):
//
//	cellium-dev cluster      a cluster of agents on this machine (up, pod, exec, status, relay, outside, down)
//
// `make build` puts it in bin/ beside the agent and the CNI plugin, which
// `cellium-dev cluster up` runs. See docs/dev-cluster.md.
package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/spf13/cobra"

	"github.com/cellium/cellium/pkg/logging"
)

func main() {
	os.Exit(execute(os.Args[1:], os.Stdout, os.Stderr))
}

// exitCodeError ends the program with a command's exit code; the command
// said why itself.
type exitCodeError struct{ code int }

func (e exitCodeError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// execute runs the command line args and returns the exit code.
func execute(args []string, stdout, stderr io.Writer) int {
	root := newRootCmd(stdout, stderr)
	root.SetArgs(args)
	if err := root.Execute(); err != nil {
		if ec, ok := errors.AsType[exitCodeError](err); ok {
			return ec.code
		}
		fmt.Fprintf(stderr, "Error: %v\n", err)
		return 1
	}
	return 0
}

func newRootCmd(stdout, stderr io.Writer) *cobra.Command {
	var logLevel, logFormat string
	root := &cobra.Command{
		Use:           "cellium-dev",
		Short:         "Cellium's developer tooling: a cluster of agents on this machine",
		SilenceUsage:  true,
		SilenceErrors: true,
		CompletionOptions: cobra.CompletionOptions{
			DisableDefaultCmd: true,
		},
		PersistentPreRunE: func(*cobra.Command, []string) error {
			log, err := logging.New(stderr, logLevel, logFormat)
			if err != nil {
				return err
			}
			slog.SetDefault(log)
			return nil
		},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	pf := root.PersistentFlags()
	pf.StringVar(&logLevel, "log-level", "info", "Log level: debug, info, warn or error")
	pf.StringVar(&logFormat, "log-format", logging.FormatAuto, "Log format: auto (text on a terminal, else JSON), text or json")
	root.AddCommand(newClusterCmd(stdout, stderr))
	return root
}
