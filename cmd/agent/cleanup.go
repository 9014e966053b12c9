package main

import (
	"errors"
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
	"github.com/cellium/cellium/cells/devices"
	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/masquerade"
)

func newCleanupCmd(stdout io.Writer) *cobra.Command {
	// A graph of its own with every cell of the agent, for the same flags
	// as `agent run`: cells contribute what they pinned (and how to undo
	// it) to the bpf-maps Cleaner, so this command knows no path. Building
	// the graph runs constructors only, which do no I/O; nothing starts.
	var (
		cleaner  *bpfmaps.Cleaner
		cniConf  endpointmanager.Config
		devConf  devices.Config
		masqConf masquerade.Config
	)
	h := hive.NewWithOptions(cells.Options(), cells.Agent, cell.Invoke(func(c *bpfmaps.Cleaner, cni endpointmanager.Config, dev devices.Config, masq masquerade.Config) {
		cleaner, cniConf, devConf, masqConf = c, cni, dev, masq
	}))
	flags := pflag.NewFlagSet("agent", pflag.ContinueOnError)
	h.RegisterFlags(flags)

	cmd := &cobra.Command{
		Use:   "cleanup",
		Short: "Detach the agent's BPF programs, remove its pinned links and maps, its nftables table and its CNI configuration",
		Long: "Undo what `agent run` leaves in the kernel on purpose so that traffic keeps\n" +
			"flowing while the agent is down: detach its programs, remove its pinned links\n" +
			"and maps, and the pin directory <bpf-root>/<bpf-map-prefix>; remove its nftables\n" +
			"table inet cellium (pod egress masquerade; not with --enable-masquerade=false);\n" +
			"and remove the CNI\n" +
			"configuration from --cni-conf-dir, so the node takes no more pods. Give it the flags\n" +
			"the agent ran with. Stop the agent first; running it twice is harmless.\n" +
			"Prints one line per object removed.",
		Args:        cobra.NoArgs,
		Annotations: map[string]string{quietLogs: "true"},
		RunE: func(*cobra.Command, []string) error {
			if err := h.Populate(slog.Default()); err != nil {
				return fmt.Errorf("build the cell graph: %w", dig.RootCause(err))
			}
			// The configuration first: with the datapath gone, the node
			// must not be offered pods.
			removed, cniErr := endpointmanager.RemoveCNIConfig(cniConf)
			bpfRemoved, err := cleaner.Remove()
			removed = append(removed, bpfRemoved...)
			// The nftables table of the masquerade cell, in the namespace
			// whose devices the agent watched. An agent run with
			// --enable-masquerade=false owns no table (it removes its own
			// at start), so it leaves any there alone.
			var nftErr error
			if masqConf.EnableMasquerade {
				var nftRemoved []string
				nftRemoved, nftErr = masquerade.Remove(devConf)
				removed = append(removed, nftRemoved...)
			}
			err = errors.Join(cniErr, err, nftErr)
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
