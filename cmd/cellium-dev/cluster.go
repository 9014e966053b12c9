package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/cellium/cellium/pkg/cliout"
	"github.com/cellium/cellium/pkg/devcluster"
	"github.com/cellium/cellium/pkg/hubblerelay"
)

// devClusterFlags are the flags every cluster command has: which
// cluster.
type devClusterFlags struct {
	name, dir string
}

func (f *devClusterFlags) directory() (string, error) {
	if f.dir != "" {
		return f.dir, nil
	}
	if err := devcluster.CheckName(f.name); err != nil {
		return "", fmt.Errorf("--name: %w", err)
	}
	return devcluster.DefaultDir(f.name), nil
}

// load opens the cluster, or says how to make one.
func (f *devClusterFlags) load() (*devcluster.Cluster, error) {
	dir, err := f.directory()
	if err != nil {
		return nil, err
	}
	c, err := devcluster.Load(dir, slog.Default())
	if errors.Is(err, devcluster.ErrNoCluster) {
		return nil, fmt.Errorf("no dev cluster in %s: start one with cellium-dev cluster up%s", dir, f.nameFlag())
	}
	return c, err
}

// nameFlag is how to name this cluster again on a command line.
func (f *devClusterFlags) nameFlag() string {
	switch {
	case f.dir != "":
		return " --dir " + f.dir
	case f.name != devcluster.DefaultName:
		return " --name " + f.name
	}
	return ""
}

func requireRootFor(cmd *cobra.Command) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%s needs root: it works with network namespaces, cgroups and BPF pins", cmd.CommandPath())
	}
	return nil
}

// run runs fn with the cluster, as root, with a context that SIGINT and
// SIGTERM cancel: what every command that changes the cluster does first.
func (f *devClusterFlags) run(cmd *cobra.Command, fn func(ctx context.Context, c *devcluster.Cluster) error) error {
	if err := requireRootFor(cmd); err != nil {
		return err
	}
	c, err := f.load()
	if err != nil {
		return err
	}
	ctx, cancel := signalContext(cmd)
	defer cancel()
	return fn(ctx, c)
}

// signalContext is cancelled by SIGINT and SIGTERM.
func signalContext(cmd *cobra.Command) (context.Context, context.CancelFunc) {
	return signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
}

func newClusterCmd(stdout, stderr io.Writer) *cobra.Command {
	var f devClusterFlags
	dc := &cobra.Command{
		Use:   "cluster",
		Short: "Run a cluster of agents on this machine: a network namespace per node, a shared etcd",
		Long: "Build a cluster of N nodes on this machine, to try Cellium or to test it: a network\n" +
			"namespace per node on a private bridge, a shared etcd (or, with up\n" +
			"--identity-allocation-mode=crd, a kube-apiserver), one agent per node with its own\n" +
			"state, BPF pins and cgroup, and pods made through the agents' CNI plugin. Nothing the\n" +
			"cluster sends leaves the machine. Needs root. See docs/dev-cluster.md.",
	}
	pf := dc.PersistentFlags()
	pf.StringVar(&f.name, "name", devcluster.DefaultName, "Name of the cluster: several can run side by side")
	pf.StringVar(&f.dir, "dir", "", "Directory of the cluster's state, logs and manifests (default /var/run/cellium-dev/NAME)")
	dc.AddCommand(
		newDevClusterUpCmd(&f, stdout),
		newDevClusterStatusCmd(&f, stdout),
		newDevClusterDownCmd(&f, stdout),
		newDevClusterPodCmd(&f, stdout),
		newDevClusterExecCmd(&f, stdout, stderr),
		newDevClusterRelayCmd(&f, stdout),
		newDevClusterOutsideCmd(&f, stdout),
	)
	return dc
}

