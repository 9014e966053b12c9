package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/cellium/cellium/pkg/apiv1"
	"github.com/cellium/cellium/pkg/client"
	"github.com/cellium/cellium/pkg/cliout"
)

func newPolicyCmd(stdout io.Writer) *cobra.Command {
	cmd := &cobra.Command{Use: "policy", Short: "Show the NetworkPolicies as the running agent applies them, and explain verdicts"}
	table := func(w io.Writer, ps []apiv1.Policy) error {
		rows := make([][]string, 0, len(ps))
		for _, p := range ps {
			state := "applied"
			switch {
			case p.Error != "" && p.InForce:
				state = "previous version in force: " + p.Error
			case p.Error != "":
				state = "not applied: " + p.Error
			}
			rows = append(rows, []string{p.Name, strings.Join(p.PolicyTypes, ","), "{" + p.PodSelector + "}",
				rules(p.Ingress), rules(p.Egress), fmt.Sprint(p.Endpoints), fmt.Sprint(p.Revision), state})
		}
		return cliout.WriteTable(w, []string{"NAME", "TYPES", "PODSELECTOR", "INGRESS", "EGRESS", "ENDPOINTS", "REVISION", "STATE"}, rows)
	}
	list := newClientCmd("list", "List the NetworkPolicies, their rules as understood, and the policy revision", cobra.NoArgs,
		func(ctx context.Context, c *client.Client, out *cliout.Output, _ []string) error {
			l, err := c.Policies(ctx)
			if err != nil {
				return err
			}
			return out.Print(stdout, l, func(w io.Writer) error {
				fmt.Fprintf(w, "Policy revision %d\n", l.Revision)
				return table(w, l.Policies)
			})
		})
	get := newClientCmd("get NAMESPACE/NAME", "Show one NetworkPolicy as understood", cobra.ExactArgs(1),
		func(ctx context.Context, c *client.Client, out *cliout.Output, args []string) error {
			p, err := c.Policy(ctx, args[0])
			if err != nil {
				return err
			}
			return out.Print(stdout, p, func(w io.Writer) error { return table(w, []apiv1.Policy{p}) })
		})
	selectors := newClientCmd("selectors", "List the selector cache: each selector, the identities it selects and the policies using it", cobra.NoArgs,
		func(ctx context.Context, c *client.Client, out *cliout.Output, _ []string) error {
			sels, err := c.PolicySelectors(ctx)
			if err != nil {
				return err
			}
			return out.Print(stdout, sels, func(w io.Writer) error {
				rows := make([][]string, 0, len(sels))
				for _, s := range sels {
					rows = append(rows, []string{s.Selector, fmt.Sprint(s.Identities), strings.Join(s.Users, ",")})
				}
				return cliout.WriteTable(w, []string{"SELECTOR", "IDENTITIES", "USERS"}, rows)
			})
		})
	var from, to, port string
	trace := newClientCmd("trace", "Explain the verdict on a connection from the policy tables", cobra.NoArgs,
		func(ctx context.Context, c *client.Client, out *cliout.Output, _ []string) error {
			tr, err := c.PolicyTrace(ctx, from, to, port)
			if err != nil {
				return err
			}
			return out.Print(stdout, tr, func(w io.Writer) error { return writeTrace(w, tr) })
		})
	trace.Flags().StringVar(&from, "from", "", "Source: NAMESPACE/POD of a pod of this node, an address, or an identity (a number, world, host, ...)")
	trace.Flags().StringVar(&to, "to", "", "Destination: NAMESPACE/POD of a pod of this node, an address, or an identity")
	trace.Flags().StringVar(&port, "port", "", "Destination port: PORT/PROTO (8080/TCP, 53/UDP) or ICMP")
	for _, f := range []string{"from", "to", "port"} {
		_ = trace.MarkFlagRequired(f)
	}
	cmd.AddCommand(list, get, selectors, trace)
	return cmd
}

// rules shows a direction's rules as "peers -> ports" joined by " | ".
func rules(rs []apiv1.PolicyRule) string {
	if len(rs) == 0 {
		return "-"
	}
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = strings.Join(r.Peers, " or ") + " : " + strings.Join(r.Ports, ",")
	}
	return strings.Join(parts, " | ")
}

func writeTrace(w io.Writer, tr apiv1.PolicyTrace) error {
	verdict := "ALLOWED"
	if !tr.Allowed {
		verdict = "DENIED"
	}
	fmt.Fprintf(w, "%s -> %s %s: %s\n", tr.From, tr.To, tr.Port, verdict)
	if len(tr.Sides) == 0 {
		fmt.Fprintln(w, "  neither side is a pod of this node: nothing here checks it")
	}
	for _, s := range tr.Sides {
		peer := fmt.Sprintf("peer identity %d", s.Peer)
		if s.PeerPrefix != "" {
			peer += " in ipBlock prefix " + s.PeerPrefix
		}
		fmt.Fprintf(w, "  %s of endpoint %d (%s), %s:\n", s.Direction, s.Endpoint, s.Pod, peer)
		switch {
		case !s.Isolated:
			fmt.Fprintf(w, "    not isolated (no policy with %s type selects it): allowed\n", s.Direction)
		case len(s.AllowedBy) > 0:
			fmt.Fprintf(w, "    isolated by %s; allowed by %s\n", strings.Join(s.SelectedBy, ", "), strings.Join(s.AllowedBy, ", "))
		default:
			fmt.Fprintf(w, "    isolated by %s; no rule allows it: denied\n", strings.Join(s.SelectedBy, ", "))
		}
	}
	return nil
}
