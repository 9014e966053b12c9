package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/netip"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cilium/cilium/api/v1/flow"
	"github.com/cilium/cilium/api/v1/observer"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cellium/cellium/cells/hubble"
	"github.com/cellium/cellium/pkg/cliout"
	"github.com/cellium/cellium/pkg/identity"
)

// defaultLast is how many flows `agent observe` shows when asked for
// neither a number, a time window nor to follow, as `hubble observe` does.
const defaultLast = 20

// observeOpts are the flags of `agent observe`.
type observeOpts struct {
	out           cliout.Output
	timeout       time.Duration
	follow, all   bool
	last, first   uint64
	since, until  string
	filters       flowFilterFlags
	deny          []string
	serverFlagSet *pflag.FlagSet
}

// flowFilterFlags are the filter flags; each takes a list.
type flowFilterFlags struct {
	ip, fromIP, toIP               []string
	pod, fromPod, toPod            []string
	namespace, fromNamespace, toNS []string
	verdict, protocol              []string
	port, fromPort, toPort         []string
	identity, fromID, toID         []string
	label, fromLabel, toLabel      []string
}

// filterFlag is one filter flag: its name, help and the list it fills.
type filterFlag struct {
	name, help string
	values     func(*flowFilterFlags) *[]string
}

var filterFlags = []filterFlag{
	{"ip", "Flows from or to an address or CIDR", func(f *flowFilterFlags) *[]string { return &f.ip }},
	{"from-ip", "Flows from an address or CIDR", func(f *flowFilterFlags) *[]string { return &f.fromIP }},
	{"to-ip", "Flows to an address or CIDR", func(f *flowFilterFlags) *[]string { return &f.toIP }},
	{"pod", "Flows from or to a pod, [namespace/]name-prefix (namespace default if none)", func(f *flowFilterFlags) *[]string { return &f.pod }},
	{"from-pod", "Flows from a pod, [namespace/]name-prefix", func(f *flowFilterFlags) *[]string { return &f.fromPod }},
	{"to-pod", "Flows to a pod, [namespace/]name-prefix", func(f *flowFilterFlags) *[]string { return &f.toPod }},
	{"namespace", "Flows from or to pods of a namespace", func(f *flowFilterFlags) *[]string { return &f.namespace }},
	{"from-namespace", "Flows from pods of a namespace", func(f *flowFilterFlags) *[]string { return &f.fromNamespace }},
	{"to-namespace", "Flows to pods of a namespace", func(f *flowFilterFlags) *[]string { return &f.toNS }},
	{"verdict", "Flows with a verdict: FORWARDED, DROPPED, TRANSLATED", func(f *flowFilterFlags) *[]string { return &f.verdict }},
	{"protocol", "Flows of a protocol: tcp, udp, sctp, icmp, icmpv4, icmpv6", func(f *flowFilterFlags) *[]string { return &f.protocol }},
	{"port", "Flows from or to a port", func(f *flowFilterFlags) *[]string { return &f.port }},
	{"from-port", "Flows from a port", func(f *flowFilterFlags) *[]string { return &f.fromPort }},
	{"to-port", "Flows to a port", func(f *flowFilterFlags) *[]string { return &f.toPort }},
	{"identity", "Flows from or to a security identity: a number or a reserved name (host, world, ...)", func(f *flowFilterFlags) *[]string { return &f.identity }},
	{"from-identity", "Flows from a security identity", func(f *flowFilterFlags) *[]string { return &f.fromID }},
	{"to-identity", "Flows to a security identity", func(f *flowFilterFlags) *[]string { return &f.toID }},
	{"label", "Flows from or to endpoints whose labels match a selector, e.g. app=web,k8s:tier!=db (terms ANDed)", func(f *flowFilterFlags) *[]string { return &f.label }},
	{"from-label", "Flows from endpoints whose labels match a selector", func(f *flowFilterFlags) *[]string { return &f.fromLabel }},
	{"to-label", "Flows to endpoints whose labels match a selector", func(f *flowFilterFlags) *[]string { return &f.toLabel }},
}

func filterFlagNames() []string {
	names := make([]string, len(filterFlags))
	for i, f := range filterFlags {
		names[i] = f.name
	}
	return names
}