func newDevClusterRelayCmd(f *devClusterFlags, stdout io.Writer) *cobra.Command {
	relay := &cobra.Command{Use: "relay", Short: "Start and stop hubble-relay, which serves the flows of every node"}
	var bin string
	start := &cobra.Command{
		Use:   "start",
		Short: "Start hubble-relay in the bridge namespace, serving every node's flows",
		Long: "Start the upstream hubble-relay (built by `make hubble-relay`) in the cluster's bridge\n" +
			"namespace, on " + fmt.Sprintf("10.90.0.1:%d", devcluster.RelayPort) + " without TLS. It learns the nodes from the first node's Peer\n" +
			"service and reads every node's Hubble server on its node address, port " + fmt.Sprint(devcluster.HubblePort) + ".\n" +
			"Read it with the hubble CLI from that namespace (the command is printed).\n" +
			"`cellium-dev cluster down` stops it.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if bin == "" {
				relayBin, _, err := hubblerelay.Binaries()
				if err != nil {
					return fmt.Errorf("--relay-bin not given and %w", err)
				}
				bin = relayBin
			}
			return f.run(cmd, func(ctx context.Context, c *devcluster.Cluster) error {
				if err := c.StartRelay(ctx, bin); err != nil {
					return err
				}
				fmt.Fprintf(stdout, "hubble-relay serves on %s in the namespace %s:\n  nsenter --net=%s hubble observe --server %s\n",
					c.RelayAddress(), c.BridgeNetNS(), c.BridgeNetNS(), c.RelayAddress())
				return nil
			})
		},
	}
	start.Flags().StringVar(&bin, "relay-bin", "", "The hubble-relay binary (default: the one `make hubble-relay` built, or $HUBBLE_RELAY_BIN)")
	stop := &cobra.Command{
		Use:   "stop",
		Short: "Stop hubble-relay",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.run(cmd, func(ctx context.Context, c *devcluster.Cluster) error {
				return c.StopRelay(ctx)
			})
		},
	}
	relay.AddCommand(start, stop)
	return relay
}

func newDevClusterUpCmd(f *devClusterFlags, stdout io.Writer) *cobra.Command {
	var (
		o   devcluster.Options
		out cliout.Output
	)
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Build the cluster and wait until every agent is ready",
		Long: "Build the cluster: the bridge namespace, a namespace and a cgroup per node, etcd,\n" +
			"the Node manifests, and an agent per node (`agent run` of the agent beside this\n" +
			"binary, or --agent-bin); return once every agent is ready and print the cluster's\n" +
			"status. The agents and etcd keep running until `cellium-dev cluster down`. On\n" +
			"failure, what was made is removed.\n\n" +
			"With --identity-allocation-mode=crd the agents share no etcd: the cluster runs a\n" +
			"real kube-apiserver on it (built by `make kube-apiserver`) in the bridge namespace,\n" +
			"applies deploy/rbac.yaml, and the agents talk to it as the DaemonSet's ServiceAccount;\n" +
			"Nodes and Pods are written there, and identities and endpoints are CelliumIdentity and\n" +
			"CelliumEndpoint objects, whose CRDs the first agent installs.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := requireRootFor(cmd); err != nil {
				return err
			}
			o.Name, o.Dir, o.Log = f.name, f.dir, slog.Default()
			ctx, cancel := signalContext(cmd)
			defer cancel()
			c, err := devcluster.Up(ctx, o)
			if err != nil {
				return err
			}
			st := c.Status(ctx)
			return out.Print(stdout, st, func(w io.Writer) error { return printDevClusterStatus(w, st, f) })
		},
	}
	fl := cmd.Flags()
	fl.IntVar(&o.Nodes, "nodes", 2, fmt.Sprintf("Number of nodes, 1 to %d", devcluster.MaxNodes))
	fl.StringVar(&o.RoutingMode, "routing-mode", "tunnel", "How pods reach other nodes' pods: tunnel (VXLAN) or native (routes via the node addresses)")
	fl.StringArrayVar(&o.AgentArgs, "agent-flag", nil, "A flag for every agent, such as --agent-flag=--log-level=debug (repeat for more)")
	fl.StringVar(&o.AgentBinary, "agent-bin", "", "The agent every node runs (default: the agent next to this binary, as make build puts them in bin/)")
	fl.StringVar(&o.CNIBinary, "cni-bin", "", "The cellium-cni plugin (default: next to the agent)")
	fl.StringVar(&o.EtcdBinary, "etcd-bin", "", "The etcd server (default: $ETCD_BIN, else etcd on the PATH)")
	fl.StringVar(&o.IdentityMode, "identity-allocation-mode", devcluster.IdentityKVStore,
		"Where the agents keep cluster-wide identities: kvstore (they share etcd) or crd (CelliumIdentity and CelliumEndpoint objects in a real kube-apiserver the cluster runs, with deploy/rbac.yaml's RBAC; no kvstore)")
	fl.StringVar(&o.KubeAPIServerBinary, "kube-apiserver-bin", "", "The kube-apiserver of --identity-allocation-mode=crd (default: $KUBE_APISERVER_BIN, else the one `make kube-apiserver` built)")
	fl.DurationVar(&o.ReadyTimeout, "ready-timeout", 2*time.Minute, "How long each agent may take to be ready")
	out.Register(cmd)
	return cmd
}

