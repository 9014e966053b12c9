package hubble

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/cilium/cilium/api/v1/flow"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/spf13/pflag"

	"github.com/cellium/cellium/cells/api"
	"github.com/cellium/cellium/cells/daemon"
	"github.com/cellium/cellium/cells/monitor"
	"github.com/cellium/cellium/pkg/monitorapi"
)

// Cell turns the monitor's events into flows and serves them with the
// Hubble Observer API: see the package documentation.
var Cell = cell.Module(
	"hubble",
	"Flows from monitor events served with the Hubble Observer API",

	cell.Config(DefaultConfig),
	cell.ProvidePrivate(job.Registry.NewGroup),
	cell.Provide(newHubble),
	cell.Invoke(requireHubble),
)

// requireHubble pulls the server into the graph: nothing needs to depend
// on it for it to serve.
func requireHubble(*Hubble) {}

// Config is the hubble cell's configuration.
type Config struct {
	HubbleEnabled bool
	// HubbleBufferSize is the number of flows the ring keeps.
	HubbleBufferSize int
	// HubbleEventQueueSize is how many events the monitor may queue for
	// the cell before it loses them; 0 means HubbleBufferSize.
	HubbleEventQueueSize int
	// HubbleListenAddress is where the gRPC server listens: see
	// ListenAddress.
	HubbleListenAddress string
}

// DefaultConfig is the hubble cell's default configuration. The client
// command `agent observe` takes --hubble-listen-address with the same
// default.
var DefaultConfig = Config{
	HubbleEnabled:        true,
	HubbleBufferSize:     4095,
	HubbleEventQueueSize: 0,
	HubbleListenAddress:  "",
}

// maxBufferSize bounds --hubble-buffer-size: a flow takes about a
// kilobyte, so this is a gigabyte of flows; more is a typo.
const maxBufferSize = 1 << 20

func (def Config) Flags(flags *pflag.FlagSet) {
	flags.Bool("hubble-enabled", def.HubbleEnabled, "Serve flows with the Hubble Observer API (gRPC)")
	flags.Int("hubble-buffer-size", def.HubbleBufferSize,
		fmt.Sprintf("Flows the Hubble ring keeps for GetFlows (exactly this many, 1 to %d)", maxBufferSize))
	flags.Int("hubble-event-queue-size", def.HubbleEventQueueSize,
		"Monitor events queued for conversion to flows before Hubble loses them (0: --hubble-buffer-size)")
	flags.String("hubble-listen-address", def.HubbleListenAddress,
		"Where the Hubble server listens: empty for hubble.sock in --run-dir, unix:///path/to.sock, or host:port such as :4244 (TCP, no TLS)")
}

func (cfg Config) validate() error {
	if cfg.HubbleBufferSize < 1 || cfg.HubbleBufferSize > maxBufferSize {
		return fmt.Errorf("invalid --hubble-buffer-size %d: want 1 to %d flows", cfg.HubbleBufferSize, maxBufferSize)
	}
	if cfg.HubbleEventQueueSize < 0 || cfg.HubbleEventQueueSize > maxBufferSize {
		return fmt.Errorf("invalid --hubble-event-queue-size %d: want 1 to %d events, or 0 for --hubble-buffer-size", cfg.HubbleEventQueueSize, maxBufferSize)
	}
	return nil
}

// Hubble is the hubble cell: the observer and its gRPC server.
type Hubble struct {
	cfg      Config
	log      *slog.Logger
	health   cell.Health
	addr     Address
	monitor  *monitor.Monitor
	db       *statedb.DB
	convert  *converter
	observer *Observer
	server   *grpcServer

	// sub and lostAtStart are taken in the start hook, before the job
	// that reads them runs: what is published or lost from the end of
	// the start on is this cell's.
	sub         *monitor.Subscription
	lostAtStart uint64
}

type params struct {
	cell.In

	Config    Config
	Log       *slog.Logger
	Lifecycle cell.Lifecycle
	Jobs      job.Group
	Health    cell.Health
	Paths     daemon.Paths
	Node      daemon.NodeName
	Monitor   *monitor.Monitor
	DB        *statedb.DB
	Tables    Tables
}