// newObserveCmd is `agent observe`. It finds the Hubble server from the
// agent's own --run-dir and --hubble-listen-address, taken from
// agentFlags, so that AGENT_* variables and --config-dir apply as they do
// to `agent run`.
func newObserveCmd(stdout io.Writer, agentFlags *pflag.FlagSet) *cobra.Command {
	cmd, _ := newObserveCmdOpts(stdout, agentFlags)
	return cmd
}

// newObserveCmdOpts is newObserveCmd with the options its flags fill.
func newObserveCmdOpts(stdout io.Writer, agentFlags *pflag.FlagSet) (*cobra.Command, *observeOpts) {
	o := &observeOpts{}
	cmd := &cobra.Command{
		Use:   "observe",
		Short: "Show the flows of the running agent's Hubble server",
		Long: "Show flows from the running agent's Hubble server (the Hubble Observer API over\n" +
			"gRPC): the last 20 by default, or --last N, --first N, --all, a --since/--until\n" +
			"window, and with --follow the new ones as they come. Filters of one kind match any\n" +
			"of their values; filters of different kinds must all match. --ip, --pod, --namespace\n" +
			"and --port match either side of a flow. --not KEY=VALUE hides the flows a filter\n" +
			"flag KEY=VALUE would show (e.g. --not namespace=kube-system). -o json prints one\n" +
			"GetFlowsResponse per line in protobuf's JSON form, as `hubble observe -o jsonpb`.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd, stdout)
		},
	}
	f := cmd.Flags()
	f.BoolVarP(&o.follow, "follow", "f", false, "Keep showing new flows until interrupted")
	f.Uint64Var(&o.last, "last", 0, fmt.Sprintf("Show the last N flows held (default %d when no other selection is given)", defaultLast))
	f.Uint64Var(&o.first, "first", 0, "Show the first N flows held")
	f.BoolVar(&o.all, "all", false, "Show every flow held")
	f.StringVar(&o.since, "since", "", "Only flows since a time: RFC 3339 (2026-01-02T15:04:05Z) or a duration ago (5m)")
	f.StringVar(&o.until, "until", "", "Only flows until a time: RFC 3339 or a duration ago")
	f.DurationVar(&o.timeout, "timeout", 30*time.Second, "How long to wait for the server's answer (not with --follow)")
	for _, ff := range filterFlags {
		f.StringSliceVar(ff.values(&o.filters), ff.name, nil, ff.help)
	}
	f.StringArrayVar(&o.deny, "not", nil, "Hide the flows a filter would show: KEY=VALUE with KEY one of "+strings.Join(filterFlagNames(), ", "))
	for _, name := range []string{"run-dir", "hubble-listen-address"} {
		f.AddFlag(agentFlags.Lookup(name))
	}
	o.serverFlagSet = f
	o.out.Register(cmd)
	return cmd, o
}

// address is where the agent serves Hubble, from the agent's flags.
func (o *observeOpts) address() (hubble.Address, error) {
	runDir, _ := o.serverFlagSet.GetString("run-dir")
	listen, _ := o.serverFlagSet.GetString("hubble-listen-address")
	if !filepath.IsAbs(runDir) {
		return hubble.Address{}, fmt.Errorf("invalid --run-dir %q: must be an absolute path", runDir)
	}
	return hubble.ListenAddress(listen, runDir)
}

func (o *observeOpts) run(cmd *cobra.Command, stdout io.Writer) error {
	req, err := o.request(time.Now())
	if err != nil {
		return err
	}
	addr, err := o.address()
	if err != nil {
		return err
	}
	conn, err := hubble.Dial(addr)
	if err != nil {
		return fmt.Errorf("hubble server at %s: %w", addr, err)
	}
	defer conn.Close()

	ctx, cancel := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	if !o.follow {
		var cancelTimeout context.CancelFunc
		ctx, cancelTimeout = context.WithTimeout(ctx, o.timeout)
		defer cancelTimeout()
	}
	stream, err := observer.NewObserverClient(conn).GetFlows(ctx, req)
	if err != nil {
		return serverError(addr, err)
	}
	p := &flowPrinter{w: stdout, json: o.out.Format() == "json"}
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return p.flush()
		}
		if err != nil {
			if o.follow && ctx.Err() != nil {
				// Interrupted: how a follow ends.
				return p.flush()
			}
			return serverError(addr, err)
		}
		if err := p.print(resp); err != nil {
			return err
		}
	}
}

