package main

import (
	"context"
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
)

// clientCmd is a command that asks the running agent over --api-socket.
type clientCmd struct {
	api     api.Config
	out     cliout.Output
	timeout time.Duration
}

// listGetCmds are a "list" and a "get ARG" command over one kind of row,
// printed by table or as JSON with -o json.
type listGetCmds[T any] struct {
	list  func(c *client.Client, ctx context.Context) ([]T, error)
	get   func(c *client.Client, ctx context.Context, arg string) (T, error)
	table func(w io.Writer, rows []T) error
}

func (l listGetCmds[T]) commands(stdout io.Writer, listShort, getUse, getShort string) []*cobra.Command {
	return []*cobra.Command{
		newClientCmd("list", listShort, cobra.NoArgs, func(ctx context.Context, c *client.Client, out *cliout.Output, _ []string) error {
			rows, err := l.list(c, ctx)
			if err != nil {
				return err
			}
			return out.Print(stdout, rows, func(w io.Writer) error { return l.table(w, rows) })
		}),
		newClientCmd(getUse, getShort, cobra.ExactArgs(1), func(ctx context.Context, c *client.Client, out *cliout.Output, args []string) error {
			row, err := l.get(c, ctx, args[0])
			if err != nil {
				return err
			}
			return out.Print(stdout, row, func(w io.Writer) error { return l.table(w, []T{row}) })
		}),
	}
}

// newClientCmd builds a command with --api-socket (the agent's own flag and
// default) and -o.
func newClientCmd(use, short string, args cobra.PositionalArgs, run func(ctx context.Context, c *client.Client, out *cliout.Output, args []string) error) *cobra.Command {
	cc := &clientCmd{api: api.DefaultConfig}
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  args,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer cancel()
			ctx, cancelTimeout := context.WithTimeout(ctx, cc.timeout)
			defer cancelTimeout()
			socket, _ := cmd.Flags().GetString("api-socket")
			return run(ctx, client.New(socket), &cc.out, args)
		},
	}
	cc.api.Flags(cmd.Flags())
	cmd.Flags().DurationVar(&cc.timeout, "timeout", 30*time.Second, "How long to wait for the agent's answer")
	cc.out.Register(cmd)
	return cmd
}

func newStatusCmd(stdout io.Writer) *cobra.Command {
	return newClientCmd("status", "Show the running agent's readiness and health, per module",
		cobra.NoArgs, func(ctx context.Context, c *client.Client, out *cliout.Output, _ []string) error {
			h, err := c.Health(ctx)
			if err != nil {
				return err
			}
			st := agentStatus{Health: h}
			if ib, err := c.IdentityBackend(ctx); err == nil {
				st.Identities = &ib
			} else {
				st.IdentitiesError = err.Error()
			}
			return out.Print(stdout, st, func(w io.Writer) error {
				kv, err := c.KVStore(ctx)
				if err != nil {
					return err
				}
				return printHealth(w, st, kv)
			})
		})
}

// agentStatus is `agent status -o json`: the health (at the top level, as
// GET /v1/health answers it) and the identity backend.
type agentStatus struct {
	apiv1.Health
	Identities      *apiv1.IdentityBackend `json:"identities,omitempty"`
	IdentitiesError string                 `json:"identitiesError,omitempty"`
}

// identitiesLine is the identity backend in one line: "crd
// (CelliumIdentity objects, 12 known, watching)".
func identitiesLine(st agentStatus) string {
	ib := st.Identities
	if ib == nil {
		return "unknown (" + st.IdentitiesError + ")"
	}
	return fmt.Sprintf("%s (%s, %d known, %s)", ib.Mode, ib.Store, ib.Known, ib.State)
}

func printHealth(w io.Writer, st agentStatus, kv apiv1.KVStore) error {
	h := st.Health
	state := "ready"
	switch {
	case !h.Started:
		state = "starting, waiting for: " + strings.Join(h.Pending, ", ")
	case !h.Ready:
		state = "not ready, waiting for: " + strings.Join(h.Pending, ", ")
	}
	fmt.Fprintf(w, "Agent:      %s\nHealth:     %s\nKVStore:    %s\nIdentities: %s\n\n", state, h.Level, kvstoreLine(kv), identitiesLine(st))
	if len(h.Waiting) > 0 {
		rows := make([][]string, 0, len(h.Waiting))
		for _, b := range h.Waiting {
			waited := (time.Duration(b.WaitedSeconds * float64(time.Second))).Truncate(time.Second).String()
			if b.Overdue {
				waited += " (overdue)"
			}
			rows = append(rows, []string{b.Name, waited, b.Detail})
		}
		if err := cliout.WriteTable(w, []string{"WAITING FOR", "SINCE", "DETAIL"}, rows); err != nil {
			return err
		}
		fmt.Fprintln(w)
	}

	rows := [][]string{}
	var walk func(indent string, nodes []apiv1.HealthNode, top bool)
	walk = func(indent string, nodes []apiv1.HealthNode, top bool) {
		for i, n := range nodes {
			name, childIndent := n.Name, ""
			if !top {
				branch, cont := "├─ ", "│  "
				if i == len(nodes)-1 {
					branch, cont = "└─ ", "   "
				}
				name, childIndent = indent+branch+n.Name, indent+cont
			}
			msg := n.Message
			if n.Error != "" && n.Error != n.Message {
				msg = strings.TrimSpace(msg + " (error: " + n.Error + ")")
			}
			rows = append(rows, []string{name, n.Level, since(n.Since), msg})
			walk(childIndent, n.Children, false)
		}
	}
	walk("", h.Modules, true)
	return cliout.WriteTable(w, []string{"MODULE", "LEVEL", "SINCE", "MESSAGE"}, rows)
}