func newDevClusterStatusCmd(f *devClusterFlags, stdout io.Writer) *cobra.Command {
	var out cliout.Output
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the cluster's nodes, whether their agents run and are ready, and its pods",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.load()
			if err != nil {
				return err
			}
			ctx, cancel := signalContext(cmd)
			defer cancel()
			st := c.Status(ctx)
			return out.Print(stdout, st, func(w io.Writer) error { return printDevClusterStatus(w, st, f) })
		},
	}
	out.Register(cmd)
	return cmd
}

func printDevClusterStatus(w io.Writer, st devcluster.Status, f *devClusterFlags) error {
	etcd := "not running"
	switch {
	case st.Etcd.Running && st.Etcd.Healthy:
		etcd = fmt.Sprintf("healthy (pid %d)", st.Etcd.PID)
	case st.Etcd.Running:
		etcd = fmt.Sprintf("unhealthy (pid %d)", st.Etcd.PID)
	}
	fmt.Fprintf(w, "Cluster:   %s (%s) in %s\nEtcd:      %s, %s\n", st.Name, st.Phase, st.Dir, st.Etcd.URL, etcd)
	if k := st.KubeAPI; k != nil {
		state := "not running"
		switch {
		case k.Running && k.Ready:
			state = fmt.Sprintf("ready (pid %d)", k.PID)
		case k.Running:
			state = fmt.Sprintf("not ready (pid %d)", k.PID)
		}
		fmt.Fprintf(w, "Kube API:  %s, %s; identities: crd (no kvstore)\nKubectl:   nsenter --net=%s kubectl --kubeconfig %s\n", k.URL, state, k.NetNS, k.Kubeconfig)
	} else {
		fmt.Fprintf(w, "Manifests: %s\n", st.ManifestsDir)
	}
	if r := st.Relay; r != nil {
		state := "not running"
		if r.Running {
			state = fmt.Sprintf("running (pid %d)", r.PID)
		}
		fmt.Fprintf(w, "Relay:     %s, %s (hubble-relay, in the bridge namespace)\n", r.Address, state)
	}
	fmt.Fprintln(w)
	rows := [][]string{}
	for _, n := range st.Nodes {
		agent := "not running"
		switch {
		case n.Running && n.Ready:
			agent = "ready"
		case n.Running && n.Error != "":
			agent = "unreachable: " + n.Error
		case n.Running:
			agent = "not ready, waiting for " + strings.Join(n.Pending, ", ")
		}
		cidrs := make([]string, len(n.PodCIDRs))
		for i, p := range n.PodCIDRs {
			cidrs[i] = p.String()
		}
		rows = append(rows, []string{n.Name, n.IPv4.String(), n.IPv6.String(), strings.Join(cidrs, ","), fmt.Sprint(n.Agent.PID), agent})
	}
	if err := cliout.WriteTable(w, []string{"NODE", "IPV4", "IPV6", "POD CIDRS", "PID", "AGENT"}, rows); err != nil {
		return err
	}
	if len(st.Pods) > 0 {
		fmt.Fprintln(w)
		if err := printPods(w, st.Pods); err != nil {
			return err
		}
	}
	if len(st.Nodes) > 0 {
		n := st.Nodes[0]
		fmt.Fprintf(w, "\nAsk %s's agent:  agent status --api-socket %s\nEnter %s:        nsenter --net=%s\nAdd a pod:           cellium-dev cluster%s pod add %s NAME --label app=NAME\n",
			n.Name, n.APISocket, n.Name, n.NetNS, f.nameFlag(), n.Name)
	}
	return nil
}

