// Command cellium-cni is Cellium's CNI plugin (CNI specification 1.0 and
// 1.1). The container runtime runs it from its CNI bin directory
// (/opt/cni/bin/cellium-cni) with the network configuration that the agent
// writes once it is ready, 05-cellium.conflist:
//
//	{"cniVersion":"1.1.0","name":"cellium","plugins":[{"type":"cellium-cni","socket":"/var/run/cellium/agent.sock"}]}
//
// The plugin makes nothing itself: each command is a call to the agent's
// API on "socket" (default /var/run/cellium/agent.sock).
//
//	ADD     PUT /v1/endpoints/container-id:<CNI_CONTAINERID>: the agent
//	        allocates the addresses, makes the veth pair, addresses and
//	        routes, writes the endpoint down and answers; the plugin prints
//	        the CNI result (interfaces, addresses, gateway, default route).
//	DEL     DELETE of the same: idempotent; an unknown container, a repeated
//	        DEL or a missing netns are not errors. With the agent down it
//	        succeeds too: the agent removes endpoints whose netns is gone
//	        when it restores.
//	CHECK   the agent compares the endpoint's interfaces, addresses and routes
//	        with what it made, and the plugin compares the addresses with
//	        prevResult.
//	STATUS  whether the agent answers and is ready.
//	GC      deletes the endpoints of attachments that the runtime no longer
//	        lists in cni.dev/valid-attachments (container ID and
//	        interface): what a lost DEL left behind.
//	VERSION the supported specification versions.
//
// Errors are CNI errors: with the agent unreachable, code 11 (try again
// later) naming the socket.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	cniversion "github.com/containernetworking/cni/pkg/version"

	"github.com/cellium/cellium/pkg/apiv1"
	"github.com/cellium/cellium/pkg/unixhttp"
	"github.com/cellium/cellium/pkg/version"
)

// DefaultSocket is the agent's API socket when the configuration names none.
const DefaultSocket = "/var/run/cellium/agent.sock"

// Error codes of the plugin, beyond the specification's well-known ones.
const (
	// errPluginNotAvailable is the specification's code for a STATUS
	// that cannot serve ADDs.
	errPluginNotAvailable = 50
	// errAgentRefused: the agent refused the request; the message says why.
	errAgentRefused = 100
	// errCheckFailed: CHECK found the endpoint differs from what was made.
	errCheckFailed = 101
)

// The agent's answers the plugin tells apart.
const (
	statusBadRequest         = 400
	statusNotFound           = 404
	statusServiceUnavailable = 503
)

// endpointPath is the API path of a container's endpoint.
func endpointPath(containerID string) string {
	return apiv1.EndpointPath(apiv1.ContainerIDPrefix + containerID)
}

// started is when main began: the process's start for a trace (TraceEnv).
var started time.Time

// TraceEnv, set to anything, has an ADD write the times of its phases on
// stderr after its result, as unix nanoseconds (the CNI benchmarks read
// them):
//
//	cellium-cni trace: main=... sent=... answered=... printed=...
//
// main is when main began (the runtime and the packages initialized),
// sent when the request to the agent was written, answered when the
// agent's answer arrived, printed when the result was written.
const TraceEnv = "CELLIUM_CNI_TRACE"

func main() {
	started = time.Now()
	skel.PluginMainFuncs(skel.CNIFuncs{Add: cmdAdd, Del: cmdDel, Check: cmdCheck, Status: cmdStatus, GC: cmdGC},
		cniversion.PluginSupports("1.0.0", "1.1.0"),
		"CNI plugin cellium-cni "+version.Get().Version)
}

// netConf is the plugin's network configuration.
type netConf struct {
	types.PluginConf
	// Socket is the agent's API socket.
	Socket string `json:"socket,omitempty"`
}

func parseConf(stdin []byte) (*netConf, error) {
	conf := &netConf{Socket: DefaultSocket}
	if err := json.Unmarshal(stdin, conf); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "invalid network configuration on stdin", err.Error())
	}
	if conf.Type == "" {
		return nil, types.NewError(types.ErrInvalidNetworkConfig, `invalid network configuration: "type" missing, want cellium-cni`, "")
	}
	if conf.Type != "cellium-cni" {
		return nil, types.NewError(types.ErrInvalidNetworkConfig,
			fmt.Sprintf("invalid network configuration: type %q, want cellium-cni", conf.Type), "")
	}
	if !filepath.IsAbs(conf.Socket) {
		return nil, types.NewError(types.ErrInvalidNetworkConfig,
			fmt.Sprintf("invalid network configuration: socket %q must be an absolute path, e.g. %s", conf.Socket, DefaultSocket), "")
	}
	if err := cniversion.ParsePrevResult(&conf.PluginConf); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "invalid prevResult", err.Error())
	}
	return conf, nil
}