// kvstoreLine is the kvstore's state in one line: "disabled", or the
// state, endpoints, leases and the last error.
func kvstoreLine(kv apiv1.KVStore) string {
	if kv.State == "disabled" {
		return "disabled"
	}
	line := fmt.Sprintf("%s to %s since %s, %d leases, %d leased keys", kv.State, strings.Join(kv.Endpoints, ","), since(kv.Since), kv.Leases, kv.LeasedKeys)
	if kv.State != "connected" && kv.LastError != "" {
		line += " (last error: " + kv.LastError + ")"
	}
	return line
}

func since(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return time.Since(t).Truncate(time.Second).String()
}

func newConfigCmd(stdout io.Writer) *cobra.Command {
	return newClientCmd("config", "Show the running agent's effective configuration",
		cobra.NoArgs, func(ctx context.Context, c *client.Client, out *cliout.Output, _ []string) error {
			cfg, err := c.Config(ctx)
			if err != nil {
				return err
			}
			return out.Print(stdout, cfg, func(w io.Writer) error {
				keys := make([]string, 0, len(cfg))
				for k := range cfg {
					keys = append(keys, k)
				}
				slices.Sort(keys)
				rows := make([][]string, 0, len(keys))
				for _, k := range keys {
					rows = append(rows, []string{k, fmt.Sprint(cfg[k])})
				}
				return cliout.WriteTable(w, []string{"KEY", "VALUE"}, rows)
			})
		})
}

func newDBCmd(stdout io.Writer) *cobra.Command {
	db := &cobra.Command{Use: "db", Short: "Inspect the running agent's StateDB tables"}
	db.AddCommand(newClientCmd("list", "List the tables", cobra.NoArgs,
		func(ctx context.Context, c *client.Client, out *cliout.Output, _ []string) error {
			tables, err := c.Tables(ctx)
			if err != nil {
				return err
			}
			return out.Print(stdout, tables, func(w io.Writer) error {
				rows := [][]string{}
				for _, t := range tables {
					init := "yes"
					if !t.Initialized {
						init = "waiting for " + strings.Join(t.PendingInitializers, ", ")
					}
					rows = append(rows, []string{t.Name, fmt.Sprint(t.Objects), init, strings.Join(t.Indexes, ", ")})
				}
				return cliout.WriteTable(w, []string{"TABLE", "OBJECTS", "INITIALIZED", "INDEXES"}, rows)
			})
		}))

	var q client.TableQuery
	show := newClientCmd("show TABLE", "Show a table's rows (-o json: its objects)", cobra.ExactArgs(1),
		func(ctx context.Context, c *client.Client, out *cliout.Output, args []string) error {
			if out.Format() == "json" {
				objs, err := c.TableObjects(ctx, args[0], q)
				if err != nil {
					return err
				}
				return out.Print(stdout, objs, nil)
			}
			rows, err := c.TableRows(ctx, args[0], q)
			if err != nil {
				return err
			}
			return cliout.WriteTable(stdout, rows.Header, rows.Rows)
		})
	show.Flags().StringVar(&q.Index, "index", "", "Only rows whose index INDEX matches --key")
	show.Flags().StringVar(&q.Key, "key", "", "Key to look up in --index")
	db.AddCommand(show)
	return db
}

func newMapCmd(stdout io.Writer) *cobra.Command {
	m := &cobra.Command{Use: "map", Short: "Inspect the BPF maps the running agent owns"}
	m.AddCommand(newClientCmd("list", "List the maps: pin path, type, sizes, entries", cobra.NoArgs,
		func(ctx context.Context, c *client.Client, out *cliout.Output, _ []string) error {
			maps, err := c.Maps(ctx)
			if err != nil {
				return err
			}
			return out.Print(stdout, maps, func(w io.Writer) error {
				rows := [][]string{}
				for _, m := range maps {
					entries := fmt.Sprint(m.Entries)
					if m.Entries < 0 {
						entries = "-"
					}
					if m.Error != "" {
						entries += " (" + m.Error + ")"
					}
					rows = append(rows, []string{m.Name, m.Type, fmt.Sprintf("%d/%d", m.KeySize, m.ValueSize),
						fmt.Sprint(m.MaxEntries), entries, m.Origin, m.PinPath})
				}
				return cliout.WriteTable(w, []string{"NAME", "TYPE", "KEY/VALUE", "MAX", "ENTRIES", "ORIGIN", "PIN"}, rows)
			})
		}))

	var limit int
	dump := newClientCmd("dump NAME", "Print a map's entries with decoded keys and values", cobra.ExactArgs(1),
		func(ctx context.Context, c *client.Client, out *cliout.Output, args []string) error {
			if limit < 0 {
				return fmt.Errorf("invalid --limit %d: want a number of entries, 0 for all", limit)
			}
			d, err := c.MapEntries(ctx, args[0], limit)
			if err != nil {
				return err
			}
			return out.Print(stdout, d, func(w io.Writer) error {
				rows := make([][]string, 0, len(d.Entries))
				for _, e := range d.Entries {
					rows = append(rows, []string{e.Key, e.Value})
				}
				if err := cliout.WriteTable(w, []string{"KEY", "VALUE"}, rows); err != nil {
					return err
				}
				if d.Truncated {
					_, err := fmt.Fprintf(w, "(first %d entries; --limit 0 shows all)\n", len(d.Entries))
					return err
				}
				return nil
			})
		})
	dump.Flags().IntVar(&limit, "limit", 0, "Print at most this many entries (0: all)")
	m.AddCommand(dump)
	return m
}
