package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/cilium/hive"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/dig"

	"github.com/cellium/cellium/pkg/client"
	"github.com/cellium/cellium/pkg/logging"
	"github.com/cellium/cellium/pkg/version"
)

func newRunCmd(h *hive.Hive, agentFlags *pflag.FlagSet) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the agent",
		Long: "Run the agent until SIGINT or SIGTERM (a second one exits at once, naming the\n" +
			"start or stop hook still running). Without a cluster (no --kubeconfig and not\n" +
			"in a pod) it runs with embedded defaults. Needs root: it mounts bpffs, pins BPF\n" +
			"maps and writes /proc/sys.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := slog.Default()
			// Only here: klog's logger is global, and only the agent runs
			// client-go (the client commands run in tests beside hives).
			logging.RouteKlog(log)
			log.Info("Cellium agent starting", "version", version.Get().Version, "commit", version.Get().Commit)
			if os.Geteuid() != 0 {
				log.Warn("Not running as root: mounting bpffs, pinning BPF maps and writing /proc/sys will fail")
			}
			signals := make(chan os.Signal, 2)
			signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
			defer signal.Stop(signals)
			return runUntilSignalled(h, log, signals)
		},
	}
	cmd.Flags().AddFlagSet(agentFlags)
	return cmd
}

func newHiveCmd(h *hive.Hive, agentFlags *pflag.FlagSet, stdout io.Writer) *cobra.Command {
	var running bool
	cmd := &cobra.Command{
		Use:   "hive",
		Short: "Print the cell graph: modules, providers, config and start/stop hooks",
		Long: "Print the agent's cell graph for the given flags, as `agent run` would build it:\n" +
			"every module, what it provides and needs, its configuration and the order of the\n" +
			"start and stop hooks. Builds the graph without starting anything, so it needs no\n" +
			"root. With --running, print the graph of the agent serving on --api-socket.",
		Args:        cobra.NoArgs,
		Annotations: map[string]string{quietLogs: "true"},
		RunE: func(cmd *cobra.Command, _ []string) error {
			if running {
				socket, _ := cmd.Flags().GetString("api-socket")
				objs, err := client.New(socket).Hive(context.Background())
				if err != nil {
					return err
				}
				_, err = io.WriteString(stdout, objs.Objects)
				return err
			}
			return printObjects(h, stdout)
		},
	}
	cmd.Flags().BoolVar(&running, "running", false, "Ask the running agent instead of building the graph here")
	cmd.PersistentFlags().AddFlagSet(agentFlags)
	cmd.AddCommand(&cobra.Command{
		Use:         "dot-graph",
		Short:       "Print the dependency graph in graphviz dot format",
		Args:        cobra.NoArgs,
		Annotations: map[string]string{quietLogs: "true"},
		RunE: func(*cobra.Command, []string) error {
			if err := h.PrintDotGraph(); err != nil {
				return fmt.Errorf("build the cell graph: %w", err)
			}
			return nil
		},
	})
	return cmd
}

// printObjects prints the graph, or only the error when it cannot be built
// (PrintObjects prints a long dump of the dig error itself).
func printObjects(h *hive.Hive, stdout io.Writer) error {
	if err := h.Populate(slog.New(withoutInvokeFailed{slog.Default().Handler()})); err != nil {
		return fmt.Errorf("build the cell graph: %w", dig.RootCause(err))
	}
	return h.PrintObjects(stdout, slog.Default())
}
