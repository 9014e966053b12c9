package clusterhealth

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/nodes"
	"github.com/cellium/cellium/pkg/icmpprobe"
)

// maxInFlight bounds the probes of a round running at once.
const maxInFlight = 64

// prober probes every node each round: ICMP and HTTP to its address, HTTP
// to its health endpoint. A round's probes are spread over the interval,
// each bounded by its share of it, so a round never takes longer than its
// interval whatever fails; the results replace the table's rows in one
// transaction, and nodes that left lose theirs.
type prober struct {
	log   *slog.Logger
	db    *statedb.DB
	tbl   statedb.RWTable[*NodeHealth]
	nodes statedb.Table[*nodes.Node]
	port  uint16
	base  time.Duration

	mu     sync.Mutex
	pinger *icmpprobe.Pinger // while run runs
}

func (p *prober) run(ctx context.Context, health cell.Health) error {
	pinger, err := icmpprobe.New()
	if err != nil {
		health.Degraded("ICMP probes", err)
		return fmt.Errorf("ICMP probes: %w", err)
	}
	p.mu.Lock()
	p.pinger = pinger
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.pinger = nil
		p.mu.Unlock()
		pinger.Close()
	}()
	var lastSummary string
	for {
		start := time.Now()
		rows, every := p.roundNow(ctx, pinger)
		if ctx.Err() != nil {
			return nil
		}
		summary := Summary(rows)
		if summary != lastSummary {
			p.log.Info(summary, "interval", every)
			lastSummary = summary
		}
		reportHealth(health, rows)
		select {
		case <-time.After(time.Until(start.Add(every))):
		case <-ctx.Done():
			return nil
		}
	}
}

// reportHealth is Degraded when this node reaches no other node.
func reportHealth(health cell.Health, rows []*NodeHealth) {
	others, reached := 0, 0
	var why []string
	for _, r := range rows {
		if r.Local {
			continue
		}
		others++
		if r.Reachable() {
			reached++
		} else {
			why = append(why, r.Node+": "+strings.Join(r.Failed(), "; "))
		}
	}
	if others > 0 && reached == 0 {
		health.Degraded(Summary(rows), fmt.Errorf("no other node is reachable: %s", strings.Join(why, ", ")))
		return
	}
	health.OK(Summary(rows))
}

// roundNow probes every node of the table now, and writes the results.
func (p *prober) roundNow(ctx context.Context, pinger *icmpprobe.Pinger) ([]*NodeHealth, time.Duration) {
	var targets []*nodes.Node
	for n := range p.nodes.All(p.db.ReadTxn()) {
		targets = append(targets, n)
	}
	every := interval(p.base, len(targets))
	rows := p.round(ctx, pinger, targets, every)
	if ctx.Err() == nil {
		p.write(rows)
	}
	return rows, every
}

// ProbeNow runs a round at once, beside the regular ones: `agent health
// status --probe`.
func (p *prober) ProbeNow(ctx context.Context) error {
	p.mu.Lock()
	pinger := p.pinger
	p.mu.Unlock()
	if pinger == nil {
		return fmt.Errorf("node health probes are not running (--cluster-health-port=0, or the agent is starting)")
	}
	p.roundNow(ctx, pinger)
	return ctx.Err()
}

// round probes every target within every.
func (p *prober) round(ctx context.Context, pinger *icmpprobe.Pinger, targets []*nodes.Node, every time.Duration) []*NodeHealth {
	ctx, cancel := context.WithTimeout(ctx, every)
	defer cancel()
	// Each probe may take its share of the interval, two seconds at most.
	timeout := min(2*time.Second, every/2)
	spacing := every / time.Duration(max(len(targets), 1)) / 2
	rows := make([]*NodeHealth, len(targets))
	slots := make(chan struct{}, maxInFlight)
	var wg sync.WaitGroup
	for i, n := range targets {
		if i > 0 {
			select {
			case <-time.After(spacing):
			case <-ctx.Done():
			}
		}
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			rows[i] = p.probeNode(ctx, pinger, n, timeout)
		})
	}
	wg.Wait()
	return rows
}

func (p *prober) probeNode(ctx context.Context, pinger *icmpprobe.Pinger, n *nodes.Node, timeout time.Duration) *NodeHealth {
	r := &NodeHealth{Node: n.Name, Local: n.Local, LastProbe: time.Now()}
	host := n.PrimaryIP()
	var endpoint netip.Addr
	if len(n.HealthIPs) > 0 {
		endpoint = n.HealthIPs[0]
		for _, ip := range n.HealthIPs {
			if ip.Is4() == host.Is4() {
				endpoint = ip
				break
			}
		}
	}
	var wg sync.WaitGroup
	if host.IsValid() {
		wg.Go(func() {
			r.HostICMP = probe(ctx, host, timeout, func(ctx context.Context) error { _, err := pinger.Ping(ctx, host); return err })
		})
		wg.Go(func() { r.HostHTTP = probe(ctx, host, timeout, p.hello(host)) })
	}
	if endpoint.IsValid() {
		wg.Go(func() { r.EndpointHTTP = probe(ctx, endpoint, timeout, p.hello(endpoint)) })
	}
	wg.Wait()
	return r
}

// probe runs one probe of addr within timeout and times it.
func probe(ctx context.Context, addr netip.Addr, timeout time.Duration, do func(context.Context) error) Probe {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	err := do(ctx)
	r := Probe{Addr: addr, OK: err == nil, Latency: time.Since(start)}
	if err != nil {
		r.Latency, r.Error = 0, err.Error()
	}
	return r
}

// hello is an HTTP GET of /hello at addr, on a connection of its own.
func (p *prober) hello(addr netip.Addr) func(context.Context) error {
	return func(ctx context.Context) error {
		tr := &http.Transport{DisableKeepAlives: true, DialContext: (&net.Dialer{}).DialContext}
		defer tr.CloseIdleConnections()
		url := fmt.Sprintf("http://%s/hello", netip.AddrPortFrom(addr, p.port))
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("GET %s: no answer: %w", url, context.Cause(ctx))
			}
			return err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		return nil
	}
}

// write makes the table hold rows, and no row of a node that left.
func (p *prober) write(rows []*NodeHealth) {
	txn := p.db.WriteTxn(p.tbl)
	defer txn.Commit()
	keep := map[string]bool{}
	for _, r := range rows {
		keep[r.Node] = true
		p.tbl.Insert(txn, r)
	}
	for old := range p.tbl.All(txn) {
		if !keep[old.Node] {
			p.tbl.Delete(txn, old)
		}
	}
}

// sortedRows are the table's rows, local first, then by name.
func sortedRows(txn statedb.ReadTxn, tbl statedb.Table[*NodeHealth]) []*NodeHealth {
	var rows []*NodeHealth
	for r := range tbl.All(txn) {
		rows = append(rows, r)
	}
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].Local && !rows[j].Local })
	return rows
}
