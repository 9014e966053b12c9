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

func newServiceCmd(stdout io.Writer) *cobra.Command {
	svc := &cobra.Command{Use: "service", Short: "Inspect the services the running agent load-balances"}

	var namespace string
	list := newClientCmd("list", "List the frontends: address, type, service, backends with their state, datapath status", cobra.NoArgs,
		func(ctx context.Context, c *client.Client, out *cliout.Output, _ []string) error {
			services, err := c.Services(ctx, namespace)
			if err != nil {
				return err
			}
			return out.Print(stdout, services, func(w io.Writer) error { return printFrontends(w, services) })
		})
	list.Flags().StringVarP(&namespace, "namespace", "n", "", "Only the services of this namespace")
	svc.AddCommand(list)

	svc.AddCommand(newClientCmd("get NAMESPACE/NAME", "Show one service: its spec, frontends and backends", cobra.ExactArgs(1),
		func(ctx context.Context, c *client.Client, out *cliout.Output, args []string) error {
			ns, name, err := parseServiceArg(args[0])
			if err != nil {
				return err
			}
			s, err := c.Service(ctx, ns, name)
			if err != nil {
				return err
			}
			return out.Print(stdout, s, func(w io.Writer) error { return printService(w, s) })
		}))
	return svc
}

func parseServiceArg(arg string) (namespace, name string, err error) {
	namespace, name, ok := strings.Cut(arg, "/")
	if !ok || namespace == "" || name == "" || strings.Contains(name, "/") {
		return "", "", fmt.Errorf("invalid service %q: want NAMESPACE/NAME, e.g. kube-system/kube-dns", arg)
	}
	return namespace, name, nil
}

// printFrontends writes a row per frontend of the services.
func printFrontends(w io.Writer, services []apiv1.Service) error {
	rows := [][]string{}
	for _, s := range services {
		for _, fe := range s.Frontends {
			rows = append(rows, []string{fe.Address, fe.Type, s.Namespace + "/" + s.Name, frontendBackends(fe), frontendStatus(fe)})
		}
	}
	return cliout.WriteTable(w, []string{"FRONTEND", "TYPE", "SERVICE", "BACKENDS", "STATUS"}, rows)
}

func frontendBackends(fe apiv1.Frontend) string {
	if len(fe.Backends) == 0 {
		return "none (rejects connections)"
	}
	parts := make([]string, len(fe.Backends))
	for i, be := range fe.Backends {
		parts[i] = be.Address + " (" + be.State + ")"
	}
	return strings.Join(parts, ", ")
}

func frontendStatus(fe apiv1.Frontend) string {
	if fe.Error != "" {
		return fe.Status + ": " + fe.Error
	}
	return fe.Status
}

// printService writes a service's spec, then its frontends and backends.
func printService(w io.Writer, s apiv1.Service) error {
	ports := make([]string, len(s.Ports))
	for i, p := range s.Ports {
		ports[i] = fmt.Sprintf("%d/%s", p.Port, p.Protocol)
		if p.NodePort != 0 {
			ports[i] = fmt.Sprintf("%d:%d/%s", p.Port, p.NodePort, p.Protocol)
		}
		if p.Name != "" {
			ports[i] = p.Name + " " + ports[i]
		}
	}
	affinity := "None"
	if s.AffinityTimeoutSeconds > 0 {
		affinity = fmt.Sprintf("ClientIP, timeout %ds", s.AffinityTimeoutSeconds)
	}
	orNone := func(xs []string) string {
		if len(xs) == 0 {
			return "-"
		}
		return strings.Join(xs, ", ")
	}
	fmt.Fprintf(w, "Service:           %s/%s\n", s.Namespace, s.Name)
	fmt.Fprintf(w, "Type:              %s\n", s.Type)
	fmt.Fprintf(w, "ClusterIPs:        %s\n", orNone(s.ClusterIPs))
	fmt.Fprintf(w, "ExternalIPs:       %s\n", orNone(s.ExternalIPs))
	fmt.Fprintf(w, "LoadBalancerIPs:   %s\n", orNone(s.LoadBalancerIPs))
	fmt.Fprintf(w, "Ports:             %s\n", orNone(ports))
	fmt.Fprintf(w, "Session affinity:  %s\n", affinity)
	healthCheck := ""
	if s.HealthCheckNodePort != 0 {
		healthCheck = fmt.Sprintf(", health check node port %d", s.HealthCheckNodePort)
	}
	fmt.Fprintf(w, "Traffic policy:    external %s, internal %s%s\n\n", s.ExternalTrafficPolicy, s.InternalTrafficPolicy, healthCheck)

	rows := [][]string{}
	for _, fe := range s.Frontends {
		rows = append(rows, []string{fe.Address, fe.Type, fe.PortName, frontendBackends(fe), frontendStatus(fe)})
	}
	if err := cliout.WriteTable(w, []string{"FRONTEND", "TYPE", "PORT", "BACKENDS", "STATUS"}, rows); err != nil {
		return err
	}
	fmt.Fprintln(w)
	rows = [][]string{}
	for _, be := range s.Backends {
		rows = append(rows, []string{be.Address, be.PortName, be.State, be.NodeName, be.EndpointSlice})
	}
	return cliout.WriteTable(w, []string{"BACKEND", "PORT", "STATE", "NODE", "ENDPOINTSLICE"}, rows)
}
