package devcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/cellium/cellium/pkg/client"
	"github.com/cellium/cellium/pkg/netnsrun"
)

// conflistName is the file the agent writes into --cni-conf-dir.
const conflistName = "05-cellium.conflist"

// DefaultNamespace is the Kubernetes namespace of a pod when none is
// given.
const DefaultNamespace = "default"

// PodSpec is what AddPodSpec makes a pod of.
type PodSpec struct {
	Node string
	// Namespace is the pod's Kubernetes namespace; empty is default. It
	// needs no Namespace object: one written into the manifests directory
	// gives its pods the namespace's labels.
	Namespace string
	Name      string
	Labels    map[string]string
	// Ports are its container's ports, for NetworkPolicies' named ports.
	Ports []ContainerPort
}

// checkPod checks a new pod's names, labels and ports, naming what is
// wrong.
func checkPod(spec PodSpec) error {
	if !podNameRE().MatchString(spec.Name) {
		return fmt.Errorf("invalid pod name %q: want at most 63 lower-case letters, digits and '-', starting and ending with a letter or digit, e.g. web-1", spec.Name)
	}
	if !podNameRE().MatchString(spec.Namespace) {
		return fmt.Errorf("invalid namespace %q: want at most 63 lower-case letters, digits and '-', starting and ending with a letter or digit, e.g. prod", spec.Namespace)
	}
	if err := checkLabels(spec.Labels); err != nil {
		return err
	}
	names := map[string]bool{}
	for _, p := range spec.Ports {
		switch {
		case p.Port == 0:
			return fmt.Errorf("invalid port %+v: want a port from 1 to 65535", p)
		case p.Protocol != "TCP" && p.Protocol != "UDP" && p.Protocol != "SCTP":
			return fmt.Errorf("invalid protocol %q of port %d: want TCP, UDP or SCTP", p.Protocol, p.Port)
		case p.Name == "":
		case len(validation.IsValidPortName(p.Name)) > 0:
			return fmt.Errorf("invalid port name %q: %s", p.Name, strings.Join(validation.IsValidPortName(p.Name), "; "))
		case names[p.Name]:
			return fmt.Errorf("invalid port name %q: given twice", p.Name)
		}
		names[p.Name] = p.Name != ""
	}
	return nil
}

func checkLabels(labels map[string]string) error {
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return fmt.Errorf("invalid label key %q: %s", k, strings.Join(errs, "; "))
		}
		if errs := validation.IsValidLabelValue(labels[k]); len(errs) > 0 {
			return fmt.Errorf("invalid value %q of label %s: %s", labels[k], k, strings.Join(errs, "; "))
		}
	}
	return nil
}

// AddPod makes a pod on node with labels (see AddPodSpec). ref is NAME (in
// the default namespace) or NAMESPACE/NAME.
func (c *Cluster) AddPod(ctx context.Context, node, ref string, labels map[string]string) (Pod, error) {
	ns, name := splitPodRef(ref)
	return c.AddPodSpec(ctx, PodSpec{Node: node, Namespace: ns, Name: name, Labels: labels})
}

// AddPodSpec makes a pod: its network namespace, its Pod manifest (the
// namespace, labels and container ports) and the CNI ADD of its eth0 with
// the node agent's configuration. It returns once the node's agent has the
// pod's endpoint with its labels and identity. What a failed AddPodSpec
// made is removed before it returns.
func (c *Cluster) AddPodSpec(ctx context.Context, spec PodSpec) (Pod, error) {
	if spec.Namespace == "" {
		spec.Namespace = DefaultNamespace
	}
	if err := checkPod(spec); err != nil {
		return Pod{}, err
	}
	var pod Pod
	err := c.update(func(s *state) error {
		n, err := s.node(spec.Node)
		if err != nil {
			return err
		}
		p := Pod{
			Name: spec.Name, Namespace: spec.Namespace, Node: n.Name, Labels: maps.Clone(spec.Labels),
			Ports: slices.Clone(spec.Ports),
		}
		ref := p.Ref()
		if _, err := s.pod(ref); err == nil {
			return fmt.Errorf("cluster %s has a pod %q already", s.Name, ref)
		}
		if !n.Agent.Alive() {
			return fmt.Errorf("node %s: its agent does not run (pid %d), so it cannot add a pod", n.Name, n.Agent.PID)
		}
		p.NetNS, p.ContainerID = podNetNS(s.Name, p), s.Name+"-"+podFileName(p)
		isPod := func(q Pod) bool { return q.Ref() == ref }
		// Recorded before it is made, so Down removes what a crash here
		// leaves.
		s.Pods = append(s.Pods, p)
		if err := s.save(); err != nil {
			return err
		}
		if err := c.makePod(ctx, s, *n, &p); err != nil {
			if rerr := removePod(s, p, false); rerr != nil {
				return fmt.Errorf("add pod %s on %s: %w; removing what was made failed: %w", ref, n.Name, err, rerr)
			}
			s.Pods = slices.DeleteFunc(s.Pods, isPod)
			return fmt.Errorf("add pod %s on %s: %w", ref, n.Name, err)
		}
		p.Ready = true
		s.Pods[slices.IndexFunc(s.Pods, isPod)] = p
		pod = p
		return nil
	})
	return pod, err
}