func printPods(w io.Writer, pods []devcluster.Pod) error {
	rows := [][]string{}
	for _, p := range pods {
		var labels []string
		for _, k := range slices.Sorted(maps.Keys(p.Labels)) {
			labels = append(labels, k+"="+p.Labels[k])
		}
		state := "ready"
		if !p.Ready {
			state = "incomplete (delete it)"
		}
		rows = append(rows, []string{p.Namespace, p.Name, p.Node, p.IPv4.String(), p.IPv6.String(), strings.Join(labels, ","), state})
	}
	return cliout.WriteTable(w, []string{"NAMESPACE", "POD", "NODE", "IPV4", "IPV6", "LABELS", "STATE"}, rows)
}

func newDevClusterDownCmd(f *devClusterFlags, stdout io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "down",
		Short: "Stop the cluster's agents and etcd and remove everything the cluster made",
		Long: "Stop the agents (SIGTERM, then SIGKILL after 10s) and etcd, remove the agents'\n" +
			"programs and pins (`agent cleanup`), the pods', nodes' and bridge's namespaces, the\n" +
			"cgroups and the cluster's directory. Works on a cluster that `up` left half made;\n" +
			"without a cluster it does nothing.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := requireRootFor(cmd); err != nil {
				return err
			}
			dir, err := f.directory()
			if err != nil {
				return err
			}
			c, err := devcluster.Load(dir, slog.Default())
			if errors.Is(err, devcluster.ErrNoCluster) {
				fmt.Fprintf(stdout, "No cluster in %s: nothing to take down\n", dir)
				return nil
			}
			if err != nil {
				return err
			}
			ctx, cancel := signalContext(cmd)
			defer cancel()
			if err := c.Down(ctx); err != nil {
				return err
			}
			fmt.Fprintf(stdout, "Cluster %s is down\n", c.Name())
			return nil
		},
	}
}

