package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/cellium/cellium/pkg/apiv1"
	"github.com/cellium/cellium/pkg/client"
	"github.com/cellium/cellium/pkg/cliout"
)

func newEndpointCmd(stdout io.Writer) *cobra.Command {
	ep := &cobra.Command{Use: "endpoint", Short: "Inspect the running agent's endpoints (one per pod)"}
	ep.AddCommand(newClientCmd("list", "List the endpoints: ID, container, pod, addresses, host interface, state", cobra.NoArgs,
		func(ctx context.Context, c *client.Client, out *cliout.Output, _ []string) error {
			eps, err := c.Endpoints(ctx)
			if err != nil {
				return err
			}
			return out.Print(stdout, eps, func(w io.Writer) error {
				rows := [][]string{}
				for _, e := range eps {
					pod := ""
					if e.PodName != "" {
						pod = e.PodNamespace + "/" + e.PodName
					}
					if e.Health {
						pod = "(node health)"
					}
					state := e.State
					if e.Error != "" {
						state += " (" + e.Error + ")"
					}
					rows = append(rows, []string{strconv.Itoa(int(e.ID)), shortContainerID(e.ContainerID), pod, endpointIdentity(e), e.Interface,
						e.IPv4, e.IPv6, e.HostInterface, state, e.Datapath, endpointPolicy(e)})
				}
				return cliout.WriteTable(w, []string{"ID", "CONTAINER", "POD", "IDENTITY", "INTERFACE", "IPV4", "IPV6", "HOST", "STATE", "DATAPATH", "POLICY"}, rows)
			})
		}))
	ep.AddCommand(newClientCmd("get ID", "Show one endpoint; ID is its number or a container ID", cobra.ExactArgs(1),
		func(ctx context.Context, c *client.Client, out *cliout.Output, args []string) error {
			e, err := c.Endpoint(ctx, endpointArg(args[0]))
			if err != nil {
				return err
			}
			return out.Print(stdout, e, func(w io.Writer) error { return printEndpoint(w, e) })
		}))
	return ep
}

// endpointIdentity is the endpoint's identity, marked when provisional.
func endpointIdentity(e apiv1.Endpoint) string {
	if e.IdentityPending {
		return fmt.Sprintf("%d (pending)", e.Identity)
	}
	return strconv.FormatUint(uint64(e.Identity), 10)
}

// endpointPolicy is the endpoint's policy in a few words: the directions
// enforced, the revision, and whether the maps have it.
func endpointPolicy(e apiv1.Endpoint) string {
	p := e.Policy
	if p == nil {
		return "-"
	}
	var enforced []string
	if p.Ingress {
		enforced = append(enforced, "ingress")
	}
	if p.Egress {
		enforced = append(enforced, "egress")
	}
	if len(enforced) == 0 {
		enforced = append(enforced, "none")
	}
	state := "realized"
	switch {
	case p.Error != "":
		state = "failed: " + p.Error
	case !p.Realized:
		state = "pending"
	}
	return fmt.Sprintf("enforced %s, revision %d, %s", strings.Join(enforced, "+"), p.Revision, state)
}

// endpointArg turns what a user types into an endpoint {id}: a number is an
// endpoint ID, anything else a container ID.
func endpointArg(arg string) string {
	if _, err := strconv.ParseUint(arg, 10, 16); err == nil || strings.HasPrefix(arg, apiv1.ContainerIDPrefix) {
		return arg
	}
	return client.ContainerEndpointID(arg)
}

func shortContainerID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

func printEndpoint(w io.Writer, e apiv1.Endpoint) error {
	rows := [][]string{
		{"ID", strconv.Itoa(int(e.ID))},
		{"Container", e.ContainerID},
		{"Pod", strings.Trim(e.PodNamespace+"/"+e.PodName, "/")},
		{"Identity", endpointIdentity(e)},
		{"State", e.State},
		{"Netns", e.Netns},
		{"Interface", fmt.Sprintf("%s (%s)", e.Interface, e.MAC)},
		{"Host interface", fmt.Sprintf("%s (ifindex %d, %s)", e.HostInterface, e.HostIfIndex, e.HostMAC)},
		{"IPv4", strings.TrimSpace(e.IPv4 + " via " + e.IPv4Gateway)},
		{"IPv6", strings.TrimSpace(e.IPv6 + " via " + e.IPv6Gateway)},
		{"Datapath", e.Datapath},
		{"Policy", endpointPolicy(e)},
		{"Created", e.Created.Format("2006-01-02 15:04:05 MST")},
	}
	if e.IPv4 == "" {
		rows = slices.DeleteFunc(rows, func(r []string) bool { return r[0] == "IPv4" })
	}
	if e.IPv6 == "" {
		rows = slices.DeleteFunc(rows, func(r []string) bool { return r[0] == "IPv6" })
	}
	if e.Error != "" {
		rows = append(rows, []string{"Error", e.Error})
	}
	if e.DatapathError != "" {
		rows = append(rows, []string{"Datapath error", e.DatapathError})
	}
	if e.Policy != nil {
		rows = append(rows, []string{"Policy entries", strconv.Itoa(e.Policy.Entries)})
	}
	keys := make([]string, 0, len(e.Labels))
	for k := range e.Labels {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		rows = append(rows, []string{"Label", k + "=" + e.Labels[k]})
	}
	tw := [][]string{}
	for _, r := range rows {
		tw = append(tw, []string{r[0] + ":", r[1]})
	}
	return cliout.WriteTable(w, []string{"ENDPOINT", ""}, tw)
}
