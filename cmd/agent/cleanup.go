package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/cilium/hive"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/dig"

	"github.com/cellium/cellium/cells/bpfmaps"
	"github.com/cellium/cellium/cells/devices"
	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/masquerade"
)

// cleanupTargets is what `agent cleanup` undoes, as the agent's cell graph
// (the one every command that takes the agent's flags shares) knows it:
// cells contribute what they pinned, and how to undo it, to the bpf-maps
// Cleaner, so this command knows no path. capture is an invoke of that
// graph; only cleanup populates it for this (building the graph runs
// constructors only, which do no I/O; nothing starts).
type cleanupTargets struct {
	cleaner  *bpfmaps.Cleaner
	cniConf  endpointmanager.Config
	devConf  devices.Config
	masqConf masquerade.Config
}

func (t *cleanupTargets) capture(c *bpfmaps.Cleaner, cni endpointmanager.Config, dev devices.Config, masq masquerade.Config) {
	t.cleaner, t.cniConf, t.devConf, t.masqConf = c, cni, dev, masq
}

func newCleanupCmd(h *hive.Hive, agentFlags *pflag.FlagSet, targets *cleanupTargets, stdout io.Writer) *cobra.Command {
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
			removed, cniErr := endpointmanager.RemoveCNIConfig(targets.cniConf)
			bpfRemoved, err := targets.cleaner.Remove()
			removed = append(removed, bpfRemoved...)
			// The nftables table of the masquerade cell, in the namespace
			// whose devices the agent watched. An agent run with
			// --enable-masquerade=false owns no table (it removes its own
			// at start), so it leaves any there alone.
			var nftErr error
			if targets.masqConf.EnableMasquerade {
				var nftRemoved []string
				nftRemoved, nftErr = masquerade.Remove(targets.devConf)
				removed = append(removed, nftRemoved...)
			}
			err = errors.Join(cniErr, err, nftErr)
			for _, line := range removed {
				fmt.Fprintln(stdout, line)
			}
			if len(removed) == 0 && err == nil {
				fmt.Fprintf(stdout, "Nothing to remove in %s\n", targets.cleaner.PinDir())
			}
			return err
		},
	}
	cmd.Flags().AddFlagSet(agentFlags)
	return cmd
}