func newDevClusterPodCmd(f *devClusterFlags, stdout io.Writer) *cobra.Command {
	pod := &cobra.Command{Use: "pod", Short: "Add, delete and list the cluster's pods"}

	var (
		labels, ports []string
		namespace     string
		addOut        cliout.Output
	)
	add := &cobra.Command{
		Use:   "add NODE NAME",
		Short: "Add a pod on a node: its network namespace, its Pod manifest and the CNI ADD",
		Long: "Make pod NAME on NODE: a network namespace, a Pod manifest (the namespace, labels\n" +
			"and container ports) that every agent sees, and the CNI ADD through the node agent's\n" +
			"configuration and the cellium-cni plugin. Returns once the agent has the pod's\n" +
			"endpoint with its labels, and prints the pod's addresses. A pod outside the default\n" +
			"namespace is named NAMESPACE/NAME by the other commands; a Namespace manifest in the\n" +
			"manifests directory gives it its namespace's labels.",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			lbls, err := parseLabels(labels)
			if err != nil {
				return err
			}
			cports, err := parsePorts(ports)
			if err != nil {
				return err
			}
			return f.run(cmd, func(ctx context.Context, c *devcluster.Cluster) error {
				p, err := c.AddPodSpec(ctx, devcluster.PodSpec{Node: args[0], Namespace: namespace, Name: args[1], Labels: lbls, Ports: cports})
				if err != nil {
					return err
				}
				return addOut.Print(stdout, p, func(w io.Writer) error { return printPods(w, []devcluster.Pod{p}) })
			})
		},
	}
	add.Flags().StringArrayVar(&labels, "label", nil, "A label of the pod, key=value (repeat for more)")
	add.Flags().StringVarP(&namespace, "namespace", "n", devcluster.DefaultNamespace, "The pod's Kubernetes namespace")
	add.Flags().StringArrayVar(&ports, "port", nil, "A container port, [NAME=]PORT[/PROTOCOL] (TCP, UDP or SCTP; default TCP), e.g. http=8080/TCP (repeat for more)")
	addOut.Register(add)

	var labelOut cliout.Output
	label := &cobra.Command{
		Use:   "label POD KEY=VALUE|KEY-...",
		Short: "Change a pod's labels: KEY=VALUE sets one, KEY- removes one",
		Long: "Change the labels of POD (NAME, or NAMESPACE/NAME) in its Pod manifest, as\n" +
			"`kubectl label --overwrite` does: KEY=VALUE sets a label, KEY- removes it. Returns\n" +
			"once the node's agent has the pod's endpoint with the new labels and their identity.",
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return f.run(cmd, func(ctx context.Context, c *devcluster.Cluster) error {
				p, err := c.Pod(args[0])
				if err != nil {
					return err
				}
				lbls, err := changeLabels(p.Labels, args[1:])
				if err != nil {
					return err
				}
				if p, err = c.SetPodLabels(ctx, args[0], lbls); err != nil {
					return err
				}
				return labelOut.Print(stdout, p, func(w io.Writer) error { return printPods(w, []devcluster.Pod{p}) })
			})
		},
	}
	labelOut.Register(label)

	del := &cobra.Command{
		Use:   "del POD",
		Short: "Delete a pod: the CNI DEL, its manifest and its network namespace",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return f.run(cmd, func(ctx context.Context, c *devcluster.Cluster) error {
				if err := c.DeletePod(ctx, args[0]); err != nil {
					return err
				}
				fmt.Fprintf(stdout, "Deleted pod %s\n", args[0])
				return nil
			})
		},
	}

	var listOut cliout.Output
	list := &cobra.Command{
		Use:   "list",
		Short: "List the pods: node, addresses, labels",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			c, err := f.load()
			if err != nil {
				return err
			}
			pods := c.Pods()
			if pods == nil {
				pods = []devcluster.Pod{}
			}
			return listOut.Print(stdout, pods, func(w io.Writer) error { return printPods(w, pods) })
		},
	}
	listOut.Register(list)

	pod.AddCommand(add, label, del, list)
	return pod
}

// parseLabels parses --label key=value flags.
func parseLabels(flags []string) (map[string]string, error) {
	labels := map[string]string{}
	for _, kv := range flags {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("invalid --label %q: want key=value, e.g. app=web", kv)
		}
		if _, dup := labels[k]; dup {
			return nil, fmt.Errorf("invalid --label %q: label %s is given twice", kv, k)
		}
		labels[k] = v
	}
	return labels, nil
}

// changeLabels applies kubectl-label style changes to labels: KEY=VALUE
// sets, KEY- removes.
func changeLabels(labels map[string]string, changes []string) (map[string]string, error) {
	out := maps.Clone(labels)
	if out == nil {
		out = map[string]string{}
	}
	for _, ch := range changes {
		if k, ok := strings.CutSuffix(ch, "-"); ok && !strings.Contains(ch, "=") {
			if _, has := out[k]; !has {
				return nil, fmt.Errorf("invalid label change %q: the pod has no label %s", ch, k)
			}
			delete(out, k)
			continue
		}
		k, v, ok := strings.Cut(ch, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("invalid label change %q: want KEY=VALUE to set a label or KEY- to remove one, e.g. app=web", ch)
		}
		out[k] = v
	}
	return out, nil
}