// serverError says which server failed and how.
func serverError(addr hubble.Address, err error) error {
	st := status.Convert(err)
	switch st.Code() {
	case codes.Unavailable:
		return fmt.Errorf("cannot reach the Hubble server at %s: is the agent running with --hubble-enabled, and are --run-dir and --hubble-listen-address those of the agent? (%s)", addr, st.Message())
	case codes.DeadlineExceeded:
		return fmt.Errorf("no answer from the Hubble server at %s within --timeout", addr)
	}
	return fmt.Errorf("hubble server at %s: %s", addr, st.Message())
}

// request is the GetFlows request the flags ask for; now anchors relative
// times.
func (o *observeOpts) request(now time.Time) (*observer.GetFlowsRequest, error) {
	req := &observer.GetFlowsRequest{Follow: o.follow}
	selections := 0
	for _, set := range []bool{o.last > 0, o.first > 0, o.all} {
		if set {
			selections++
		}
	}
	switch {
	case selections > 1:
		return nil, errors.New("--last, --first and --all exclude each other")
	case o.first > 0 && o.follow:
		return nil, errors.New("--first and --follow exclude each other: --first shows the oldest flows held, --follow new ones")
	case o.last > 0:
		req.Number = o.last
	case o.first > 0:
		req.Number, req.First = o.first, true
	case o.all:
		req.Number = math.MaxUint64
	case !o.follow && o.since == "" && o.until == "":
		req.Number = defaultLast
	}
	var err error
	if req.Since, err = parseFlowTime("since", o.since, now); err != nil {
		return nil, err
	}
	if req.Until, err = parseFlowTime("until", o.until, now); err != nil {
		return nil, err
	}
	if req.Whitelist, err = o.filters.build(); err != nil {
		return nil, err
	}
	for _, kv := range o.deny {
		var deny flowFilterFlags
		key, value, found := strings.Cut(kv, "=")
		i := slices.IndexFunc(filterFlags, func(f filterFlag) bool { return f.name == key })
		if !found || i < 0 || value == "" {
			return nil, fmt.Errorf("invalid --not %q: want KEY=VALUE with KEY one of %s", kv, strings.Join(filterFlagNames(), ", "))
		}
		*filterFlags[i].values(&deny) = []string{value}
		ff, err := deny.build()
		if err != nil {
			return nil, fmt.Errorf("--not %s: %w", kv, err)
		}
		req.Blacklist = append(req.Blacklist, ff...)
	}
	return req, nil
}

// parseFlowTime reads --since or --until: RFC 3339, or a duration before
// now.
func parseFlowTime(flag, s string, now time.Time) (*timestamppb.Timestamp, error) {
	if s == "" {
		return nil, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return timestamppb.New(now.Add(-d)), nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return timestamppb.New(t), nil
	}
	return nil, fmt.Errorf("invalid --%s %q: want a time such as 2026-01-02T15:04:05Z or a duration ago such as 5m", flag, s)
}

// build turns the filter flags into the request's filters. Flags that
// match either side of a flow (--ip, --pod, --namespace, --port) make two
// filters, one where the value is the source and one where it is the
// destination; the others go into both.
func (f *flowFilterFlags) build() ([]*flow.FlowFilter, error) {
	if err := f.validate(); err != nil {
		return nil, err
	}
	src, dst := &flow.FlowFilter{}, &flow.FlowFilter{}
	for _, ff := range []*flow.FlowFilter{src, dst} {
		ff.Verdict = verdicts(f.verdict)
		ff.Protocol = f.protocol
	}
	either := func(asSource bool, both, from, to []string) (srcValues, dstValues []string) {
		if asSource {
			return concat(both, from), slices.Clone(to)
		}
		return slices.Clone(from), concat(both, to)
	}
	for i, ff := range []*flow.FlowFilter{src, dst} {
		asSource := i == 0
		ff.SourceIp, ff.DestinationIp = either(asSource, f.ip, f.fromIP, f.toIP)
		ff.SourcePort, ff.DestinationPort = either(asSource, f.port, f.fromPort, f.toPort)
		srcPods, dstPods := either(asSource, f.pod, f.fromPod, f.toPod)
		srcNS, dstNS := either(asSource, f.namespace, f.fromNamespace, f.toNS)
		ff.SourcePod, ff.DestinationPod = inNamespaces(srcPods, srcNS), inNamespaces(dstPods, dstNS)
		srcIDs, dstIDs := either(asSource, f.identity, f.fromID, f.toID)
		ff.SourceIdentity, ff.DestinationIdentity = identities(srcIDs), identities(dstIDs)
		ff.SourceLabel, ff.DestinationLabel = either(asSource, f.label, f.fromLabel, f.toLabel)
	}
	switch {
	case proto.Equal(src, &flow.FlowFilter{}):
		return nil, nil
	case proto.Equal(src, dst):
		return []*flow.FlowFilter{src}, nil
	}
	return []*flow.FlowFilter{src, dst}, nil
}