// k8sArgs are the CNI_ARGS a kubelet passes; the field names are the keys.
type k8sArgs struct {
	types.CommonArgs
	K8S_POD_NAMESPACE types.UnmarshallableString
	K8S_POD_NAME      types.UnmarshallableString
}

// parseArgs parses CNI_ARGS.
func parseArgs(cniArgs string) (k8sArgs, error) {
	var k8s k8sArgs
	if err := types.LoadArgs(cniArgs, &k8s); err != nil {
		return k8sArgs{}, types.NewError(types.ErrInvalidEnvironmentVariables, "invalid CNI_ARGS", err.Error())
	}
	return k8s, nil
}

// requestTimeout bounds a request to the agent. It waits out an agent that
// is restoring endpoints (requests wait for the restore), and stays under
// the runtime's own timeout for a CNI call (containerd allows minutes).
const requestTimeout = 2 * time.Minute

func cmdAdd(args *skel.CmdArgs) error {
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	k8s, err := parseArgs(args.Args)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	var trace unixhttp.Trace
	ctx = unixhttp.WithTrace(ctx, &trace)
	var ep apiv1.Endpoint
	err = unixhttp.Do(ctx, conf.Socket, "PUT", endpointPath(args.ContainerID), apiv1.EndpointCreate{
		Netns: args.Netns, Interface: args.IfName,
		PodNamespace: string(k8s.K8S_POD_NAMESPACE), PodName: string(k8s.K8S_POD_NAME),
	}, &ep)
	if err != nil {
		return cniError("add endpoint", conf.Socket, err)
	}
	result, err := resultOf(ep, conf.CNIVersion)
	if err != nil {
		return types.NewError(types.ErrInternal, "the agent's answer is not a usable endpoint", err.Error())
	}
	if err := types.PrintResult(result, conf.CNIVersion); err != nil {
		return err
	}
	if os.Getenv(TraceEnv) != "" {
		fmt.Fprintf(os.Stderr, "cellium-cni trace: main=%d sent=%d answered=%d printed=%d\n",
			started.UnixNano(), trace.Sent.UnixNano(), trace.Answered.UnixNano(), time.Now().UnixNano())
	}
	return nil
}

// resultOf is the CNI result for an endpoint: the host and the container
// interface, an address per family through the container's, and a default
// route through each gateway.
func resultOf(ep apiv1.Endpoint, cniVersion string) (*current.Result, error) {
	r := &current.Result{
		CNIVersion: cniVersion,
		Interfaces: []*current.Interface{
			{Name: ep.HostInterface, Mac: ep.HostMAC},
			{Name: ep.Interface, Mac: ep.MAC, Sandbox: ep.Netns},
		},
	}
	for _, fam := range []struct{ ip, gw string }{{ep.IPv4, ep.IPv4Gateway}, {ep.IPv6, ep.IPv6Gateway}} {
		if fam.ip == "" {
			continue
		}
		ip, err := netip.ParseAddr(fam.ip)
		if err != nil {
			return nil, err
		}
		gw, err := netip.ParseAddr(fam.gw)
		if err != nil {
			return nil, fmt.Errorf("gateway of %s: %w", ip, err)
		}
		any := net.IPv4zero
		if ip.Is6() {
			any = net.IPv6zero
		}
		r.IPs = append(r.IPs, &current.IPConfig{
			Interface: current.Int(1),
			Address:   net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(ip.BitLen(), ip.BitLen())},
			Gateway:   gw.AsSlice(),
		})
		r.Routes = append(r.Routes, &types.Route{Dst: net.IPNet{IP: any, Mask: net.CIDRMask(0, ip.BitLen())}, GW: gw.AsSlice()})
	}
	if len(r.IPs) == 0 {
		return nil, errors.New("no address")
	}
	return r, nil
}

func cmdDel(args *skel.CmdArgs) error {
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	err = unixhttp.Do(ctx, conf.Socket, "DELETE", endpointPath(args.ContainerID), nil, nil)
	if apiErr, ok := errors.AsType[*unixhttp.APIError](err); ok && apiErr.Status == statusNotFound {
		return nil
	}
	if _, ok := errors.AsType[*unixhttp.UnreachableError](err); ok {
		// Failing would block the pod's removal for as long as the agent
		// is down; the agent's restore removes endpoints whose netns is
		// gone and releases their addresses.
		fmt.Fprintf(os.Stderr, "cellium-cni: DEL of %s: %v; the agent cleans up when it restores\n", args.ContainerID, err)
		return nil
	}
	if err != nil {
		return cniError("delete endpoint", conf.Socket, err)
	}
	return nil
}

