package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/cellium/cellium/cells/api"
	"github.com/cellium/cellium/pkg/apiv1"
	"github.com/cellium/cellium/pkg/client"
	"github.com/cellium/cellium/pkg/cliout"
	"github.com/cellium/cellium/pkg/monitorapi"
)

// newMonitorCmd is `agent monitor`: the running agent's decoded datapath
// events and notifications, as they happen, until interrupted.
func newMonitorCmd(stdout io.Writer) *cobra.Command {
	var (
		out     cliout.Output
		types   []string
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "monitor",
		Short: "Stream the running agent's datapath events (trace, drop, sock-lb, policy-verdict) and notifications until interrupted",
		Long: `Stream the running agent's datapath events and notifications until interrupted.

Each line is one event: trace (a program passed a packet), drop (a program
dropped one, with the reason), sock-lb (a socket program translated a
service address), agent (an endpoint or service changed, the agent started).
The agent never waits for a slow reader: when this command falls behind, the
events it lost are counted on a "lost" line, as are events the datapath could
not write because its ring buffer was full.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, t := range types {
				if !slices.Contains(monitorapi.Kinds, t) {
					return fmt.Errorf("invalid --type %q: want %s", t, strings.Join(monitorapi.Kinds, ", "))
				}
			}
			ctx, cancel := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer cancel()
			// The timeout bounds opening the stream, not the stream.
			ctx, cancelStream := context.WithCancel(ctx)
			defer cancelStream()
			openTimer := time.AfterFunc(timeout, cancelStream)
			socket, _ := cmd.Flags().GetString("api-socket")
			s, err := client.New(socket).Monitor(ctx, types...)
			if !openTimer.Stop() {
				return fmt.Errorf("the agent at %s did not open the monitor stream within --timeout %s", socket, timeout)
			}
			if err != nil {
				return err
			}
			defer s.Close()
			return printMonitor(ctx, stdout, s, out.Format() == "json")
		},
	}
	api.DefaultConfig.Flags(cmd.Flags())
	cmd.Flags().StringSliceVarP(&types, "type", "t", nil, "Only events of these types: "+strings.Join(monitorapi.Kinds, ", "))
	cmd.Flags().DurationVar(&timeout, "timeout", 30*time.Second, "How long to wait for the agent to open the stream")
	out.Register(cmd)
	return cmd
}

// printMonitor prints the stream's messages until it ends or ctx does.
// JSON output is the stream's own lines: one apiv1.MonitorMessage each.
func printMonitor(ctx context.Context, w io.Writer, s *client.Stream[apiv1.MonitorMessage], asJSON bool) error {
	enc := json.NewEncoder(w)
	for {
		msg, err := s.Recv()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("monitor stream: %w", err)
		}
		if asJSON {
			if err := enc.Encode(msg); err != nil {
				return err
			}
			continue
		}
		if err := printMonitorLine(w, msg); err != nil {
			return err
		}
	}
}

func printMonitorLine(w io.Writer, msg apiv1.MonitorMessage) error {
	if msg.Kind == apiv1.MonitorLostKind {
		_, err := fmt.Fprintf(w, "lost: %d events (this client fell behind), %d events (datapath ring buffer full)\n",
			msg.Lost.Stream, msg.Lost.Datapath)
		return err
	}
	ev, err := client.MonitorEvent(msg)
	if err != nil {
		// A newer agent's event: show it raw rather than stop.
		_, err = fmt.Fprintf(w, "%s %s\n", msg.Kind, msg.Event)
		return err
	}
	var at time.Time
	switch ev := ev.(type) {
	case *monitorapi.TraceEvent:
		at = ev.Time
	case *monitorapi.DropEvent:
		at = ev.Time
	case *monitorapi.SockLBEvent:
		at = ev.Time
	case *monitorapi.PolicyVerdictEvent:
		at = ev.Time
	case *monitorapi.AgentEvent:
		at = ev.Time
	}
	_, err = fmt.Fprintf(w, "%s %s\n", at.Local().Format("15:04:05.000000"), ev)
	return err
}