func (f *flowFilterFlags) validate() error {
	type flagValues struct {
		flag   string
		values []string
	}
	checks := []struct {
		flags []flagValues
		ok    func(string) bool
		want  string
	}{
		{[]flagValues{{"ip", f.ip}, {"from-ip", f.fromIP}, {"to-ip", f.toIP}}, func(v string) bool {
			_, errPrefix := netip.ParsePrefix(v)
			_, errAddr := netip.ParseAddr(v)
			return errPrefix == nil || errAddr == nil
		}, "an address such as 10.244.0.5 or a CIDR such as 10.244.0.0/16"},
		{[]flagValues{{"port", f.port}, {"from-port", f.fromPort}, {"to-port", f.toPort}}, func(v string) bool {
			_, err := strconv.ParseUint(v, 10, 16)
			return err == nil
		}, "a port number 0-65535"},
		{[]flagValues{{"verdict", f.verdict}}, func(v string) bool {
			_, ok := flow.Verdict_value[strings.ToUpper(v)]
			return ok && !strings.EqualFold(v, flow.Verdict_VERDICT_UNKNOWN.String())
		}, "FORWARDED, DROPPED or TRANSLATED"},
		{[]flagValues{{"protocol", f.protocol}}, func(v string) bool {
			return slices.Contains([]string{"tcp", "udp", "sctp", "icmp", "icmpv4", "icmpv6"}, strings.ToLower(v))
		}, "tcp, udp, sctp, icmp, icmpv4 or icmpv6"},
		{[]flagValues{{"namespace", f.namespace}, {"from-namespace", f.fromNamespace}, {"to-namespace", f.toNS}}, func(v string) bool {
			return v != "" && !strings.Contains(v, "/")
		}, "a namespace name"},
		{[]flagValues{{"identity", f.identity}, {"from-identity", f.fromID}, {"to-identity", f.toID}}, func(v string) bool {
			_, err := identity.Parse(v)
			return err == nil
		}, "a security identity number or a reserved name (host, world, unmanaged, health, init, remote-node, kube-apiserver)"},
	}
	for _, c := range checks {
		for _, fv := range c.flags {
			for _, v := range fv.values {
				if !c.ok(v) {
					return fmt.Errorf("invalid --%s %q: want %s", fv.flag, v, c.want)
				}
			}
		}
	}
	return nil
}

// identities are the numbers of validated --identity values.
func identities(values []string) []uint32 {
	var out []uint32
	for _, v := range values {
		n, _ := identity.Parse(v)
		out = append(out, uint32(n))
	}
	return out
}

func verdicts(names []string) []flow.Verdict {
	var vs []flow.Verdict
	for _, n := range names {
		vs = append(vs, flow.Verdict(flow.Verdict_value[strings.ToUpper(n)]))
	}
	return vs
}

// inNamespaces is the pod filter values for pods (name prefixes, maybe
// with a namespace) in namespaces: every pod of the namespaces when no pod
// is given, the pods without a namespace in each of them otherwise.
func inNamespaces(pods, namespaces []string) []string {
	if len(namespaces) == 0 {
		return pods
	}
	if len(pods) == 0 {
		var all []string
		for _, ns := range namespaces {
			all = append(all, ns+"/")
		}
		return all
	}
	var out []string
	for _, p := range pods {
		if strings.Contains(p, "/") {
			out = append(out, p)
			continue
		}
		for _, ns := range namespaces {
			out = append(out, ns+"/"+p)
		}
	}
	return out
}