// SetPodLabels replaces the labels of pod ref (in its manifest, as a
// label change through the API server) and returns once its node's agent
// has its endpoint with those labels and the identity they make.
func (c *Cluster) SetPodLabels(ctx context.Context, ref string, labels map[string]string) (Pod, error) {
	if err := checkLabels(labels); err != nil {
		return Pod{}, err
	}
	var pod Pod
	err := c.update(func(s *state) error {
		p, err := s.pod(ref)
		if err != nil {
			return err
		}
		n, err := s.node(p.Node)
		if err != nil {
			return err
		}
		p.Labels = maps.Clone(labels)
		if err := s.writeManifest(podManifest(*p), podObject(*p)); err != nil {
			return err
		}
		pod = *p
		if err := waitEndpoint(ctx, *n, *p); err != nil {
			return fmt.Errorf("pod %s: %w", ref, err)
		}
		c.log.Info("Set pod labels", "pod", ref, "labels", labels)
		return nil
	})
	return pod, err
}

func (c *Cluster) makePod(ctx context.Context, s *state, n Node, p *Pod) error {
	if err := netnsrun.Create(p.NetNS); err != nil {
		return err
	}
	if err := s.writeManifest(podManifest(*p), podObject(*p)); err != nil {
		return err
	}
	cni, list, err := cniConfig(s, n)
	if err != nil {
		return err
	}
	res, err := cni.AddNetworkList(ctx, list, runtimeConf(*p))
	if err != nil {
		return fmt.Errorf("CNI ADD: %w", err)
	}
	p.Added = time.Now()
	r, err := current.NewResultFromResult(res)
	if err != nil {
		return fmt.Errorf("CNI ADD result: %w", err)
	}
	for _, ip := range r.IPs {
		addr, _ := netip.AddrFromSlice(ip.Address.IP)
		if addr.Unmap().Is4() {
			p.IPv4 = addr.Unmap()
		} else {
			p.IPv6 = addr
		}
	}
	if err := s.save(); err != nil {
		return err
	}
	if err := waitEndpoint(ctx, n, *p); err != nil {
		return err
	}
	c.log.Info("Added pod", "pod", p.Ref(), "node", n.Name, "ipv4", p.IPv4, "ipv6", p.IPv6)
	return nil
}

// waitEndpoint waits until n's agent has p's endpoint with p's labels and
// a settled identity: from then on the pod's traffic carries them.
func waitEndpoint(ctx context.Context, n Node, p Pod) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cl := client.New(n.APISocket)
	var last string
	for {
		ep, err := cl.Endpoint(ctx, client.ContainerEndpointID(p.ContainerID))
		switch {
		case err != nil:
			last = err.Error()
		case !maps.Equal(ep.Labels, p.Labels) && !(len(ep.Labels) == 0 && len(p.Labels) == 0):
			last = fmt.Sprintf("the endpoint has labels %v, not yet the pod's", ep.Labels)
		case ep.IdentityPending:
			last = "the endpoint's identity is pending"
		default:
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the agent of %s has no ready endpoint for the pod after 30s: %s", n.Name, last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func cniConfig(s *state, n Node) (*libcni.CNIConfig, *libcni.NetworkConfigList, error) {
	path := filepath.Join(n.CNIConfDir(), conflistName)
	list, err := libcni.ConfListFromFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("the CNI configuration of node %s's agent: %w", n.Name, err)
	}
	cni := libcni.NewCNIConfigWithCacheDir([]string{filepath.Dir(s.CNIBinary)}, filepath.Join(s.Dir, "cni-cache"), nil)
	return cni, list, nil
}

