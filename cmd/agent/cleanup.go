package main

import (
	"fmt"
	"io"
	"log/slog"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/dig"

	"github.com/cellium/cellium/cells"
	"github.com/cellium/cellium/cells/bpfmaps"
)

func newCleanupCmd(stdout io.Writer) *cobra.Command {
	// A graph of its own with every cell of the agent, for the same flags
	// as `agent run`: cells contribute what they pinned (and how to undo
	// it) to the bpf-maps Cleaner, so this command knows no path. Building
	// the graph runs constructors only, which do no I/O; nothing starts.
	var cleaner *bpfmaps.Cleaner
	h := hive.NewWithOptions(cells.Options(), cells.Agent, cell.Invoke(func(c *bpfmaps.Cleaner) { cleaner = c }))
	flags := pflag.NewFlagSet("agent", pflag.ContinueOnError)
	h.RegisterFlags(flags)

	cmd := &cobra.Command{
		Use:   "cleanup",
		Short: "Detach the agent's BPF programs and remove its pinned links and maps",
		Long: "Undo what `agent run` leaves in the kernel on purpose so that traffic keeps\n" +
			"flowing while the agent is down: detach its programs, remove its pinned links\n" +
			"and maps, and the pin directory <bpf-root>/<bpf-map-prefix>. Give it the flags\n" +
			"the agent ran with. Stop the agent first; running it twice is harmless.\n" +
			"Prints one line per object removed.",
		Args:        cobra.NoArgs,
		Annotations: map[string]string{quietLogs: "true"},
		RunE: func(*cobra.Command, []string) error {
			if err := h.Populate(slog.Default()); err != nil {
				return fmt.Errorf("build the cell graph: %w", dig.RootCause(err))
			}
			removed, err := cleaner.Remove()
			for _, line := range removed {
				fmt.Fprintln(stdout, line)
			}
			if len(removed) == 0 && err == nil {
				fmt.Fprintf(stdout, "Nothing to remove in %s\n", cleaner.PinDir())
			}
			return err
		},
	}
	cmd.Flags().AddFlagSet(flags)
	return cmd
}