func cmdCheck(args *skel.CmdArgs) error {
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	if conf.PrevResult == nil {
		return types.NewError(types.ErrInvalidNetworkConfig, "CHECK needs prevResult in the network configuration", "")
	}
	prev, err := current.NewResultFromResult(conf.PrevResult)
	if err != nil {
		return types.NewError(types.ErrDecodingFailure, "invalid prevResult", err.Error())
	}
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	var check apiv1.EndpointCheck
	err = unixhttp.Do(ctx, conf.Socket, "GET", endpointPath(args.ContainerID)+"/check", nil, &check)
	if apiErr, ok := errors.AsType[*unixhttp.APIError](err); ok && apiErr.Status == statusNotFound {
		return types.NewError(types.ErrUnknownContainer, fmt.Sprintf("the agent has no endpoint for container %s", args.ContainerID), apiErr.Message)
	}
	if err != nil {
		return cniError("check endpoint", conf.Socket, err)
	}
	problems := check.Problems
	ep := check.Endpoint
	if ep.Interface != args.IfName {
		problems = append(problems, fmt.Sprintf("the endpoint's interface is %s, not CNI_IFNAME %s", ep.Interface, args.IfName))
	}
	if ep.Netns != args.Netns {
		problems = append(problems, fmt.Sprintf("the endpoint's netns is %s, not CNI_NETNS %s", ep.Netns, args.Netns))
	}
	var want []string
	for _, ip := range prev.IPs {
		want = append(want, ip.Address.IP.String())
	}
	have := slices.DeleteFunc([]string{ep.IPv4, ep.IPv6}, func(s string) bool { return s == "" })
	slices.Sort(want)
	slices.Sort(have)
	if !slices.Equal(want, have) {
		problems = append(problems, fmt.Sprintf("prevResult has addresses %v, the endpoint %v", want, have))
	}
	if len(problems) > 0 {
		return types.NewError(errCheckFailed, fmt.Sprintf("endpoint of container %s is not as made", args.ContainerID), strings.Join(problems, "; "))
	}
	return nil
}

func cmdStatus(args *skel.CmdArgs) error {
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var hz apiv1.Healthz
	if err := unixhttp.Do(ctx, conf.Socket, "GET", apiv1.PathHealthz, nil, &hz); err != nil {
		return types.NewError(errPluginNotAvailable, "cellium agent unreachable", err.Error())
	}
	if !hz.Ready {
		return types.NewError(errPluginNotAvailable, "cellium agent not ready",
			"waiting for "+strings.Join(hz.Pending, ", "))
	}
	return nil
}

// cmdGC deletes every endpoint whose attachment the runtime does not
// list as valid. The agent releases their addresses and removes their
// veths, as for a DEL. It stops at the first failure, so that a GC the
// runtime repeats finishes the work.
func cmdGC(args *skel.CmdArgs) error {
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	type attachment struct{ containerID, ifName string }
	valid := map[attachment]bool{}
	for _, a := range conf.ValidAttachments {
		valid[attachment{a.ContainerID, a.IfName}] = true
	}
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	var eps []apiv1.Endpoint
	if err := unixhttp.Do(ctx, conf.Socket, "GET", apiv1.PathEndpoints, nil, &eps); err != nil {
		return cniError("list endpoints", conf.Socket, err)
	}
	for _, ep := range eps {
		if ep.ContainerID == "" || valid[attachment{ep.ContainerID, ep.Interface}] {
			continue
		}
		err := unixhttp.Do(ctx, conf.Socket, "DELETE", endpointPath(ep.ContainerID), nil, nil)
		if apiErr, ok := errors.AsType[*unixhttp.APIError](err); ok && apiErr.Status == statusNotFound {
			continue // a DEL was quicker
		}
		if err != nil {
			return cniError("delete the endpoint of stale container "+ep.ContainerID, conf.Socket, err)
		}
		fmt.Fprintf(os.Stderr, "cellium-cni: GC deleted endpoint %d of container %s\n", ep.ID, ep.ContainerID)
	}
	return nil
}

// cniError turns an error talking to the agent into a CNI error.
func cniError(what, socket string, err error) error {
	if _, ok := errors.AsType[*unixhttp.UnreachableError](err); ok {
		return types.NewError(types.ErrTryAgainLater, "cellium agent unreachable at "+socket+": try again later", err.Error())
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return types.NewError(types.ErrTryAgainLater, "cellium agent did not answer in time: try again later", err.Error())
	}
	apiErr, ok := errors.AsType[*unixhttp.APIError](err)
	if !ok {
		return types.NewError(types.ErrInternal, what+": "+err.Error(), "")
	}
	switch apiErr.Status {
	case statusServiceUnavailable:
		return types.NewError(types.ErrTryAgainLater, what+": "+apiErr.Message, "")
	case statusBadRequest:
		return types.NewError(types.ErrInvalidEnvironmentVariables, what+": "+apiErr.Message, "")
	default:
		return types.NewError(errAgentRefused, what+": "+apiErr.Message, "")
	}
}
