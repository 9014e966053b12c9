// Command cellium-cni is Cellium's CNI plugin (CNI specification 1.0 and
// 1.1). The container runtime runs it from its CNI bin directory
// (/opt/cni/bin/cellium-cni) with the network configuration that the agent
// writes once it is ready, 05-cellium.conflist:
//
//	{"cniVersion":"1.0.0","cniVersions":["1.0.0","1.1.0"],"name":"cellium","plugins":[{"type":"cellium-cni","socket":"/var/run/cellium/agent.sock"}]}
//
// A runtime whose CNI library knows "cniVersions" (CNI 1.1) hands the plugin
// 1.1.0, with STATUS and GC; an older one (containerd 1.7) 1.0.0. The plugin
// answers in the version it is handed.
//
// The plugin makes nothing itself: each command is a call to the agent's
// API on "socket" (default /var/run/cellium/agent.sock).
//
//	ADD     PUT /v1/endpoints/container-id:<CNI_CONTAINERID>: the agent
//	        allocates the addresses, makes the veth pair, addresses and
//	        routes, writes the endpoint down and answers; the plugin prints
//	        the CNI result (interfaces, addresses, gateway, default route).
//	DEL     DELETE of the same with ?interface=<CNI_IFNAME>: the agent deletes
//	        the endpoint only if it is that attachment's (else 404, done);
//	        idempotent; an unknown container, a repeated
//	        DEL or a missing netns are not errors. With the agent down it
//	        succeeds too: the agent removes endpoints whose netns is gone
//	        when it restores.
//	CHECK   the agent compares the endpoint's interfaces, addresses and routes
//	        with what it made, and the plugin compares the addresses with
//	        prevResult.
//	STATUS  whether the agent answers and is ready.
//	GC      deletes the endpoints of attachments that the runtime no longer
//	        lists in cni.dev/valid-attachments (container ID and
//	        interface): what a lost DEL left behind. Only endpoints made
//	        through the CNI API are candidates (not the node's health
//	        endpoint); a failed deletion does not stop the others, and the
//	        failures are reported together.
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
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

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

// attachmentPath is the API path that deletes the attachment (containerID,
// ifName): the container's endpoint only if its interface is ifName.
func attachmentPath(containerID, ifName string) string {
	return endpointPath(containerID) + "?" + url.Values{apiv1.QueryInterface: {ifName}}.Encode()
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
	pluginMain(handlers{Add: cmdAdd, Del: cmdDel, Check: cmdCheck, Status: cmdStatus, GC: cmdGC},
		"CNI plugin cellium-cni "+version.Get().Version)
}

// parseConf parses the network configuration; a prevResult's addresses
// are returned too.
func parseConf(stdin []byte) (*netConf, []netip.Prefix, error) {
	conf := &netConf{Socket: DefaultSocket}
	if err := json.Unmarshal(stdin, conf); err != nil {
		return nil, nil, newError(errDecodingFailure, "invalid network configuration on stdin", err.Error())
	}
	if conf.Type == "" {
		return nil, nil, newError(errInvalidNetworkConfig, `invalid network configuration: "type" missing, want cellium-cni`, "")
	}
	if conf.Type != "cellium-cni" {
		return nil, nil, newError(errInvalidNetworkConfig,
			fmt.Sprintf("invalid network configuration: type %q, want cellium-cni", conf.Type), "")
	}
	if !filepath.IsAbs(conf.Socket) {
		return nil, nil, newError(errInvalidNetworkConfig,
			fmt.Sprintf("invalid network configuration: socket %q must be an absolute path, e.g. %s", conf.Socket, DefaultSocket), "")
	}
	if len(conf.PrevResult) == 0 || string(conf.PrevResult) == "null" {
		return conf, nil, nil
	}
	prev, err := parsePrevResult(conf.PrevResult, conf.CNIVersion)
	if err != nil {
		return nil, nil, newError(errDecodingFailure, "invalid prevResult", err.Error())
	}
	return conf, prev, nil
}

// parseArgs parses CNI_ARGS.
func parseArgs(cniArgs string) (k8sArgs, error) {
	k8s, err := loadArgs(cniArgs)
	if err != nil {
		return k8sArgs{}, newError(errInvalidEnvironmentVariables, "invalid CNI_ARGS", err.Error())
	}
	return k8s, nil
}

// requestTimeout bounds a request to the agent. It waits out an agent that
// is restoring endpoints (requests wait for the restore), and stays under
// the runtime's own timeout for a CNI call (containerd allows minutes).
const requestTimeout = 2 * time.Minute