func newHubble(p params) (*Hubble, error) {
	if err := p.Config.validate(); err != nil {
		return nil, err
	}
	addr, err := ListenAddress(p.Config.HubbleListenAddress, p.Paths.RunDir)
	if err != nil {
		return nil, err
	}
	h := &Hubble{cfg: p.Config, log: p.Log, health: p.Health, addr: addr}
	if !p.Config.HubbleEnabled {
		p.Lifecycle.Append(cell.Hook{OnStart: func(cell.HookContext) error {
			h.health.OK("Disabled (--hubble-enabled=false)")
			return nil
		}})
		return h, nil
	}
	h.monitor, h.db = p.Monitor, p.DB
	h.convert = newConverter(string(p.Node), p.Tables)
	h.observer = NewObserver(p.Config.HubbleBufferSize, string(p.Node), time.Now)
	h.server = newGRPCServer(h.observer)
	// This constructor takes daemon.Paths and the Monitor: the run
	// directory exists and the monitor reads by the time these run. The
	// job is added after the hook, so it starts after it.
	p.Lifecycle.Append(cell.Hook{OnStart: h.start, OnStop: h.stop})
	p.Jobs.Add(job.OneShot("observe-events", h.observeEvents))
	return h, nil
}

// Address is where the server listens (or would, when disabled).
func (h *Hubble) Address() Address { return h.addr }

func (h *Hubble) start(cell.HookContext) error {
	var (
		ln  net.Listener
		err error
	)
	if h.addr.Network == "unix" {
		ln, err = api.ListenUnix("hubble-listen-address", h.addr.Addr)
	} else {
		ln, err = net.Listen("tcp", h.addr.Addr)
		if err != nil {
			err = fmt.Errorf("--hubble-listen-address %s: %w", h.addr.Addr, err)
		}
	}
	if err != nil {
		return err
	}
	h.log.Info("Serving Hubble", "addr", h.addr.String(), "buffer", h.cfg.HubbleBufferSize)
	h.server.serve(ln, func(err error) {
		h.log.Error("Hubble server failed", "addr", h.addr.String(), "error", err)
		h.health.Degraded("Hubble server failed", err)
	})
	h.health.OK("Serving on " + h.addr.String())

	queue := h.cfg.HubbleEventQueueSize
	if queue == 0 {
		queue = h.cfg.HubbleBufferSize
	}
	h.sub = h.monitor.Subscribe("hubble", queue)
	// Only what the datapath loses from now on is news to Hubble's
	// clients: the counter lives as long as the pinned ring buffer.
	h.lostAtStart = h.monitor.Lost()
	return nil
}

func (h *Hubble) stop(ctx cell.HookContext) error {
	h.sub.Close()
	// Closing the listener unlinks a unix socket.
	h.server.stop(ctx)
	h.health.Stopped("Stopped")
	return nil
}

// Batching and loss checks of the event loop.
const (
	// maxBatch is how many queued events share one snapshot of the
	// tables.
	maxBatch = 256
	// lostCheck is how often the loop reads the datapath's lost counter,
	// a BPF map lookup.
	lostCheck = time.Second
)

// observeEvents turns the monitor's events into flows until the agent
// stops, and records the events lost on the way: those the datapath could
// not write into its ring buffer, and those this subscriber fell too far
// behind to receive.
func (h *Hubble) observeEvents(ctx context.Context, health cell.Health) error {
	sub := h.sub
	datapathLost, queueLost := h.lostAtStart, uint64(0)
	health.OK("Observing monitor events")

	ticker := time.NewTicker(lostCheck)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
			if n := h.monitor.Lost(); n > datapathLost {
				h.observer.AddLost(flow.LostEventSource_PERF_EVENT_RING_BUFFER, n-datapathLost)
				datapathLost = n
			}
		case ev, ok := <-sub.Events():
			if !ok {
				// The monitor stopped.
				return nil
			}
			txn := h.db.ReadTxn()
			h.handle(txn, ev)
		batch:
			for range maxBatch - 1 {
				select {
				case ev, ok := <-sub.Events():
					if !ok {
						return nil
					}
					h.handle(txn, ev)
				default:
					break batch
				}
			}
			if n := sub.Lost(); n > queueLost {
				h.observer.AddLost(flow.LostEventSource_OBSERVER_EVENTS_QUEUE, n-queueLost)
				queueLost = n
			}
		}
	}
}

// handle adds ev to the observer: a flow, or an agent event.
func (h *Hubble) handle(txn statedb.ReadTxn, ev monitorapi.Event) {
	if ae, ok := ev.(*monitorapi.AgentEvent); ok {
		h.observer.AddAgentEvent(agentEventOf(ae), ae.Time)
		return
	}
	if f := h.convert.flowOf(txn, ev); f != nil {
		h.observer.AddFlow(f)
	}
}
