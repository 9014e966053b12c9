// Command agent is the Cellium node agent and its client.
//
//	agent run [flags]        run the agent (root)
//	agent hive [dot-graph]   print the cell graph for the same flags
//	agent status             health of the running agent
//	agent config             its effective configuration
//	agent db list|show       its StateDB tables
//	agent map list           the BPF maps it owns
//	agent endpoint list|get  its endpoints (one per pod)
//	agent ipam list          its pod address pools and allocations
//	agent service list|get   the services it load-balances
//	agent ct list|flush|gc   its conntrack maps and their garbage collection
//	agent monitor            its datapath events and notifications, live
//	agent observe            Hubble flows from its Hubble server
//	agent install-cni        copy the CNI plugin into the host's CNI bin directory
//	agent version
//
// The developer tools (a cluster of agents on this machine) are another
// binary, cmd/cellium-dev: the daemon links none of their code.
//
// Every flag can also be set with AGENT_<FLAG> in the environment or with a
// file named after the flag in --config-dir.
package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"

	"github.com/cilium/hive/cell"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/cellium/cellium/cells"
	"github.com/cellium/cellium/pkg/flagsource"
	// The heap profile is sampled only with --pprof (cells/metrics).
	_ "github.com/cellium/cellium/pkg/heapprofile/off"
	"github.com/cellium/cellium/pkg/logging"
)

func main() {
	os.Exit(execute(os.Args[1:], os.Stdout, os.Stderr))
}

// execute runs the command line args and returns the exit code.
func execute(args []string, stdout, stderr io.Writer) int {
	origins := flagsource.Origins{}
	root := newRootCmd(stdout, stderr, origins)
	root.SetArgs(args)
	if err := root.Execute(); err != nil {
		fmt.Fprintf(stderr, "Error: %v\n", origins.Explain(err))
		return 1
	}
	return 0
}

// quietLogs marks commands that log only warnings unless --log-level is given.
const quietLogs = "quiet-logs"

// globalFlags are the flags of every command.
type globalFlags struct {
	logLevel  string
	logFormat string
	configDir string
}

// newRootCmd builds the command tree; origins learns where the flags that
// came from the environment or --config-dir got their values.
func newRootCmd(stdout, stderr io.Writer, origins flagsource.Origins) *cobra.Command {
	var g globalFlags
	// One hive serves every command that takes the agent's flags: its flags
	// are registered on each of them, and only the command that runs uses it
	// (`agent cleanup` through the invoke that captures its targets).
	cleanup := &cleanupTargets{}
	h := cells.NewHive(cell.Invoke(cleanup.capture))
	agentFlags := pflag.NewFlagSet("agent", pflag.ContinueOnError)
	h.RegisterFlags(agentFlags)

	root := &cobra.Command{
		Use:           "agent",
		Short:         "Cellium node networking agent",
		SilenceUsage:  true,
		SilenceErrors: true,
		CompletionOptions: cobra.CompletionOptions{
			DisableDefaultCmd: true,
		},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		if invalid, ok := errors.AsType[*pflag.InvalidValueError](err); ok {
			return fmt.Errorf("%w (want %s)", err, flagsource.WantedForm(invalid.GetFlag()))
		}
		return err
	})
	pf := root.PersistentFlags()
	pf.StringVar(&g.logLevel, "log-level", "info", "Log level: debug, info, warn or error")
	pf.StringVar(&g.logFormat, "log-format", logging.FormatAuto, "Log format: auto (text on a terminal, else JSON), text or json")
	pf.StringVar(&g.configDir, "config-dir", "", "Directory with one file per flag, named after it (a mounted ConfigMap)")

	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		if err := resolveFlags(cmd.Flags(), agentFlags, root.PersistentFlags(), origins); err != nil {
			return err
		}
		level := g.logLevel
		if cmd.Annotations[quietLogs] != "" && !cmd.Flags().Changed("log-level") {
			// Inspection commands build the graph, which logs every
			// constructor; only problems are worth showing there.
			level = "warn"
		}
		log, err := logging.New(stderr, level, g.logFormat)
		if err != nil {
			return err
		}
		slog.SetDefault(log)
		return nil
	}

	root.AddCommand(
		newRunCmd(h, agentFlags),
		newHiveCmd(h, agentFlags, stdout),
		newVersionCmd(stdout),
		newStatusCmd(stdout),
		newConfigCmd(stdout),
		newDBCmd(stdout),
		newMapCmd(stdout),
		newEndpointCmd(stdout),
		newIPAMCmd(stdout),
		newKVStoreCmd(stdout),
		newIdentityCmd(stdout),
		newPolicyCmd(stdout),
		newIPCacheCmd(stdout),
		newNodeCmd(stdout),
		newHealthCmd(stdout),
		newCleanupCmd(h, agentFlags, cleanup, stdout),
		newInstallCNICmd(stdout),
		newServiceCmd(stdout),
		newCTCmd(stdout),
		newMonitorCmd(stdout),
		newObserveCmd(stdout, agentFlags),
		newMovedDevClusterCmd(),
	)
	return root
}

// resolveFlags fills the command's unset flags from AGENT_* variables and
// --config-dir. The config dir may hold any of the agent's flags, even those
// this command does not take.
func resolveFlags(cmdFlags, agentFlags, rootFlags *pflag.FlagSet, origins flagsource.Origins) error {
	// --config-dir itself may come from the environment.
	dirOnly := pflag.NewFlagSet("", pflag.ContinueOnError)
	dirOnly.AddFlag(cmdFlags.Lookup("config-dir"))
	if err := (flagsource.Sources{EnvPrefix: cells.EnvPrefix, Origins: origins}).Apply(dirOnly); err != nil {
		return err
	}

	var known []string
	for _, fs := range []*pflag.FlagSet{agentFlags, rootFlags} {
		fs.VisitAll(func(f *pflag.Flag) { known = append(known, f.Name) })
	}
	slices.Sort(known)
	return flagsource.Sources{
		EnvPrefix: cells.EnvPrefix,
		ConfigDir: cmdFlags.Lookup("config-dir").Value.String(),
		Known:     known,
		Origins:   origins,
	}.Apply(cmdFlags)
}

// newMovedDevClusterCmd is what is left of `agent dev-cluster`, which moved
// to `cellium-dev cluster` so that the daemon links none of the developer
// tooling: it says what to run instead.
func newMovedDevClusterCmd() *cobra.Command {
	return &cobra.Command{
		Use:                "dev-cluster",
		Short:              "Moved: cellium-dev cluster",
		Hidden:             true,
		DisableFlagParsing: true,
		// Not the root's: nothing to resolve or log.
		PersistentPreRunE: func(*cobra.Command, []string) error { return nil },
		RunE: func(_ *cobra.Command, args []string) error {
			return fmt.Errorf("agent dev-cluster moved to its own binary: run %s (make build puts bin/cellium-dev beside bin/agent; docs/dev-cluster.md)",
				strings.Join(append([]string{"cellium-dev", "cluster"}, args...), " "))
		},
	}
}