// parsePorts parses --port [NAME=]PORT[/PROTOCOL] flags.
func parsePorts(flags []string) ([]devcluster.ContainerPort, error) {
	var ports []devcluster.ContainerPort
	for _, f := range flags {
		var p devcluster.ContainerPort
		rest := f
		if name, r, ok := strings.Cut(rest, "="); ok {
			p.Name, rest = name, r
		}
		num, proto, ok := strings.Cut(rest, "/")
		p.Protocol = "TCP"
		if ok {
			p.Protocol = strings.ToUpper(proto)
		}
		n, err := strconv.ParseUint(num, 10, 16)
		if err != nil || n == 0 {
			return nil, fmt.Errorf("invalid --port %q: want [NAME=]PORT[/PROTOCOL] with a port from 1 to 65535, e.g. http=8080/TCP", f)
		}
		p.Port = uint16(n)
		ports = append(ports, p)
	}
	return ports, nil
}

func newDevClusterExecCmd(f *devClusterFlags, stdout, stderr io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "exec POD -- COMMAND [ARG...]",
		Short: "Run a command in a pod: its network namespace and its node's cgroup",
		Long: "Run COMMAND in POD's network namespace and in its node's cgroup, as a container's\n" +
			"process runs, so the node agent's socket load balancing applies to its sockets.\n" +
			"Standard input and output are this command's; its exit code is this command's.",
		Args: func(cmd *cobra.Command, args []string) error {
			dash := cmd.ArgsLenAtDash()
			if dash != 1 || len(args) < 2 {
				return fmt.Errorf("want a pod, --, and a command: cellium-dev cluster exec POD -- COMMAND [ARG...]")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := requireRootFor(cmd); err != nil {
				return err
			}
			c, err := f.load()
			if err != nil {
				return err
			}
			run := exec.Command(args[1], args[2:]...)
			if run.Err != nil {
				return fmt.Errorf("exec in pod %s: %w", args[0], run.Err)
			}
			run.Stdin, run.Stdout, run.Stderr = os.Stdin, stdout, stderr
			if err := c.Start(args[0], run); err != nil {
				return err
			}
			// Ctrl-C reaches the command, which shares the terminal; this
			// process waits for it to end rather than end first.
			signal.Ignore(syscall.SIGINT)
			defer signal.Reset(syscall.SIGINT)
			err = run.Wait()
			if ee, ok := errors.AsType[*exec.ExitError](err); ok {
				if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
					// As a shell reports it.
					return exitCodeError{128 + int(ws.Signal())}
				}
				return exitCodeError{ee.ExitCode()}
			}
			return err
		},
	}
}

func newDevClusterOutsideCmd(f *devClusterFlags, stdout io.Writer) *cobra.Command {
	var out cliout.Output
	cmd := &cobra.Command{
		Use:   "outside",
		Short: "Add the outside namespace: a host on the bridge that is no node, standing for the world",
		Long: "Make the cluster's outside namespace (or show the one it has): cellium-NAME.outside,\n" +
			"on the cluster's bridge with 10.90.0.200 and fd00:10:90::200, no node and no route to\n" +
			"the pods. A server there plays the internet: pods reach it masqueraded with their\n" +
			"node's address. Run one with nsenter --net=/var/run/netns/cellium-NAME.outside.\n" +
			"down removes it with the rest.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := requireRootFor(cmd); err != nil {
				return err
			}
			c, err := f.load()
			if err != nil {
				return err
			}
			o, err := c.AddOutside()
			if err != nil {
				return err
			}
			return out.Print(stdout, o, func(w io.Writer) error {
				_, err := fmt.Fprintf(w, "Outside namespace %s: %s, %s\n", o.NetNS, o.IPv4, o.IPv6)
				return err
			})
		},
	}
	out.Register(cmd)
	return cmd
}