func cmdAdd(args *cmdArgs) error {
	conf, _, err := parseConf(args.StdinData)
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
		PodNamespace: k8s.K8S_POD_NAMESPACE, PodName: k8s.K8S_POD_NAME, PodUID: k8s.K8S_POD_UID,
	}, &ep)
	if err != nil {
		return cniError("add endpoint", conf.Socket, err)
	}
	result, err := resultOf(ep, conf.CNIVersion)
	if err != nil {
		return newError(errInternal, "the agent's answer is not a usable endpoint", err.Error())
	}
	if err := printJSON(os.Stdout, result); err != nil {
		return newError(errIOFailure, "print the result", err.Error())
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
func resultOf(ep apiv1.Endpoint, cniVersion string) (*result, error) {
	r := &result{
		CNIVersion: cniVersion,
		Interfaces: []resultIface{
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
		any := netip.IPv4Unspecified()
		if ip.Is6() {
			any = netip.IPv6Unspecified()
		}
		r.IPs = append(r.IPs, resultIPConf{
			Interface: 1,
			Address:   netip.PrefixFrom(ip, ip.BitLen()).String(),
			Gateway:   gw.String(),
		})
		r.Routes = append(r.Routes, resultRoute{Dst: netip.PrefixFrom(any, 0).String(), GW: gw.String()})
	}
	if len(r.IPs) == 0 {
		return nil, errors.New("no address")
	}
	return r, nil
}

func cmdDel(args *cmdArgs) error {
	conf, _, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	// The attachment: a DEL of another interface of the container (one
	// the agent never made) leaves its endpoint alone, answered 404.
	err = unixhttp.Do(ctx, conf.Socket, "DELETE", attachmentPath(args.ContainerID, args.IfName), nil, nil)
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

func cmdCheck(args *cmdArgs) error {
	conf, prev, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	if prev == nil && (len(conf.PrevResult) == 0 || string(conf.PrevResult) == "null") {
		return newError(errInvalidNetworkConfig, "CHECK needs prevResult in the network configuration", "")
	}
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	var check apiv1.EndpointCheck
	err = unixhttp.Do(ctx, conf.Socket, "GET", endpointPath(args.ContainerID)+"/check", nil, &check)
	if apiErr, ok := errors.AsType[*unixhttp.APIError](err); ok && apiErr.Status == statusNotFound {
		return newError(errUnknownContainer, fmt.Sprintf("the agent has no endpoint for container %s", args.ContainerID), apiErr.Message)
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
	for _, p := range prev {
		want = append(want, p.Addr().String())
	}
	have := slices.DeleteFunc([]string{ep.IPv4, ep.IPv6}, func(s string) bool { return s == "" })
	slices.Sort(want)
	slices.Sort(have)
	if !slices.Equal(want, have) {
		problems = append(problems, fmt.Sprintf("prevResult has addresses %v, the endpoint %v", want, have))
	}
	if len(problems) > 0 {
		return newError(errCheckFailed, fmt.Sprintf("endpoint of container %s is not as made", args.ContainerID), strings.Join(problems, "; "))
	}
	return nil
}

func cmdStatus(args *cmdArgs) error {
	conf, _, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var hz apiv1.Healthz
	if err := unixhttp.Do(ctx, conf.Socket, "GET", apiv1.PathHealthz, nil, &hz); err != nil {
		return newError(errPluginNotAvailable, "cellium agent unreachable", err.Error())
	}
	if !hz.Ready {
		return newError(errPluginNotAvailable, "cellium agent not ready",
			"waiting for "+strings.Join(hz.Pending, ", "))
	}
	return nil
}

// cmdGC deletes every endpoint whose attachment the runtime does not
// list as valid. The agent releases their addresses and removes their
// veths, as for a DEL. It lists only the endpoints made through the CNI
// API (not the node's health endpoint, which no runtime attached), and
// skips health endpoints besides. A failed deletion does not stop the
// others: the errors are reported together at the end, and a GC the
// runtime repeats retries them.
func cmdGC(args *cmdArgs) error {
	conf, _, err := parseConf(args.StdinData)
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
	list := apiv1.PathEndpoints + "?" + url.Values{apiv1.QueryCNI: {"true"}}.Encode()
	if err := unixhttp.Do(ctx, conf.Socket, "GET", list, nil, &eps); err != nil {
		return cniError("list endpoints", conf.Socket, err)
	}
	var failed []*pluginError
	for _, ep := range eps {
		if ep.ContainerID == "" || ep.Health || valid[attachment{ep.ContainerID, ep.Interface}] {
			continue
		}
		err := unixhttp.Do(ctx, conf.Socket, "DELETE", attachmentPath(ep.ContainerID, ep.Interface), nil, nil)
		if apiErr, ok := errors.AsType[*unixhttp.APIError](err); ok && apiErr.Status == statusNotFound {
			continue // a DEL was quicker
		}
		if err != nil {
			perr := cniError("delete the endpoint of stale container "+ep.ContainerID, conf.Socket, err).(*pluginError)
			failed = append(failed, perr)
			fmt.Fprintf(os.Stderr, "cellium-cni: GC: %v\n", perr)
			continue
		}
		fmt.Fprintf(os.Stderr, "cellium-cni: GC deleted endpoint %d of container %s\n", ep.ID, ep.ContainerID)
	}
	return gcError(failed)
}

// gcError is the error of a GC whose deletions failed: the first one's
// code, and every failure in the details.
func gcError(failed []*pluginError) error {
	if len(failed) == 0 {
		return nil
	}
	msgs := make([]string, len(failed))
	for i, e := range failed {
		msgs[i] = e.Error()
	}
	return newError(failed[0].Code, fmt.Sprintf("GC: %d stale endpoint(s) could not be deleted", len(failed)), strings.Join(msgs, "; "))
}

// cniError turns an error talking to the agent into a CNI error.
func cniError(what, socket string, err error) error {
	if _, ok := errors.AsType[*unixhttp.UnreachableError](err); ok {
		return newError(errTryAgainLater, "cellium agent unreachable at "+socket+": try again later", err.Error())
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return newError(errTryAgainLater, "cellium agent did not answer in time: try again later", err.Error())
	}
	apiErr, ok := errors.AsType[*unixhttp.APIError](err)
	if !ok {
		return newError(errInternal, what+": "+err.Error(), "")
	}
	switch apiErr.Status {
	case statusServiceUnavailable:
		return newError(errTryAgainLater, what+": "+apiErr.Message, "")
	case statusBadRequest:
		return newError(errInvalidEnvironmentVariables, what+": "+apiErr.Message, "")
	default:
		return newError(errAgentRefused, what+": "+apiErr.Message, "")
	}
}