func runtimeConf(p Pod) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{
		ContainerID: p.ContainerID, NetNS: p.NetNS, IfName: "eth0",
		Args: [][2]string{{"K8S_POD_NAMESPACE", p.Namespace}, {"K8S_POD_NAME", p.Name}},
	}
}

// removePod is the CNI DEL of p, unless skipDel, then the removal of its
// manifest and namespace. A DEL that fails stops it: the agent would keep
// the pod's endpoint and addresses.
func removePod(s *state, p Pod, skipDel bool) error {
	n, err := s.node(p.Node)
	if err != nil {
		return err
	}
	if !skipDel && netnsrun.Exists(n.NetNS) {
		cni, list, err := cniConfig(s, *n)
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			err = cni.DelNetworkList(ctx, list, runtimeConf(p))
			cancel()
		}
		if err != nil {
			return fmt.Errorf("pod %s: CNI DEL on %s: %w", p.Ref(), n.Name, err)
		}
	}
	if err := s.removeManifest(podManifest(p)); err != nil {
		return fmt.Errorf("pod %s: %w", p.Ref(), err)
	}
	return netnsrun.Remove(p.NetNS)
}

// DeletePod deletes pod ref (NAME or NAMESPACE/NAME): the CNI DEL (its
// node's agent must run), its manifest and its network namespace.
func (c *Cluster) DeletePod(ctx context.Context, ref string) error {
	return c.update(func(s *state) error {
		p, err := s.pod(ref)
		if err != nil {
			return err
		}
		if err := removePod(s, *p, false); err != nil {
			return err
		}
		gone := p.Ref()
		s.Pods = slices.DeleteFunc(s.Pods, func(q Pod) bool { return q.Ref() == gone })
		c.log.Info("Deleted pod", "pod", ref)
		return nil
	})
}

// Start starts cmd in pod's network namespace and its node's cgroup, as a
// container's process runs: the node agent's socket load balancing applies
// to its sockets. Wait for it with cmd.Wait. cmd must not set Pdeathsig:
// the thread that forks it ends at once.
func (c *Cluster) Start(pod string, cmd *exec.Cmd) error {
	p, err := c.Pod(pod)
	if err != nil {
		return err
	}
	n, err := c.Node(p.Node)
	if err != nil {
		return err
	}
	attr := &syscall.SysProcAttr{}
	if cmd.SysProcAttr != nil {
		if cmd.SysProcAttr.Pdeathsig != 0 {
			return fmt.Errorf("start %s in pod %s: Pdeathsig would kill it at once (its forking thread exits)", cmd.Path, pod)
		}
		a := *cmd.SysProcAttr
		attr = &a
	}
	cg, err := unix.Open(n.Cgroup, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("start %s in pod %s: open node %s's cgroup: %w", cmd.Path, pod, n.Name, err)
	}
	defer unix.Close(cg)
	// Placed in the cgroup by clone3 itself: no moment in which its
	// sockets escape the node's programs.
	attr.UseCgroupFD, attr.CgroupFD = true, cg
	cmd.SysProcAttr = attr
	_, err = netnsrun.In(p.NetNS, func() (struct{}, error) { return struct{}{}, cmd.Start() })
	if err != nil {
		return fmt.Errorf("start %s in pod %s: %w", cmd.Path, pod, err)
	}
	return nil
}

// Exec runs argv in pod (see Start) and returns its standard output; an
// error carries its standard error.
func (c *Cluster) Exec(ctx context.Context, pod string, argv ...string) ([]byte, error) {
	if len(argv) == 0 {
		return nil, errors.New("exec: no command")
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := c.Start(pod, cmd); err != nil {
		return nil, err
	}
	if err := cmd.Wait(); err != nil {
		return stdout.Bytes(), fmt.Errorf("%s in pod %s: %w: %s", strings.Join(argv, " "), pod, err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}