func concat(a, b []string) []string {
	if len(a)+len(b) == 0 {
		return nil
	}
	return append(slices.Clone(a), b...)
}

// flowPrinter writes flows as table lines or JSON lines, one per
// response, as they arrive.
type flowPrinter struct {
	w         io.Writer
	json      bool
	headerOut bool
}

// flowRow is the table's line format: wide enough for pod names and
// addresses with ports; longer ones push the rest of the line along.
const flowRow = "%-19s  %-32s  %-32s  %-10s  %-14s  %s\n"

func (p *flowPrinter) print(resp *observer.GetFlowsResponse) error {
	if p.json {
		b, err := protojson.Marshal(resp)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(p.w, "%s\n", b)
		return err
	}
	if err := p.header(); err != nil {
		return err
	}
	when := resp.GetTime().AsTime().Local().Format(time.StampMilli)
	if l := resp.GetLostEvents(); l != nil {
		_, err := fmt.Fprintf(p.w, "%-19s  EVENTS LOST: %d (%s)\n", when, l.GetNumEventsLost(), l.GetSource())
		return err
	}
	f := resp.GetFlow()
	if f == nil {
		return nil
	}
	srcPort, dstPort, _ := hubble.Ports(f)
	summary := f.GetSummary()
	if f.GetVerdict() == flow.Verdict_DROPPED && f.GetDropReasonDesc() != flow.DropReason_DROP_REASON_UNKNOWN {
		summary += "; drop reason " + f.GetDropReasonDesc().String()
	}
	_, err := fmt.Fprintf(p.w, flowRow, when,
		endpointName(f.GetSource(), f.GetIP().GetSource(), srcPort, f.GetSourceService()),
		endpointName(f.GetDestination(), f.GetIP().GetDestination(), dstPort, f.GetDestinationService()),
		f.GetVerdict(), flowType(f), summary)
	return err
}

// flush prints the header of an empty table, so that an empty answer
// still reads as one.
func (p *flowPrinter) flush() error {
	if p.json {
		return nil
	}
	return p.header()
}

// header prints the table's header, once.
func (p *flowPrinter) header() error {
	if p.headerOut {
		return nil
	}
	p.headerOut = true
	_, err := fmt.Fprintf(p.w, flowRow, "TIME", "SOURCE", "DESTINATION", "VERDICT", "TYPE", "SUMMARY")
	return err
}

// endpointName is a side of a flow as the table shows it: the pod, or the
// address, with the port, and the service if there is one.
func endpointName(ep *flow.Endpoint, ip string, port uint32, svc *flow.Service) string {
	name := ip
	if ep.GetPodName() != "" {
		name = ep.GetNamespace() + "/" + ep.GetPodName()
	}
	if name != "" && port != 0 {
		if strings.Contains(name, ":") {
			name = "[" + name + "]"
		}
		name += ":" + strconv.FormatUint(uint64(port), 10)
	}
	if svc != nil {
		name = strings.TrimSpace(name + " (service " + svc.GetNamespace() + "/" + svc.GetName() + ")")
	}
	if name == "" {
		return "-"
	}
	return name
}

// flowType names where a flow was seen, as Hubble does: "to-endpoint",
// "drop", "post-xlate-fwd".
func flowType(f *flow.Flow) string {
	switch {
	case f.GetVerdict() == flow.Verdict_DROPPED:
		return "drop"
	case f.GetType() == flow.FlowType_SOCK:
		switch f.GetSockXlatePoint() {
		case flow.SocketTranslationPoint_SOCK_XLATE_POINT_PRE_DIRECTION_FWD:
			return "pre-xlate-fwd"
		case flow.SocketTranslationPoint_SOCK_XLATE_POINT_POST_DIRECTION_FWD:
			return "post-xlate-fwd"
		case flow.SocketTranslationPoint_SOCK_XLATE_POINT_PRE_DIRECTION_REV:
			return "pre-xlate-rev"
		case flow.SocketTranslationPoint_SOCK_XLATE_POINT_POST_DIRECTION_REV:
			return "post-xlate-rev"
		}
		return "sock"
	case f.GetTraceObservationPoint() != flow.TraceObservationPoint_UNKNOWN_POINT:
		return strings.ReplaceAll(strings.ToLower(f.GetTraceObservationPoint().String()), "_", "-")
	}
	return "unknown"
}
